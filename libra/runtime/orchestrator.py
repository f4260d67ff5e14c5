"""The orchestrator: runs RL steps with rollout and training overlapped, every decision taken by Libra.

Step k, as carried out here (all engine calls on the orchestrator's thread, training on a background thread):

1. **boundary** (before rollout k): restart instances whose engine died (source `elastic`); profile the last
   `window_steps` steps, replan the rollout side on the virtual cluster, ask the gate (source `gate`); when it
   applies: new placement (`place`, fewest workers moved) -> `ElasticController.apply_plan` -> StopInstance /
   StartInstance carried out on the engines (source `planner`), the router rebuilt on the new buckets keeping its
   learned tree. The trainer keeps training meanwhile.
2. **rollout k** starts once the engines serve weights of version >= k - max_staleness; every request is routed by
   the router (migrations carried out, source `router`). Between engine polls the orchestrator collects finished
   training steps, pushes their weights and starts the next training step: rollout k overlaps training k-1.
3. **train k** (one optimizer step, version k -> k+1) on the batch of rollout k; its weights are pushed to every
   instance and the versions checked on both sides (engine-reported version, a parameter checksum).
4. **record k** (`run.jsonl`, `trace.jsonl`), checkpoint (trainer + optimizer, router, plan, placement, step).
"""

from __future__ import annotations

import logging
import pickle
import signal
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from libra.adapters.grpo import group_advantages, make_batch
from libra.adapters.types import Sampling
from libra.elastic import ElasticController, StartInstance, StopInstance
from libra.planning import ReplanGate
from libra.planning.placement import place
from libra.runtime import checkpoint, rollout, virtual
from libra.runtime.agent import AgentFactory, default_agent_factory
from libra.runtime.backend import make_backend, push_weights
from libra.runtime.clock import Clock
from libra.runtime.config import RunConfig, RunConfigError
from libra.runtime.records import TIMELINE_FILE, RunRecords, step_record
from libra.runtime.rollout import LiveRoutedRollout, TrajectoryRecord, routing_decision, run_rollout, worker_loads
from libra.runtime.signals import deferred_sigint, reinstall
from libra.runtime.trainer import TrainerHung, TrainerThread, TrainResult
from libra.runtime.watchdog import EngineWatch
from libra.scheduling import make_router

log = logging.getLogger("libra.runtime")


@attrs.frozen(kw_only=True)
class RunSummary:
    out_dir: str
    steps_completed: int
    first_step: int
    losses: tuple[float, ...]
    interrupted: bool = False


class Orchestrator:
    """`Orchestrator(config, out_dir).run()`; `resume=True` continues from the checkpoint in `out_dir`.
    `agent_factory(step, tokenizer)` builds the agent of each step (default: the toy tools). `on_step(record)`
    is called after each completed step; `on_poll(orchestrator)` between engine polls (fault injection).
    `backend`: live engines to adopt (a `VLLMRolloutBackend` of `config.model`, e.g. from `make_backend`, left
    idle by an earlier run): instances the placement names are kept, the others stopped, the missing ones started;
    `close()` leaves an adopted backend running (its owner shuts it down)."""

    def __init__(
        self,
        config: RunConfig,
        out_dir: str | Path,
        *,
        resume: bool = False,
        agent_factory: AgentFactory | None = None,
        on_step: Callable[[dict[str, Any]], Any] | None = None,
        on_poll: Callable[[Orchestrator], Any] | None = None,
        backend: Any = None,
        hybrid_kill_step: int | None = None,
    ) -> None:
        if not isinstance(config, RunConfig):
            raise RunConfigError(
                f"config must be a RunConfig (config_from_dict builds one from a mapping), got {type(config).__name__}"
            )
        if not isinstance(out_dir, str | Path) or not str(out_dir).strip():
            raise RunConfigError(f"out_dir must be a folder (a path), got {out_dir!r}")
        for name, fn in (("agent_factory", agent_factory), ("on_step", on_step), ("on_poll", on_poll)):
            if fn is not None and not callable(fn):  # called only once engines run, or after a step
                raise RunConfigError(f"{name} must be a callable or None, got {fn!r}")
        self.config = config
        self.out = Path(out_dir)
        self.resume = resume
        self.agent_factory = agent_factory or default_agent_factory(config.shift)
        self.on_step, self.on_poll = on_step, on_poll
        self.clock = Clock()
        self.backend: Any = None
        self._adopt = backend
        self.step = 0  # next step to train
        self.losses: list[float] = []
        self.rolling_step: int | None = None
        self.hybrids: Any = None  # HybridPool, when config.hybrid.workers > 0
        self.watch: Any = None  # EngineWatch
        self._hybrid_kill_step = hybrid_kill_step  # fault injection: the hybrid SIGKILLs itself mid-step
        self._writer = checkpoint.BackgroundWriter(self.out)
        self._closed = False
        self._set_up = False  # `_setup` completed

    # -- setup ----------------------------------------------------------------------------------------------------

    def _setup(self, target: int) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM

        from libra.adapters.tiny_model import build_tiny_model
        from libra.adapters.torch_ddp import TorchDDPTrainer

        cfg = self.config
        if not self.resume:
            checkpoint.refuse_overwrite(self.out)
        elif not self.out.is_dir():  # a mistyped folder would start a new run there
            raise RunConfigError(f"nothing to resume in {str(self.out)!r}: no such folder")
        state = checkpoint.load(self.out) if self.resume and checkpoint.exists(self.out) else None
        if self.resume and state is None:  # killed before the first checkpoint: start again from step 0
            log.info("no checkpoint in %s: the run starts again from step 0", self.out)
        if state is not None:
            checkpoint.check_same_run(state, cfg.to_dict(), self.out)
        if state is not None and int(state["next_step"]) >= target:  # before any engine starts
            done = int(state["next_step"])
            raise RunConfigError(
                f"the run in {str(self.out)!r} already completed {done} step(s) and {target} were asked: nothing to "
                f"do (libra run --resume {self.out} --steps N, N > {done}, continues it)"
            )
        # the records of the completed steps, checked against the checkpoint before anything is built
        self.records = RunRecords(
            self.out, resume=self.resume, keep_steps=int(state["next_step"]) if state is not None else 0
        )
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        model_dir = cfg.model or str(self.out / "model")
        if cfg.model is None and not (self.out / "model" / "config.json").is_file():
            build_tiny_model(model_dir, seed=cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prompt_ids = [list(self.tokenizer.encode(p)) for p in cfg.prompts]
        rollout.check_prompts_fit(cfg.prompts, self.prompt_ids, cfg.engine.max_model_len)  # before trainer, engines
        self.trainer = TorchDDPTrainer(
            model=LlamaForCausalLM.from_pretrained(model_dir),
            distributed=False,
            optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=cfg.lr),
        )
        self.cluster = virtual.virtual_cluster(cfg)
        self.planner = virtual.virtual_planner(cfg)
        self.gate = ReplanGate(
            to_rollout_s=cfg.replan.to_rollout_s, min_relative_gain=cfg.replan.min_relative_gain, nonblocking_join=True
        )
        self.pending: list[dict[str, Any]] = []  # decisions applied before the next rollout
        self.history: dict[int, list[TrajectoryRecord]] = {}
        self.trained: set[tuple[int, str]] = set()
        if state is None:
            t0 = time.perf_counter()
            self.plan = self.planner.plan(virtual.prior_profile(cfg, [len(p) for p in self.prompt_ids]))
            self.placement = place(self.plan, self.cluster)
            self._decide(
                "planner",
                "plan",
                step=0,
                why="first plan, from the prior profile",
                plan=virtual.plan_summary(self.plan, cfg),
                solve_s=time.perf_counter() - t0,
            )
            router = self._new_router(None)
        else:
            router = self._restore(state)
            self._decide(
                "elastic", "resume", step=self.step, why=f"resumed from the checkpoint after step {self.step - 1}"
            )
        self.controller = ElasticController(placement=self.placement)
        self._open_backend(model_dir)
        self.routed = self._live_routed(router)
        self._push(self.trainer.export_weights(bucket_bytes=1 << 20), step=self.step)
        self.watch = EngineWatch(
            self.backend, check_s=cfg.waits.engine_check_s, missed_checks=cfg.waits.engine_missed_checks
        )
        if cfg.hybrid.workers > 0:
            from libra.runtime.hybrid import HybridPool

            kill = self._hybrid_kill_step
            self.hybrids = HybridPool.for_run(cfg, self.trainer, model_dir, self.out, self.clock, kill)
        step_fn = self.hybrids.core_step if self.hybrids is not None else None
        self.train = TrainerThread(self.trainer, clock_t0=self.clock.t0, step_fn=step_fn)
        self._set_up = True

    def _restore(self, state: dict[str, Any]) -> Any:
        """The checkpoint's trainer, step, plan, placement, history and router (returned) in this run; one line,
        before any engine starts, when they do not fit it (another model, a router pickled by another version)."""
        with checkpoint.restoring(self.out):
            checkpoint.check_plan_and_placement(state)
            self.trainer.restore(state["trainer"])
            router = pickle.loads(state["router"])
            self.history, self.trained = dict(state["history"]), set(state["trained"])
            self.losses = [float(x) for x in state["losses"]]
        self.step = int(state["next_step"])
        self.plan, self.placement = state["plan"], state["placement"]
        return router

    def _open_backend(self, model_dir: str) -> None:
        """Start the placement's instances on a new backend, or reconcile an adopted one with the placement."""
        cfg = self.config
        specs = virtual.instance_specs(self.placement, cfg)
        if self._adopt is None:
            self.backend, self._owns_backend = make_backend(cfg, model_dir), True
        else:
            backend, self._adopt = self._adopt, None
            if str(getattr(backend, "model", model_dir)) != str(model_dir):
                raise RunConfigError(f"the adopted engines serve {backend.model!r}, the run trains {model_dir!r}")
            if backend.has_running():
                raise RunConfigError("the adopted engines still generate requests of an earlier run")
            self.backend, self._owns_backend = backend, False
            backend.forget_weights()  # this run pushes its own version 0 next
            for name in backend.instances():
                if name not in specs or backend.spec(name) != specs[name]:
                    self._stop_instance(name, step=self.step, source="planner", why="adopted, not in the placement")
        if hasattr(self.backend, "follow_placement"):  # Ray: actors go where the current placement puts them
            self.backend.follow_placement(lambda: self.placement)
        self._deaths_seen = len(self.backend.deaths)
        for name in sorted(set(specs) - set(self.backend.instances())):
            self._start_instance(specs[name], step=self.step, source="planner", why="initial placement")

    def _new_router(self, old: Any) -> Any:
        cfg = self.config
        buckets = virtual.real_buckets(self.plan, cfg)
        options: dict[str, Any] = {}
        if cfg.router == "cmlfq":
            options = (
                {"tree": old.tree}
                if old is not None and hasattr(old, "tree")
                else {"size_edges": cfg.router_size_edges}
            )
        try:
            return make_router(cfg.router, buckets, **options)
        except Exception as exc:
            raise RunConfigError(f"router {cfg.router!r}: {exc}") from None

    # -- decisions ------------------------------------------------------------------------------------------------

    def _decide(self, source: str, kind: str, *, step: int, why: str, **fields: Any) -> None:
        entry = {"source": source, "kind": kind, "step": step, "why": why, "t_s": round(self.clock.now(), 3), **fields}
        self.pending.append(entry)
        log.info(
            "step %d %s %s: %s %s",
            step,
            source,
            kind,
            why,
            " ".join(f"{k}={v}" for k, v in fields.items() if k in ("worker", "tp", "apply", "from_mix", "to_mix")),
        )

    def _start_instance(self, spec: Any, *, step: int, source: str, why: str) -> None:
        start = self.clock.now()
        handler = signal.getsignal(signal.SIGINT)
        # a Ctrl-C or SIGTERM inside vLLM's engine start left the start waiting for a handshake that never came (or
        # the half-started engine behind): it is held until the instance is up, then stops the run (close() stops it)
        with self.clock.span("switching"), deferred_sigint():
            self.backend.start_instance(spec)
        reinstall(handler)
        self.clock.mark(spec.name, "switching", start, self.clock.now(), step)
        self._decide(
            source,
            "StartInstance",
            step=step,
            why=why,
            worker=spec.name,
            tp=spec.tp,
            max_num_seqs=spec.max_num_seqs,
            seconds=round(self.clock.now() - start, 3),
            **({"where": self.backend.where(spec.name)} if hasattr(self.backend, "where") else {}),
        )

    def _stop_instance(self, name: str, *, step: int, source: str, why: str) -> None:
        start = self.clock.now()
        with self.clock.span("switching"):
            self.backend.stop_instance(name)
        self.clock.mark(name, "switching", start, self.clock.now(), step)
        self._decide(
            source, "StopInstance", step=step, why=why, worker=name, seconds=round(self.clock.now() - start, 3)
        )

    def _recover(self, k: int, why: str) -> None:
        """Record the engine deaths seen since the last call, restart the placement's instances that are gone."""
        self._note_deaths(k)
        specs = virtual.instance_specs(self.placement, self.config)
        for name in sorted(set(specs) - set(self.backend.instances())):
            self._start_instance(specs[name], step=k, source="elastic", why=why)

    def _note_deaths(self, k: int) -> None:
        """An `EngineDied` decision (source `elastic`) for each engine death not recorded yet."""
        for death in self.backend.deaths[self._deaths_seen :]:
            hung = self.watch.cause(death.instance) if self.watch is not None else None
            self._decide(
                "elastic",
                "EngineDied",
                step=k,
                why=(f"{hung}; {death.cause}" if hung else death.cause)[:300],
                worker=death.instance,
                requeued=len(death.requeued),
                failed=len(death.failed),
            )
        self._deaths_seen = len(self.backend.deaths)

    def _revive(self) -> None:
        """Mid-rollout, no instance left alive (the only engine died): restart them now, not at the next boundary."""
        k = self.rolling_step if self.rolling_step is not None else self.step
        self._recover(k, "every rollout instance died mid-rollout: restart them now")

    def _live_routed(self, router: Any) -> LiveRoutedRollout:
        return LiveRoutedRollout(
            backend=self.backend,
            router=router,
            bucket_instances=virtual.bucket_instances(self.plan, self.placement),
            revive=self._revive,
        )

    def _boundary(self, k: int) -> None:
        """Before rollout k: recover dead engines, then replan through the gate and carry the plan out."""
        cfg = self.config
        self._recover(k, "its engine died: restart it")
        window = [t for s in sorted(self.history)[-cfg.replan.window_steps :] for t in self.history[s]]
        if not (cfg.replan.enabled and window):
            return
        t0 = time.perf_counter()
        with self.clock.span("planning"):
            profile = virtual.scaled_profile([r.trajectory() for r in window], cfg, name=f"window@{k}")
            candidate, decision = virtual.replan_rollout(
                self.planner, self.plan, profile, self.gate, cfg.replan.horizon_steps
            )
        self._decide(
            "gate",
            "ReplanDecision",
            step=k,
            why=decision.reason,
            apply=decision.apply,
            current_s=decision.current_s,
            candidate_s=decision.candidate_s,
            saving_s=decision.saving_s,
            cost_s=decision.cost_s,
            from_mix=virtual.mix(self.plan),
            to_mix=virtual.mix(candidate),
            solve_s=round(time.perf_counter() - t0, 4),
        )
        if not decision.apply:
            return
        if self.hybrids is not None:  # the new placement takes the rollout pool as a whole: lent workers return
            self.hybrids.release_all(k, f"the planner's new placement reshapes the rollout pool: {decision.reason}")
        with self.clock.span("planning"):
            placement = place(candidate, self.cluster, current=self.placement)
            decisions = self.controller.apply_plan(placement, step=k, why=decision.reason)
        self._decide(
            "planner",
            "plan",
            step=k,
            why=decision.reason,
            plan=virtual.plan_summary(candidate, cfg),
            from_mix=virtual.mix(self.plan),
            to_mix=virtual.mix(candidate),
        )
        self.plan, self.placement = candidate, placement
        specs = virtual.instance_specs(placement, cfg)
        for d in decisions:  # stops first (free the resources), then starts: the controller's order
            if isinstance(d, StopInstance):
                if d.worker in self.backend.instances():
                    self._stop_instance(d.worker, step=k, source="planner", why=d.why)
            elif isinstance(d, StartInstance):
                self._start_instance(specs[d.worker], step=k, source="planner", why=d.why)
            else:
                raise RuntimeError(f"the rollout-only replan produced an unexpected decision {d!r}")
        self.routed = self._live_routed(self._new_router(self.routed.router))

    # -- weights --------------------------------------------------------------------------------------------------

    def _push(self, update: Any, *, step: int) -> dict[str, Any]:
        with self.clock.span("weights"):
            pushed = push_weights(self.backend, self.trainer, update, self.clock, step)
        self.served_version = update.version
        return pushed

    # -- the loop -------------------------------------------------------------------------------------------------

    def run(self, steps: int | None = None) -> RunSummary:
        target = self.config.steps if steps is None else steps
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:  # before any engine starts
            raise RunConfigError(f"steps must be a whole number >= 1, got {target!r}")
        if self._closed:  # its engines are stopped: a new setup would start the run over its own files
            raise RunConfigError(
                f"this Orchestrator of {str(self.out)!r} is closed: build a new one (resume=True continues the run)"
            )
        if self.backend is None:
            self._setup(target)
        elif not self._set_up:  # half its state is missing: going on would fail on the first attribute it lacks
            raise RunConfigError(
                f"the setup of this Orchestrator of {str(self.out)!r} failed part way: close() it and build a new one"
            )
        first = self.step
        self._target = target
        self.rollout_next = self.step
        self.ready: dict[int, tuple[dict[str, Any], dict[str, TrajectoryRecord], dict[str, Any]]] = {}
        self._last_record = self.clock.now()
        self.clock.take()
        while self.step < target:
            k = self.rollout_next
            if (
                k < target
                and self.served_version >= k - self.config.max_staleness
                and len(self.ready) <= self.config.max_staleness
            ):
                self._boundary(k)
                self._rollout(k)
                self._service()
            else:
                self._service(block=True)
        self._writer.wait()  # the last step's checkpoint is on disk (or its failure raised) before run() returns
        return RunSummary(out_dir=str(self.out), steps_completed=self.step, first_step=first, losses=tuple(self.losses))

    def _rollout(self, k: int) -> None:
        reinstall(signal.getsignal(signal.SIGINT))
        cfg = self.config
        agent = self.agent_factory(k, self.tokenizer)
        prompts = {
            f"s{k}-p{i}-{j}": (f"p{i}", j, ids)
            for i, ids in enumerate(self.prompt_ids)
            for j in range(cfg.samples_per_prompt)
        }

        def sampling(rid: str, turn: int) -> Sampling:
            seed = None if cfg.temperature == 0 else zlib.crc32(f"{cfg.seed}/{rid}/{turn}".encode())
            return Sampling(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed)

        first_migration, first_decision = len(self.routed.migrations), len(self.routed.decisions)
        self.rolling_step = k
        start = self.clock.now()
        records = run_rollout(
            self.routed,
            prompts,
            agent=agent,
            sampling=sampling,
            max_turns=cfg.max_turns,
            step=k,
            clock=self.clock,
            on_poll=self._poll_hook,
        )
        end = self.clock.now()
        self.rolling_step = None
        if k + 1 >= self._target:  # no boundary follows in this run to record its deaths: its own record does
            self._note_deaths(k)
        if self.hybrids is not None:
            self.hybrids.note_rollout(start, end)
        self.routed.router.end_step()
        self.history[k] = list(records.values())
        for old in [s for s in self.history if s < k - 8]:
            del self.history[old]
        workers = worker_loads(records)
        for name in workers:
            self.clock.mark(name, "rollout", start, end, k)
        routing = routing_decision(self.routed, k, cfg.router, first_migration, first_decision)
        info = {
            "rollout_window_s": [round(start, 4), round(end, 4)],
            "decisions": [*self.pending, routing],
            "plan": virtual.plan_summary(self.plan, cfg),
            "workers": workers,
            "retried": sum(r.attempts - 1 for r in records.values()),
            "requeued": sum(r.requeues for r in records.values()),
            "expected": len(prompts),
            "router_state": pickle.dumps(self.routed.router),
            "plan_state": (self.plan, self.placement),
        }
        self.pending = []
        order = sorted(records, key=lambda rid: (prompts[rid][0], prompts[rid][1]))
        batch = make_batch(
            [records[r].context for r in order],
            [records[r].mask for r in order],
            group_advantages([records[r].reward for r in order], cfg.samples_per_prompt),
            pad_id=self.tokenizer.pad_token_id,
        )
        self.ready[k] = (batch, records, info)
        self.rollout_next = k + 1

    def _poll_hook(self) -> None:
        if self.on_poll is not None:
            self.on_poll(self)
        self._service()

    def _service(self, *, block: bool = False) -> None:
        """Collect a finished training step (push its weights, record it), start the next one if its batch is
        ready. With `block`, wait for the running step."""
        waits = self.config.waits
        with self.clock.span("train_wait"):
            result = self.train.poll(timeout=waits.trainer_check_s if block else 0.0)
        if result is not None:
            self._complete(result)
        elif (hung := self.train.overdue(waits.trainer_check_s, waits.trainer_missed_checks)) is not None:
            raise TrainerHung(
                f"{hung}: the run stops; run.jsonl holds the {self.step} completed step(s); "
                f"continue with libra run --resume {self.out}"
            )
        if not self.train.busy and self.step in self.ready:
            batch = self.ready[self.step][0]
            if self.hybrids is not None:
                self.hybrids.decide(self.step)
                self.hybrids.before_train(self.step, batch)
            self.train.start(self.step, batch)

    def _complete(self, result: TrainResult) -> None:
        cfg = self.config
        k = result.step
        self.clock.mark("train-0", "train", result.start, result.end, k)
        for name in result.hybrids:
            self.clock.mark(name, "train", result.start, result.end, k)
        push = self._push(result.update, step=k) if result.version == self.trainer.version else {}
        batch, records, info = self.ready.pop(k)
        if self.hybrids is not None:
            self.hybrids.note_train(result.start, result.end)
            info["decisions"] = [*info["decisions"], *self.hybrids.take_events(k)]
            info["hybrids"] = list(result.hybrids)
        trajectories = [records[r].trajectory() for r in sorted(records)]
        dup = sum(1 for r in records if (k, r) in self.trained)
        self.trained.update((k, r) for r in records)
        now = self.clock.now()
        wall, self._last_record = now - self._last_record, now
        record = step_record(cfg, result, info, records, trajectories, dup, push, main=self.clock.take(), wall=wall)
        self.losses.append(result.loss)
        with deferred_sigint():  # the record and its checkpoint go together: Ctrl-C waits for both
            with self.clock.span("records"):
                self.records.add_step(record, trajectories)
            self.step = k + 1
            with self.clock.span("checkpoint"):
                self._checkpoint(info, result.state)
        log.info(
            "step %d done: loss %+.5f, %d trajectories, staleness %s, version %d",
            k,
            result.loss,
            len(records),
            record["staleness"],
            result.version,
        )
        if self.on_step is not None:
            self.on_step(record)

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def _checkpoint(self, info: dict[str, Any], trainer_state: Any) -> None:
        plan, placement = info["plan_state"]
        state = {
            "next_step": self.step,
            "trainer": trainer_state,
            "router": info["router_state"],
            "plan": plan,
            "placement": placement,
            "history": {s: h for s, h in self.history.items() if s < self.step},
            "trained": set(self.trained),
            "losses": list(self.losses),
            "config": self.config.to_dict(),
        }
        self._writer.save(state)

    def close(self) -> None:
        """Stop the engines and draw the timeline (safe to call twice, and after an interrupt). A Ctrl-C or SIGTERM
        while closing is held until the engines are stopped (every part of closing is bounded), then raised."""
        with deferred_sigint():
            self._close()

    def _close(self) -> None:
        self._closed = True
        try:
            try:
                self._writer.wait()
            except checkpoint.CheckpointError as exc:  # the run stopped before it could raise it: say so
                log.warning("%s", exc)
            if self.watch is not None:
                self.watch.close()
                self.watch = None
            if self.hybrids is not None:
                hybrids, self.hybrids = self.hybrids, None
                hybrids.close()
            if self.clock.spans:
                try:
                    from libra.runtime.timeline import draw_timeline

                    draw_timeline(
                        self.clock.spans,
                        self.out / TIMELINE_FILE,
                        title=f"libra run: max_staleness {self.config.max_staleness}",
                    )
                except Exception as exc:  # noqa: BLE001 - a missing plot must not hide the run's result
                    log.warning("timeline not drawn: %s", exc)
        finally:  # whatever failed above, the engines this run started are stopped
            backend, self.backend = self.backend, None
            if backend is not None and self._owns_backend:
                backend.shutdown()


__all__ = ["Orchestrator", "RunSummary"]
