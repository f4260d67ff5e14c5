"""What the simulator measures: one `StageRecord` per step and policy, and the summary of a run."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np


@attrs.frozen(kw_only=True)
class StageRecord:
    """Step `step` of one policy. In the asynchronous pipeline a stage is the rollout of `step` overlapped with the
    training of `step - 1`; in the synchronous one, the rollout then the training of `step`. `rollout_s` and
    `train_s` are the wall times of each side inside the stage (reconfiguration delays included)."""

    step: int
    start: float
    end: float
    rollout_s: float
    train_s: float
    train_gpus: int
    rollout_gpus: int
    lent_gpu_s: float  # rollout GPU-seconds lent to training by the elastic pool
    borrowed_gpu_s: float  # training GPU-seconds lent to rollout by the elastic pool
    busy_gpu_s: float  # GPU-seconds spent decoding, prefilling or training
    available_gpu_s: float  # num_gpus * (end - start)
    tokens: int  # tokens of the trajectories rolled out in this stage
    gen_tokens: int
    trajectories: int
    migrations: int
    migrated_tokens: int
    rebalanced_tokens: int  # context re-prefilled by turns that moved to an idle instance of their bucket or above
    reconfiguration_s: float  # delay the stage paid for a reconfiguration (0 when none)
    staleness: int  # policy versions between the rollout and the training of the batch trained in this stage
    trained: bool  # this stage trained a batch
    decoded_tokens: float = 0.0  # tokens the rollout decoded
    decode_capacity_tokens: float = 0.0  # tokens its instances could have decoded at their largest batch
    # seconds of this stage's rollout_s and train_s spent moving the policy between training and rollout, which a
    # plan's makespan leaves out (no plan changes them): the weight broadcast before an asynchronous rollout, the
    # colocated pipeline's switch into rollout and back; 0 in a stage that rolls nothing out
    switch_s: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class PolicyResult:
    name: str
    records: tuple[StageRecord, ...]
    decisions: tuple[dict[str, Any], ...]
    num_gpus: int

    @property
    def wall_s(self) -> float:
        return self.records[-1].end - self.records[0].start if self.records else 0.0

    def summary(self) -> dict[str, Any]:
        r = self.records
        wall = self.wall_s
        steps = [x for x in r if x.trajectories]
        tokens = sum(x.tokens for x in r)
        busy = sum(x.busy_gpu_s for x in r)
        available = sum(x.available_gpu_s for x in r)
        trained = [x for x in r if x.trained]
        capacity = sum(x.decode_capacity_tokens for x in r)
        full = [x for x in steps if x.step > 0]  # the pipeline full: the fill (step 0) and the drain left out
        full_s = sum(x.duration for x in full)
        return {
            "throughput_tok_s": tokens / wall if wall > 0 else 0.0,
            "steady_throughput_tok_s": sum(x.tokens for x in full) / full_s if full_s > 0 else None,
            "gen_throughput_tok_s": sum(x.gen_tokens for x in r) / wall if wall > 0 else 0.0,
            "mean_step_s": wall / max(1, len(steps)),
            "gpu_idle_fraction": 1.0 - busy / available if available > 0 else 0.0,
            "reconfigurations": sum(1 for d in self.decisions if d["step"] > 0),
            "migrations": sum(x.migrations for x in r),
            "migrated_token_fraction": sum(x.migrated_tokens for x in r) / tokens if tokens else 0.0,
            "rebalanced_token_fraction": sum(x.rebalanced_tokens for x in r) / tokens if tokens else 0.0,
            "staleness": float(np.mean([x.staleness for x in trained])) if trained else 0.0,
            # decode rate over capacity (rollout instances at their largest batch); occupancy is 1 - idle
            "utilisation": sum(x.decoded_tokens for x in r) / capacity if capacity > 0 else 0.0,
            "mean_rollout_s": float(np.mean([x.rollout_s for x in steps])) if steps else 0.0,
            "mean_train_s": float(np.mean([x.train_s for x in trained])) if trained else 0.0,
            # the part of a step's rollout and training that moves the weights, which `libra plan` leaves out
            "mean_switch_s": float(np.mean([x.switch_s for x in steps])) if steps else 0.0,
            "reconfiguration_s": sum(x.reconfiguration_s for x in r),
            "lent_gpu_s": sum(x.lent_gpu_s for x in r),
            "borrowed_gpu_s": sum(x.borrowed_gpu_s for x in r),
            "steps": len(steps),
            "wall_s": wall,
            "tokens": tokens,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "decisions": list(self.decisions),
            "steps": [x.to_dict() for x in self.records],
        }
