"""Plans and buckets: the planner's decisions, as values.

A **bucket** is the set of rollout instances of one TP degree plus the range of trajectory lengths it serves;
its upper end is `max_tokens` (inclusive; `math.inf` for the last bucket).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from libra.spec import checks
from libra.spec.cluster import MAX_GPUS, MAX_GPUS_PER_NODE
from libra.spec.errors import SpecError

TP_DEGREES = (1, 2, 4, 8)  # the planner's default rollout degrees; a bucket may have any degree a node holds
MAX_MICRO_BATCH = 1 << 20  # sequences in one micro-batch: the most trajectories a step holds


def _finite_or_inf(value: float) -> float | int | None:
    return None if math.isinf(value) else value


@attrs.frozen(kw_only=True)
class Bucket:
    """Instances of degree `tp` serve trajectories whose total length is at most `max_tokens`."""

    tp: int
    max_tokens: float

    def __attrs_post_init__(self) -> None:
        # any degree up to a node's GPUs, as `parse_buckets` and the planner's `tp_degrees` take (TP-3 serves a
        # model of 24 heads on nodes of 6 GPUs); the planner checks the degree against the model and the cluster
        checks.whole("Bucket", "tp", self.tp, 1, MAX_GPUS_PER_NODE)
        checks.limit("Bucket", "max_tokens", self.max_tokens, 0.0)


def parse_buckets(spec: str) -> tuple[Bucket, ...]:
    """Parse `"1:4000,2:12000,4:30000,8:inf"`: comma-separated `tp:max_tokens`, limits strictly increasing."""
    if not spec or not spec.strip():
        raise SpecError("empty bucket spec; expected e.g. '1:4000,2:12000,4:30000,8:inf'")
    buckets = []
    for part in spec.split(","):
        tp_text, sep, limit_text = part.strip().partition(":")
        if not sep:
            raise SpecError(f"bucket {part.strip()!r} is not 'tp:max_tokens' (e.g. '2:12000')")
        try:
            tp = int(tp_text)
            limit = math.inf if limit_text.strip().lower() in ("inf", "infinity") else float(limit_text)
        except ValueError:
            raise SpecError(
                f"bucket {part.strip()!r}: tp must be an integer and max_tokens a number or 'inf'"
            ) from None
        if not 1 <= tp <= MAX_GPUS_PER_NODE:
            raise SpecError(f"bucket {part.strip()!r}: tp must be between 1 and {MAX_GPUS_PER_NODE}")
        if not (math.isinf(limit) and limit > 0) and not (math.isfinite(limit) and limit >= 1 and limit.is_integer()):
            raise SpecError(f"bucket {part.strip()!r}: max_tokens must be a whole number of tokens >= 1, or 'inf'")
        buckets.append(Bucket(tp=tp, max_tokens=limit))
    if len(buckets) > 64:
        raise SpecError(f"at most 64 buckets, got {len(buckets)}")
    for a, b in zip(buckets, buckets[1:]):
        if not b.max_tokens > a.max_tokens:
            raise SpecError(f"bucket limits must increase: {a.max_tokens:g} then {b.max_tokens:g} in {spec!r}")
    return tuple(buckets)


def format_buckets(buckets: tuple[Bucket, ...]) -> str:
    return ",".join(f"{b.tp}:{'inf' if math.isinf(b.max_tokens) else int(b.max_tokens)}" for b in buckets)


def bucket_index(buckets: tuple[Bucket, ...], length: float) -> int:
    """Index of the first bucket whose `max_tokens` holds `length`; the last bucket takes the overflow."""
    for i, b in enumerate(buckets):
        if length <= b.max_tokens:
            return i
    return len(buckets) - 1


@attrs.frozen(kw_only=True)
class TrainConfig:
    """Training parallelism: `num_gpus = tp * pp * dp`. For MoE models the expert layers are split over `ep`
    ranks taken from the data-parallel ranks (as in Megatron-core), so `ep` divides `dp`; each expert is
    tensor-parallel over `tp`. `micro_batch` is sequences per micro-batch; `recompute` is full activation
    recomputation; `memory_gb` is the predicted peak per GPU."""

    num_gpus: int
    tp: int
    pp: int
    dp: int
    ep: int = 1
    micro_batch: int = 1
    recompute: bool = False
    time_s: float = 0.0
    memory_gb: float = 0.0

    def __attrs_post_init__(self) -> None:
        # dp 0 (no training GPUs) is a plan's value too: placement and its tests take a plan without training
        checks.whole("TrainConfig", "num_gpus", self.num_gpus, 0, MAX_GPUS)
        for name in ("tp", "pp", "ep"):
            checks.whole("TrainConfig", name, getattr(self, name), 1, MAX_GPUS)
        checks.whole("TrainConfig", "dp", self.dp, 0, MAX_GPUS)
        checks.whole("TrainConfig", "micro_batch", self.micro_batch, 1, MAX_MICRO_BATCH)
        checks.flag("TrainConfig", "recompute", self.recompute)
        checks.seconds("TrainConfig", "time_s", self.time_s)
        checks.number("TrainConfig", "memory_gb", self.memory_gb, 0.0)
        if self.tp * self.pp * self.dp != self.num_gpus:
            raise SpecError(
                f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) != num_gpus({self.num_gpus}) in TrainConfig"
            )
        if self.dp % self.ep:
            raise SpecError(f"ep({self.ep}) must divide dp({self.dp}) in TrainConfig")

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.num_gpus,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "micro_batch": self.micro_batch,
            "recompute": self.recompute,
            "time_s": self.time_s,
            "memory_gb": self.memory_gb,
        }


@attrs.frozen(kw_only=True)
class InstanceGroup:
    """`count` instances of degree `tp` that serve lengths in (`min_tokens`, `max_tokens`]."""

    tp: int
    count: int
    max_tokens: float
    min_tokens: float = 0.0

    def __attrs_post_init__(self) -> None:
        # count 0: a bucket of the plan with no instances (placement takes such plans); lengths may be 0 tokens (a
        # profile of empty trajectories) and (min, max] may be empty where groups end at the same length
        checks.whole("InstanceGroup", "tp", self.tp, 1, MAX_GPUS_PER_NODE)
        checks.whole("InstanceGroup", "count", self.count, 0, MAX_GPUS)
        checks.limit("InstanceGroup", "max_tokens", self.max_tokens, 0.0, above=False)
        checks.number("InstanceGroup", "min_tokens", self.min_tokens, 0.0)
        if self.min_tokens > self.max_tokens:
            raise SpecError(
                f"InstanceGroup.min_tokens ({self.min_tokens:g}) must be <= max_tokens ({self.max_tokens:g})"
            )

    @property
    def num_gpus(self) -> int:
        return self.tp * self.count

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "count": self.count, "max_tokens": _finite_or_inf(self.max_tokens)}


@attrs.frozen(kw_only=True)
class RolloutConfig:
    num_gpus: int
    time_s: float
    instances: tuple[InstanceGroup, ...]

    def __attrs_post_init__(self) -> None:
        checks.whole("RolloutConfig", "num_gpus", self.num_gpus, 0, MAX_GPUS)
        checks.seconds("RolloutConfig", "time_s", self.time_s)
        checks.instance("RolloutConfig", "instances", self.instances, tuple)
        for g in self.instances:
            checks.instance("RolloutConfig", "instances[]", g, InstanceGroup)
        used = sum(g.num_gpus for g in self.instances)
        if used > self.num_gpus:
            raise SpecError(f"rollout instances use {used} GPUs but only {self.num_gpus} are given")

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """One bucket per instance group, in length order; the last one is open-ended."""
        groups = sorted(self.instances, key=lambda g: g.max_tokens)
        return tuple(
            Bucket(tp=g.tp, max_tokens=math.inf if i == len(groups) - 1 else g.max_tokens) for i, g in enumerate(groups)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.num_gpus, "time_s": self.time_s, "instances": [g.to_dict() for g in self.instances]}


@attrs.frozen(kw_only=True)
class Plan:
    """A complete decision for one GPU budget. `lower_bound_s` is a makespan no plan can beat, so
    `makespan_s / lower_bound_s` says how far from ideal a plan is: the larger of `fluid_bound_s` (the makespan if
    training and rollout both scaled perfectly with GPUs) and `chain_bound_s` (the longest chains of turns alone,
    each at a batch of one on the fastest instance that holds it, which no GPU count shortens)."""

    train: TrainConfig
    rollout: RolloutConfig
    makespan_s: float
    lower_bound_s: float = 0.0
    fluid_bound_s: float = 0.0
    chain_bound_s: float = 0.0
    solve_time_s: float = attrs.field(default=0.0, eq=False)  # how long the search took: not part of the plan

    def __attrs_post_init__(self) -> None:
        checks.instance("Plan", "train", self.train, TrainConfig)
        checks.instance("Plan", "rollout", self.rollout, RolloutConfig)
        for name in ("makespan_s", "lower_bound_s", "fluid_bound_s", "chain_bound_s", "solve_time_s"):
            checks.seconds("Plan", name, getattr(self, name))

    @property
    def num_gpus(self) -> int:
        return self.train.num_gpus + self.rollout.num_gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "fluid_bound_s": self.fluid_bound_s,
            "chain_bound_s": self.chain_bound_s,
            "solve_time_s": self.solve_time_s,
            "train": self.train.to_dict(),
            "rollout": self.rollout.to_dict(),
        }
