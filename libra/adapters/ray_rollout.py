"""Ray rollout backend: every rollout instance is a Ray actor that holds one vLLM engine; the driver talks to the
actors through the same interface as `VLLMRolloutBackend` (the orchestrator cannot tell them apart).

- Actors are placed by `RayLauncher` (one bundle per worker of the placement, on the node its virtual GPUs name:
  custom resource `libra_node_<k>`); each actor's payload is an `EngineHost`, a one-instance `VLLMRolloutBackend`.
- The driver keeps every request's whole context (prompt, generated tokens, tool outputs), as the local backend
  does, so re-queueing the requests of a dead actor on another one is "submit the context there" (re-prefill).
- Requests to several actors run concurrently: `poll()` keeps one poll call in flight per busy actor and returns the
  events of those that answered (`ray.wait`); a late actor is polled again next time, never piled up. Calls to one
  actor run in the order they were sent (Ray runs one caller's calls to a synchronous actor in order), so a submit,
  abort or weight load sent after a poll runs after it.
- Weights: one `ray.put` per version (the object store carries it to every actor); each actor checks the version
  against its own (never older) and returns the version its engine reports, which the driver checks.
- Death: Ray confirms the actor exited (`RayActorError`), or the engine inside it died (the host says so), or an
  actor left `grace_s` seconds without answering a poll. A slow reply within the grace is not a death. The
  requests of a dead instance are re-queued on the least-loaded live instance (`REQUEUED` events) or fail.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from libra.adapters.errors import AdapterError, InstanceNotFound, RequestFailedError, UnsupportedConfig
from libra.adapters.ray_host import EngineHost, RayUnavailable, actor_env, check_address, connect
from libra.adapters.rollout_book import BookRequest, RequestBook
from libra.adapters.types import EventKind, InstanceSpec, Migration, StreamEvent, WeightUpdate
from libra.spec.placement import Placement, Pool, Role, WorkerPlacement


@attrs.define(eq=False)
class _Instance:
    spec: InstanceSpec
    actor: Any
    where: dict[str, Any]
    asleep: bool = False
    pending: Any = None  # the poll in flight
    sent_s: float = 0.0


class RayRolloutBackend(RequestBook):
    """`RolloutBackend` whose instances are Ray actors (see the module doc). `address`: "local" starts a local
    Ray (shut down by `shutdown()`), "auto" or "host:port" joins a cluster. `nodes` (local only): how many
    `libra_node_<k>` resources the local Ray advertises. `gpus_per_node` maps a worker's virtual GPUs to its node.
    `follow_placement(fn)`: `fn()` gives the current placement, where new instances' workers are looked up. The
    request bookkeeping is the shared `RequestBook`'s."""

    def __init__(
        self,
        *,
        model: str,
        dtype: str = "float32",
        seed: int = 0,
        address: str = "local",
        nodes: int = 1,
        gpus_per_node: int = 1,
        engine_options: dict[str, Any] | None = None,
        grace_s: float = 600.0,
        poll_wait_s: float = 0.05,
        start_timeout_s: float = 1800.0,
        failover: Callable[[str, tuple[str, ...], str], str | None] | None = None,
        host: Callable[..., Any] | None = None,
    ) -> None:
        from libra.adapters.ray_launcher import RayLauncher

        _check_options(nodes=nodes, grace_s=grace_s, poll_wait_s=poll_wait_s, start_timeout_s=start_timeout_s)
        self.model, self.dtype, self.seed, self.address = model, dtype, seed, address
        self.grace_s, self.poll_wait_s, self.start_timeout_s = grace_s, poll_wait_s, start_timeout_s
        super().__init__(failover)
        self._started_ray = connect(address, nodes=nodes)
        if host is None:  # the actor payload: `host(info)` (an `EngineHost` of the model)
            host = functools.partial(
                EngineHost, model=model, dtype=dtype, seed=seed, engine_options=dict(engine_options or {})
            )
        self.launcher = RayLauncher(placement=Placement(workers=()), gpus_per_node=gpus_per_node, setup_rollout=host)
        self._placement: Callable[[], Placement | None] = lambda: None
        self._backlog: list[StreamEvent] = []  # events of deaths seen outside poll(), returned by the next poll
        self._closed = False

    def follow_placement(self, current: Callable[[], Placement | None]) -> None:
        self._placement = current

    # -- instances ----------------------------------------------------------------------------------------------

    def start_instance(self, spec: InstanceSpec) -> None:
        import ray

        from libra.adapters.ray_launcher import PlacementUnavailable
        from libra.elastic.decisions import StartInstance

        if self._closed:
            raise AdapterError(f"cannot start instance {spec.name!r}: this RayRolloutBackend was shut down")
        if spec.name in self._instances:
            raise ValueError(f"instance {spec.name!r} is already running")
        worker = self._worker(spec)
        self.launcher.placement = Placement(workers=(worker,))
        try:
            self.launcher.execute(StartInstance(worker=spec.name, tp=spec.tp, gpu_ids=worker.gpu_ids, step=0, why=""))
        except PlacementUnavailable:
            node = worker.gpu_ids[0] // self.launcher.gpus_per_node
            raise RayUnavailable(
                f"no Ray node offers the resource libra_node_{node} that instance {spec.name!r} needs: start that "
                f"node with ray start --resources='{{\"libra_node_{node}\": 1}}'"
            ) from None
        actor = self.launcher.actors[spec.name]
        try:
            where = ray.get(actor.call.remote("start", spec), timeout=self.start_timeout_s)
        except BaseException:
            self._fence(spec.name)
            raise
        inst = _Instance(spec=spec, actor=actor, where=where)
        self._instances[spec.name] = inst
        if self._latest is not None:
            self._load({spec.name: inst}, self._latest)

    def _worker(self, spec: InstanceSpec) -> WorkerPlacement:
        placement = self._placement()
        worker = placement.by_name().get(spec.name) if placement is not None else None
        if worker is None:  # used on its own: a worker on node 0
            worker = WorkerPlacement(
                name=spec.name,
                role=Role.ROLLOUT_INSTANCE,
                tp=spec.tp,
                gpu_ids=tuple(range(spec.tp)),
                pool=Pool.CORE_ROLLOUT,
            )
        return worker

    def stop_instance(self, name: str, *, migrate_to: str | None = None) -> tuple[Migration, ...]:
        import ray

        moved = self._move_off(name, migrate_to)
        inst = self._instances[name]
        with contextlib.suppress(Exception):  # a clean engine shutdown first; the actor is killed anyway
            ray.get(inst.actor.call.remote("shutdown"), timeout=60)
        del self._instances[name]
        self._fence(name)
        return moved

    def where(self, name: str) -> dict[str, Any]:
        """Where the instance's actor runs: its pid, host name and engine-core pids."""
        return dict(self._get(name).where)

    # -- requests -----------------------------------------------------------------------------------------------

    def prompt_ids(self, prompt: Any) -> list[int]:
        import ray

        if not self._instances:
            raise InstanceNotFound("no instance is running; the tokenizer comes from a live engine")
        return ray.get(next(iter(self._instances.values())).actor.call.remote("prompt_ids", prompt))

    def has_running(self) -> bool:
        return super().has_running() or bool(self._backlog)

    def poll(self) -> list[StreamEvent]:
        import ray

        events, self._backlog = self._backlog, []
        for name, inst in self._instances.items():
            if inst.pending is None and not inst.asleep and self._running_on(name):
                inst.pending, inst.sent_s = inst.actor.call.remote("poll"), time.monotonic()
        waiting = {inst.pending: name for name, inst in self._instances.items() if inst.pending is not None}
        if not waiting:
            return events
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=self.poll_wait_s)
        if ready:  # and every other reply already there
            ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in ready:
            name = waiting[ref]
            self._instances[name].pending = None
            try:
                host_events, dead = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - RayActorError (the actor exited), or the host's own failure
                events.extend(self._on_death(name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
                continue
            events.extend(self._translate(name, host_events))
            if dead is not None:
                events.extend(self._on_death(name, dead))
        now = time.monotonic()
        for name, inst in list(self._instances.items()):
            if inst.pending is not None and now - inst.sent_s > self.grace_s:
                events.extend(self._on_death(name, f"no reply to a poll in {self.grace_s:g} s"))
        return events

    def _translate(self, name: str, host_events: list[StreamEvent]) -> list[StreamEvent]:
        by_engine_id = {r.engine_id: r for r in self._requests.values() if r.running and r.instance == name}
        out = []
        for ev in host_events:
            req = by_engine_id.get(ev.request_id)
            if req is None:
                continue  # a turn aborted (migrated, released) after this poll was sent
            if ev.kind == EventKind.FAILED:
                req.running, req.failed = False, ev.error or "failed on its instance"
                out.append(attrs.evolve(ev, request_id=req.request_id))
                continue
            req.context.extend(ev.new_token_ids)
            req.turn_tokens += len(ev.new_token_ids)
            if ev.kind == EventKind.FINISHED:
                req.running = False
            out.append(attrs.evolve(ev, request_id=req.request_id))
        return out

    # -- weights, sleep -----------------------------------------------------------------------------------------

    def load_weights(self, update: WeightUpdate, *, instances: Sequence[str] | None = None) -> int:
        if self._latest is None or update.version >= self._latest.version:
            self._latest = update
        names = instances if instances is not None else self.instances()
        self._load({n: self._get(n) for n in names}, update)
        return update.version

    def _load(self, targets: dict[str, _Instance], update: WeightUpdate) -> None:
        import ray

        ref = ray.put(update)  # once: every actor reads it from the object store
        calls = {name: inst.actor.call.remote("load", ref) for name, inst in targets.items()}
        for name, call in calls.items():
            try:
                served = ray.get(call, timeout=self.grace_s)
            except ray.exceptions.RayActorError as exc:
                self._backlog.extend(self._on_death(name, f"died loading weights: {type(exc).__name__}"))
                continue
            if served != update.version:
                raise RuntimeError(f"instance {name!r} serves version {served} after loading {update.version}")

    def forget_weights(self) -> None:
        """Forget the newest pushed weights here and in every actor (a new run starts again from version 0)."""
        import ray

        self._latest = None
        ray.get([inst.actor.call.remote("forget") for inst in self._instances.values()])

    def weight_version(self, name: str) -> int:
        import ray

        return int(ray.get(self._get(name).actor.call.remote("weight_version")))

    def param_checksum(self, name: str, param: str) -> float:
        import ray

        return float(ray.get(self._get(name).actor.call.remote("param_checksum", param)))

    def sleep(self, name: str) -> None:
        import ray

        inst = self._get(name)
        if inst.asleep:
            return
        if self._running_on(name):
            raise ValueError(f"instance {name!r} still generates requests; migrate them before it sleeps")
        ray.get(inst.actor.call.remote("sleep"))
        inst.asleep = True

    def wake(self, name: str) -> None:
        import ray

        inst = self._get(name)
        if not inst.asleep:
            return
        ray.get(inst.actor.call.remote("wake"))
        inst.asleep = False
        if self._latest is not None:
            self._load({name: inst}, self._latest)

    def engine_pids(self, name: str) -> tuple[int, ...]:
        """The engine-core processes inside the instance's actor (crash-injection tests, on the actor's machine)."""
        import ray

        return tuple(ray.get(self._get(name).actor.call.remote("engine_pids")))

    def actor_pid(self, name: str) -> int:
        return int(self._get(name).where["pid"])

    def shutdown(self) -> None:
        import ray

        self._closed = True
        with contextlib.suppress(Exception):  # each engine shuts down cleanly if it can (after a Ctrl-C: maybe not)
            calls = [inst.actor.call.remote("shutdown") for inst in self._instances.values()]
            ray.wait(calls, num_returns=len(calls), timeout=60)
        for inst in self._instances.values():  # a killed actor leaves its engine processes behind
            if inst.where.get("host") == socket.gethostname():
                _kill(inst.where.get("engine_pids", ()))
        self._instances.clear()
        with contextlib.suppress(Exception):
            self.launcher.shutdown()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    # -- internals ----------------------------------------------------------------------------------------------

    def _start_turn(self, req: BookRequest, max_tokens: int) -> None:
        inst = self._instances[req.instance]
        room = inst.spec.max_model_len - len(req.context)
        if room < 1:
            req.failed = f"context of {len(req.context)} tokens fills max_model_len {inst.spec.max_model_len}"
            raise RequestFailedError(req.request_id, req.failed)
        req.engine_id = f"{req.request_id}#{next(self._ids)}"
        sampling = attrs.evolve(req.sampling, max_tokens=min(max_tokens, room))
        inst.actor.call.remote("submit", req.engine_id, list(req.context), sampling)
        req.running = True

    def _abort(self, inst: _Instance, req: BookRequest) -> None:
        if req.running:
            inst.actor.call.remote("abort", req.engine_id)
        req.running = False

    def _fence(self, name: str) -> None:
        """Kill the actor (a dead or stopped instance must not run on as a zombie), and on this machine the
        engine-core processes it started (they would outlive a SIGKILLed actor)."""
        import ray

        actor = self.launcher.actors.pop(name, None)
        self.launcher.infos.pop(name, None)
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def _remove_dead(self, name: str) -> None:
        dead = self._instances.pop(name)
        self._fence(name)
        if dead.where.get("host") == socket.gethostname():
            _kill(dead.where.get("engine_pids", ()))


def _check_options(*, nodes: Any, grace_s: Any, poll_wait_s: Any, start_timeout_s: Any) -> None:
    """Before Ray starts: `grace_s` 0 would declare every instance dead at its first unanswered poll, `nodes` 0
    would advertise no `libra_node_<k>` (every start then waits out its timeout)."""

    def number(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)

    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise UnsupportedConfig(f"RayRolloutBackend nodes must be a whole number >= 1, got {nodes!r}")
    for name, value in (("grace_s", grace_s), ("start_timeout_s", start_timeout_s)):
        if not number(value) or value <= 0:
            raise UnsupportedConfig(f"RayRolloutBackend {name} must be a finite number of seconds > 0, got {value!r}")
    if not number(poll_wait_s) or poll_wait_s < 0:
        raise UnsupportedConfig(f"RayRolloutBackend poll_wait_s must be a finite number >= 0, got {poll_wait_s!r}")


def _kill(pids: Sequence[int]) -> None:
    """SIGKILL the engine processes an actor started (on this machine), if still there: only a process that is
    still a vLLM engine (its title), never another that reused the pid."""
    import signal

    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"VLLM"):
                    continue
            os.kill(pid, signal.SIGKILL)


__all__ = ["EngineHost", "RayRolloutBackend", "RayUnavailable", "actor_env", "check_address", "connect"]
