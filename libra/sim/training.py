"""Training in the simulator: a layout for a GPU budget, and one step's progress as replicas join or leave.

A training step on `dp` replicas takes `TrainingCost.step_time(tp, pp, dp, ...)` seconds for the step's batch
(`BatchStats` of its trajectories). The global batch is fixed, so a replica that joins mid-step makes the rest of
the step faster, not bigger: progress is a fraction of the step done, advancing at `1 / step_time(dp_now)` per
second. A joining replica contributes placeholders (zero gradients) until it is aligned, so it counts from the
moment its join completes.
"""

from __future__ import annotations

import functools

import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.planning.train_tree import TrainingSearch
from libra.spec import SpecError, TrainConfig


@functools.lru_cache(maxsize=1024)
def _best_cached(cm: CostModel, num_gpus: int, batch: BatchStats) -> TrainConfig | None:
    return TrainingSearch(cm, batch).best(num_gpus)


def best_layout(cm: CostModel, num_gpus: int, batch: BatchStats) -> TrainConfig:
    """The fastest valid layout on exactly `num_gpus` GPUs (the planner's training tree); SpecError when none."""
    best = _best_cached(cm, num_gpus, batch)
    if best is None:
        raise SpecError(
            f"no training layout of {cm.model.name} fits {num_gpus} x {cm.cluster.gpu.name} "
            f"(global batch {batch.num_sequences}, longest sequence {batch.max_len:.0f})"
        )
    return best


def nearest_layout(cm: CostModel, num_gpus: int, batch: BatchStats, *, step: int = 1) -> TrainConfig:
    """The best layout on the largest GPU count <= `num_gpus` (in multiples of `step`) that has one."""
    for g in range(num_gpus - num_gpus % step, 0, -step):
        found = _best_cached(cm, g, batch)
        if found is not None:
            return found
    raise SpecError(f"no training layout of {cm.model.name} fits on {num_gpus} or fewer GPUs")


def step_time(cm: CostModel, cfg: TrainConfig, batch: BatchStats, dp: int | None = None) -> float:
    return float(
        cm.training.step_time(
            cfg.tp, cfg.pp, cfg.dp if dp is None else dp, cfg.ep, cfg.micro_batch, cfg.recompute, batch
        )
    )


class TrainingJob:
    """One training step in progress. `joins` are (time, replicas) events that add replicas mid-step."""

    def __init__(self, cm: CostModel, cfg: TrainConfig, batch: BatchStats, *, start: float, replicas: int) -> None:
        if replicas < 1:
            raise SpecError(f"a training step needs at least one replica, got {replicas}")
        self.cm, self.cfg, self.batch = cm, cfg, batch
        self.start = start
        self.replicas = replicas
        self.joins: list[tuple[float, int]] = []
        self.done_frac = 0.0
        self.clock = start
        self.end: float | None = None
        self.busy_gpu_s = 0.0
        self._times: dict[int, float] = {}

    @property
    def replica_gpus(self) -> int:
        return self.cfg.tp * self.cfg.pp

    def time_for(self, replicas: int) -> float:
        if replicas not in self._times:
            self._times[replicas] = step_time(self.cm, self.cfg, self.batch, replicas)
        return self._times[replicas]

    def join(self, at: float, replicas: int) -> None:
        self.joins.append((at, replicas))
        self.joins.sort()

    def remaining_s(self) -> float:
        """Seconds left at the current replica count (ignoring joins still aligning)."""
        return (1.0 - self.done_frac) * self.time_for(self.replicas)

    def advance_to(self, t: float) -> None:
        """Progress the step to time `t` (or to its end, recorded in `end`)."""
        while self.end is None and self.clock < t:
            nxt = t
            if self.joins and self.joins[0][0] < nxt:
                nxt = max(self.clock, self.joins[0][0])
            rate = 1.0 / self.time_for(self.replicas)
            need = (1.0 - self.done_frac) / rate
            span = nxt - self.clock
            if need <= span:
                self.busy_gpu_s += need * self.replicas * self.replica_gpus
                self.end = self.clock + need
                self.clock = self.end
                self.done_frac = 1.0
                break
            self.busy_gpu_s += span * self.replicas * self.replica_gpus
            self.done_frac += span * rate
            self.clock = nxt
            while self.joins and self.joins[0][0] <= self.clock:
                self.replicas += self.joins.pop(0)[1]

    def run_to_end(self) -> float:
        self.advance_to(np.inf)
        assert self.end is not None
        return self.end
