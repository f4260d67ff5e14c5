"""Placement: concrete GPU ids for every worker of a plan."""

from __future__ import annotations

from enum import StrEnum

import attrs


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
    """One worker and its GPUs. `name` is stable across replans (e.g. `train-0`, `rollout-tp2-1`)."""

    name: str
    role: Role
    tp: int
    gpu_ids: tuple[int, ...]
    pool: Pool = Pool.CORE_ROLLOUT


@attrs.frozen(kw_only=True)
class Placement:
    workers: tuple[WorkerPlacement, ...]

    def gpus_used(self) -> set[int]:
        return {g for w in self.workers for g in w.gpu_ids}

    def by_name(self) -> dict[str, WorkerPlacement]:
        return {w.name: w for w in self.workers}
