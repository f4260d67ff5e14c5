"""Placement: concrete GPU ids for every worker of a plan."""

from __future__ import annotations

from enum import StrEnum

import attrs

from libra.spec import checks
from libra.spec.cluster import MAX_GPUS
from libra.spec.errors import SpecError


class Role(StrEnum):
    """What a worker does. `TRAIN_REPLICA` is one data-parallel replica (its TP x PP ranks); `ROLLOUT_INSTANCE` is
    one inference instance (its TP ranks)."""

    TRAIN_REPLICA = "train_replica"
    ROLLOUT_INSTANCE = "rollout_instance"


class Pool(StrEnum):
    """Core training (never rebuilt), core rollout, and the elastic hybrid pool (switches between the two)."""

    CORE_TRAIN = "core_train"
    CORE_ROLLOUT = "core_rollout"
    HYBRID = "hybrid"


@attrs.frozen(kw_only=True)
class WorkerPlacement:
    """One worker and its GPUs. `name` is stable across replans (e.g. `train-0`, `rollout-tp2-1`). A rollout
    instance holds `tp` GPUs, a training replica a multiple of `tp` (its TP x PP ranks); no GPU twice."""

    name: str
    role: Role
    tp: int
    gpu_ids: tuple[int, ...]
    pool: Pool = Pool.CORE_ROLLOUT

    def __attrs_post_init__(self) -> None:
        checks.text("WorkerPlacement", "name", self.name)
        where = f"WorkerPlacement {self.name!r}"
        for field, kind in (("role", Role), ("pool", Pool)):
            if not isinstance(getattr(self, field), kind):
                known = ", ".join(f"{kind.__name__}.{m.name}" for m in kind)
                raise SpecError(f"{where}: {field} must be one of {known}, got {getattr(self, field)!r}")
        checks.whole("WorkerPlacement", "tp", self.tp, 1, MAX_GPUS)
        ids = self.gpu_ids
        if not isinstance(ids, tuple):
            raise SpecError(f"{where}: gpu_ids must be a tuple, got {type(ids).__name__}")
        if not all(checks.is_whole(g) and 0 <= g < MAX_GPUS for g in ids) or len(set(ids)) != len(ids):
            raise SpecError(f"{where}: gpu_ids must be distinct GPU ids in [0, {MAX_GPUS:,}), got {ids!r}")
        if (len(ids) != self.tp) if self.role == Role.ROLLOUT_INSTANCE else (not ids or len(ids) % self.tp):
            raise SpecError(f"{where}: {len(ids)} GPU ids for a {self.role.value} of TP {self.tp}")


@attrs.frozen(kw_only=True)
class Placement:
    """Every worker of a plan, names unique. A placement `place` makes holds each GPU once (`shared_gpus` is
    empty); the value itself allows more, so that a solver can be handed any current placement to move from."""

    workers: tuple[WorkerPlacement, ...]

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.workers, tuple) or not all(isinstance(w, WorkerPlacement) for w in self.workers):
            raise SpecError("Placement.workers must be a tuple of WorkerPlacement")
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise SpecError(f"Placement: worker names must be unique; {repeated} repeat")

    def shared_gpus(self) -> dict[int, tuple[str, ...]]:
        """GPUs held by more than one worker, with the workers' names."""
        holders: dict[int, list[str]] = {}
        for w in self.workers:
            for g in w.gpu_ids:
                holders.setdefault(g, []).append(w.name)
        return {g: tuple(names) for g, names in sorted(holders.items()) if len(names) > 1}

    def gpus_used(self) -> set[int]:
        return {g for w in self.workers for g in w.gpu_ids}

    def by_name(self) -> dict[str, WorkerPlacement]:
        return {w.name: w for w in self.workers}
