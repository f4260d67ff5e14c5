"""Ray launcher: a `Placement` laid out as one placement group per pool, one actor per worker.

Every worker of a pool gets one bundle of that pool's placement group; its actor (rollout instance or trainer
replica) is scheduled into exactly that bundle. A bundle asks for the worker's GPUs (`use_gpus=True`) and for a
small amount of the custom resource `libra_node_<k>`, where node `k = gpu_ids[0] // gpus_per_node`: start each Ray
node with `--resources='{"libra_node_<k>": 1}'` and the bundle can only land on that node (on one machine, a test
advertises several `libra_node_*` resources from a single node). A worker's GPUs never span nodes.

Plan changes are carried out as the elastic controller's decisions (this class is an `Executor`):
`StartInstance` starts a rollout actor, `StopInstance` kills it, `JoinTraining` starts a trainer actor in the
hybrid worker's own bundle (its GPUs do not move, its role does), `LeaveTraining`/`CancelJoin` kill it. A worker
that appears in a pool after launch gets a bundle of a new placement group of that pool.

Health (`check_health`) is a heartbeat with grace (`HealthPolicy`): a worker is dead when Ray confirms its actor
exited (`ActorDiedError`), or after `max_missed` consecutive heartbeats without a reply. One slow reply (a worker
busy in a long call, a loaded machine) is a miss, never a death: the elastic controller must not remove a slow
but live worker.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from libra.adapters.errors import AdapterError, UnsupportedConfig, WorkerNotFound
from libra.spec.placement import Placement, Pool, Role, WorkerPlacement

NODE_RESOURCE = "libra_node_{}"
_NODE_SHARE = 0.001  # a bundle's claim on its node resource: a marker, never the limit


class PlacementUnavailable(UnsupportedConfig):
    """A pool's placement group could not be placed in time: no Ray node offers what one of its bundles asks
    (names the bundles)."""


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise UnsupportedConfig(f"HealthPolicy.{attribute.name} must be a finite number > 0, got {value!r}")


def _whole(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedConfig(f"HealthPolicy.{attribute.name} must be a whole number >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class HealthPolicy:
    """When `check_health` declares a worker dead. Each check sends one heartbeat per actor (or keeps waiting on
    the one still unanswered) and waits up to `reply_timeout_s` for all of them together; an actor that has not
    replied by then has missed one heartbeat. Dead: Ray confirmed the actor exited, or `max_missed` consecutive
    checks passed without a reply. A reply resets the count."""

    reply_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    max_missed: int = attrs.field(default=3, validator=_whole)


@attrs.frozen(kw_only=True)
class ActorInfo:
    """Where one actor runs: its worker, role, pool, placement group id, bundle index and node index."""

    worker: str
    role: Role
    pool: Pool
    placement_group: str
    bundle_index: int
    node: int


class WorkerActor:
    """The actor body of every worker (wrapped with `ray.remote` by the launcher). `setup(fn, ...)` builds the
    worker's payload inside the actor (a rollout backend, a trainer); `call(method, ...)` forwards to it."""

    def __init__(self, info: ActorInfo) -> None:
        self.info = info
        self.payload: Any = None

    def describe(self) -> dict[str, Any]:
        import os

        import ray

        ctx = ray.get_runtime_context()
        return {
            "info": attrs.asdict(self.info),
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "assigned": dict(ctx.get_assigned_resources()),
        }

    def ping(self) -> int:
        """The heartbeat: answered as soon as the actor is free to run a method."""
        import os

        return os.getpid()

    def setup(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.payload = fn(self.info, *args, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.payload, method)(*args, **kwargs)


def _require_ray(worker: str) -> None:
    import ray

    if not ray.is_initialized():  # a Ray call would quietly start a local Ray without the libra_node resources
        raise AdapterError(f"cannot place worker {worker!r}: Ray is not initialised (ray.init first, or shut down)")


def node_of(worker: WorkerPlacement, gpus_per_node: int) -> int:
    nodes = {g // gpus_per_node for g in worker.gpu_ids}
    if len(nodes) != 1:
        raise UnsupportedConfig(
            f"worker {worker.name!r} has GPUs {worker.gpu_ids} on nodes {sorted(nodes)}; a "
            f"worker must stay inside one node of {gpus_per_node} GPUs"
        )
    return nodes.pop()


class RayLauncher:
    """Places actors for `placement` on a running Ray cluster (call `ray.init` first). `setup_rollout` /
    `setup_trainer`, if given, run inside each new actor as `fn(info)` to build its payload. `health` says when
    `check_health` declares a worker dead."""

    def __init__(
        self,
        *,
        placement: Placement,
        gpus_per_node: int,
        use_gpus: bool = False,
        setup_rollout: Callable[..., Any] | None = None,
        setup_trainer: Callable[..., Any] | None = None,
        ready_timeout_s: float = 60.0,
        health: HealthPolicy | None = None,
    ) -> None:
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise UnsupportedConfig(f"gpus_per_node must be a whole number >= 1, got {gpus_per_node!r}")
        self.placement, self.gpus_per_node, self.use_gpus = placement, gpus_per_node, use_gpus
        self.setup = {Role.ROLLOUT_INSTANCE: setup_rollout, Role.TRAIN_REPLICA: setup_trainer}
        self.ready_timeout_s = ready_timeout_s
        self.health = health if health is not None else HealthPolicy()
        self.missed: dict[str, int] = {}  # worker -> consecutive heartbeats without a reply
        self._heartbeats: dict[str, Any] = {}  # worker -> the heartbeat it has not answered yet
        self.actors: dict[str, Any] = {}
        self.infos: dict[str, ActorInfo] = {}
        self._bundles: dict[str, tuple[Any, int]] = {}  # worker -> (placement group, bundle index)
        self._groups: list[Any] = []
        self._tag = uuid.uuid4().hex[:8]  # placement group names are unique in a Ray namespace: one per launcher
        self._made = 0  # placement groups created, including any that never became ready
        self.log: list[str] = []

    # -- launch -------------------------------------------------------------------------------------------------

    def launch(self) -> dict[str, ActorInfo]:
        """One placement group per pool, one actor per worker; returns where every actor runs."""
        for pool in Pool:
            workers = [w for w in self.placement.workers if w.pool == pool]
            if workers:
                self._reserve(pool, workers)
        for w in sorted(self.placement.workers, key=lambda w: w.name):
            self._start(w, w.role)
        return dict(self.infos)

    def _reserve(self, pool: Pool, workers: Iterable[WorkerPlacement]) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        workers = sorted(workers, key=lambda w: w.name)
        _require_ray(workers[0].name)
        bundles = []
        for w in workers:
            bundle: dict[str, float] = {NODE_RESOURCE.format(node_of(w, self.gpus_per_node)): _NODE_SHARE}
            if self.use_gpus:
                bundle["GPU"] = float(len(w.gpu_ids))
            bundles.append(bundle)
        pg = placement_group(bundles, strategy="PACK", name=f"libra-{pool.value}-{self._tag}-{self._made}")
        self._made += 1
        try:
            ray.get(pg.ready(), timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)  # a pending group would wait on (and hold its name) forever
            asked = ", ".join(f"{w.name}: {b}" for w, b in zip(workers, bundles, strict=True))
            raise PlacementUnavailable(
                f"the {pool.value} pool's bundles were not placed in {self.ready_timeout_s:g} s: no Ray node has "
                f"free {asked} (start node k with --resources='{{\"libra_node_<k>\": 1}}')"
            ) from None
        self._groups.append(pg)
        for i, w in enumerate(workers):
            self._bundles[w.name] = (pg, i)
        self.log.append(f"reserved {pool.value}: {[w.name for w in workers]}")

    def _start(self, w: WorkerPlacement, role: Role) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if w.name in self.actors:
            raise ValueError(f"worker {w.name!r} already has an actor")
        _require_ray(w.name)
        if w.name not in self._bundles:
            self._reserve(w.pool, [w])
        pg, index = self._bundles[w.name]
        info = ActorInfo(
            worker=w.name,
            role=role,
            pool=w.pool,
            placement_group=pg.id.hex(),
            bundle_index=index,
            node=node_of(w, self.gpus_per_node),
        )
        cls = ray.remote(WorkerActor).options(
            name=f"libra-{w.name}",
            num_cpus=0,
            num_gpus=float(len(w.gpu_ids)) if self.use_gpus else 0,
            resources={NODE_RESOURCE.format(info.node): _NODE_SHARE},  # the actor holds its whole bundle
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            ),
        )
        actor = cls.remote(info)
        setup = self.setup[role]
        if setup is not None:
            try:
                ray.get(actor.setup.remote(setup))
            except Exception as exc:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
                cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause else exc
                first = (str(cause).splitlines() or [""])[0][:300]
                raise AdapterError(
                    f"setup of {role.value} {w.name!r} failed in its actor: {type(cause).__name__}: {first}"
                ) from None
        self.actors[w.name], self.infos[w.name] = actor, info
        self.log.append(f"started {role.value} {w.name} in {w.pool.value} bundle {index}")

    def _stop(self, name: str) -> None:
        import ray

        actor = self.actors.pop(name, None)
        info = self.infos.pop(name, None)
        self._forget_heartbeats(name)
        if actor is not None:
            ray.kill(actor)
            self.log.append(f"stopped {info.role.value if info else '?'} {name}")

    # -- plan changes (elastic decisions) -----------------------------------------------------------------------

    def execute(self, decision: Any) -> None:
        from libra.elastic.decisions import CancelJoin, JoinTraining, LeaveTraining, StartInstance, StopInstance

        if isinstance(decision, StartInstance):
            self._start(self._worker(decision.worker), Role.ROLLOUT_INSTANCE)
        elif isinstance(decision, JoinTraining):
            self._start(self._worker(decision.worker), Role.TRAIN_REPLICA)
        elif isinstance(decision, StopInstance | LeaveTraining | CancelJoin):
            self._stop(decision.worker)
        else:
            raise UnsupportedConfig(f"RayLauncher cannot carry out {type(decision).__name__}")

    def apply_plan(self, controller: Any, new: Placement, *, step: int, why: str) -> tuple[Any, ...]:
        """Ask the elastic controller for the decisions from the current placement to `new`, carry them out."""
        self.placement = new  # new workers' pools are read from here
        decisions = controller.apply_plan(new, step=step, why=why)
        for d in decisions:
            self.execute(d)
        return decisions

    def check_health(self, controller: Any = None, *, step: int) -> tuple[Any, ...]:
        """One heartbeat round (see `HealthPolicy`). A dead worker is forgotten and returned as a
        `ReplicaDiedError`; a hybrid worker that died in training is reported to `controller` as a FAIL event (it
        leaves training, the core proceeds without it). A dead core replica is only reported: the core training
        pool is fixed, the caller restarts it. A worker that is late but not yet past `max_missed` is left alone."""
        import ray

        from libra.adapters.errors import ReplicaDiedError
        from libra.elastic.states import JoinEvent

        for name, actor in self.actors.items():
            if name not in self._heartbeats:  # a late heartbeat is waited on again, not piled up behind
                self._heartbeats[name] = actor.ping.remote()
        pending = {ref: name for name, ref in self._heartbeats.items()}
        if not pending:
            return ()
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=self.health.reply_timeout_s)
        answered = {pending[ref] for ref in ready}
        dead = []
        for name in sorted(self._heartbeats):
            cause = None
            if name in answered:
                ref = self._heartbeats.pop(name)
                try:
                    ray.get(ref)
                    self.missed[name] = 0
                except ray.exceptions.ActorDiedError as exc:  # Ray confirms the actor process exited
                    cause = f"actor exited ({type(exc).__name__})"
                except ray.exceptions.RayActorError as exc:  # unreachable for now (e.g. restarting): a miss
                    self.missed[name] = self.missed.get(name, 0) + 1
                    self.log.append(f"heartbeat of {name} failed ({type(exc).__name__}): miss {self.missed[name]}")
            else:
                self.missed[name] = self.missed.get(name, 0) + 1
                self.log.append(f"heartbeat of {name} late: miss {self.missed[name]} of {self.health.max_missed}")
            if cause is None and self.missed.get(name, 0) >= self.health.max_missed:
                cause = f"{self.missed[name]} consecutive heartbeats missed ({self.health.reply_timeout_s:g} s each)"
            if cause is None:
                continue
            info = self.infos[name]
            actor = self.actors.pop(name)
            self.infos.pop(name)
            self._forget_heartbeats(name)
            with contextlib.suppress(Exception):  # fence it: a worker declared dead must not run on as a zombie
                ray.kill(actor, no_restart=True)
            dead.append(ReplicaDiedError(name, f"{cause} ({info.role.value} in {info.pool.value})"))
            self.log.append(f"dead {info.role.value} {name}: {cause}")
            if controller is not None and info.pool == Pool.HYBRID and info.role == Role.TRAIN_REPLICA:
                controller.on_event(name, JoinEvent.FAIL, step=step, why=f"actor dead: {cause}")
        return tuple(dead)

    def _forget_heartbeats(self, name: str) -> None:
        self._heartbeats.pop(name, None)
        self.missed.pop(name, None)

    def _worker(self, name: str) -> WorkerPlacement:
        w = self.placement.by_name().get(name)
        if w is None:
            raise WorkerNotFound(
                f"worker {name!r} is not in the placement; it holds {sorted(self.placement.by_name())}"
            )
        return w

    def describe(self) -> dict[str, dict[str, Any]]:
        import ray

        return dict(zip(self.actors, ray.get([a.describe.remote() for a in self.actors.values()])))

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for name in list(self.actors):
            self._stop(name)
        for pg in self._groups:
            remove_placement_group(pg)
        self._groups.clear()
        self._bundles.clear()
