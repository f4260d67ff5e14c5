"""The elastic pool's borrow rule: when, where and how much the hybrid training replicas serve rollout in a stage.

The rule: once the stage's training is done and at least `min_backlog` requests queue that were never admitted, the
hybrid replicas (all but `core_fraction` of the training replicas) start instances of the most backlogged bucket
(queued requests per GPU), as many as their GPUs make, but only where those instances would be ready before the
bucket's own instances are estimated to have finished the queue (`queue_done_at`).

Why the condition: a borrowed instance takes a share of the queue. If it starts after the bucket's own instances
would have finished that share, the step waits for it and the borrow makes the rollout longer, not shorter (a
step of 88 one-token trajectories rolled out in 25.0 s with the pool against 14.5 s without: docs/sim.md, "The
elastic pool borrowed instances that started after the work was done").

When a borrowed instance is ready: its engine starts `to_rollout_s` after the borrow, and it serves the weights
of the stage's broadcast (`StageRecord.switch_s`), which it has only once the broadcast has ended; the two overlap,
as they do for the stage's own new instances. So a borrow made during the broadcast is ready at the broadcast's
end at the earliest (reached when the time slice is shorter than the broadcast: `SimOptions.max_slice_s`).

The rule only decides: it returns a `Borrow` (data) or None, and the engine (`libra.sim.engine.PolicyRun`)
carries it out on the rollout.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from libra.planning.cost import CostModel
from libra.sim.policies import Allocation
from libra.sim.rollout import WAIT, RolloutRun
from libra.sim.workload import StepWork
from libra.spec import checks


def decode_rate(cm: CostModel, tps: np.ndarray, ctx: float) -> float:
    """Tokens per second instances of degrees `tps` decode together at their largest batch (their KV pool's
    `kv_fill` at context `ctx`, at most `max_num_seqs`)."""
    rc, c = cm.rollout, cm.coeffs
    rate = 0.0
    for tp in np.unique(tps):
        batch = float(np.clip(np.floor(c.kv_fill * rc.kv_capacity_tokens(int(tp)) / max(ctx, 1.0)), 1, c.max_num_seqs))
        step = float(np.asarray(rc.decode_step_time(int(tp), np.array([batch]), np.array([ctx])))[0])
        rate += int((tps == tp).sum()) * batch / step
    return rate


@attrs.frozen(kw_only=True)
class Expected:
    """What a trajectory of a finished step took on average: decoded tokens, seconds in tool calls, tokens in all
    (the elastic pool's expectation of a queued request, which it cannot know the length of)."""

    gen_tokens: float
    tool_s: float
    total_tokens: float

    @classmethod
    def of(cls, work: StepWork) -> Expected:
        return cls(
            gen_tokens=float(work.gen_tokens.mean()),
            tool_s=float(work.tool_seconds.mean()),
            total_tokens=float(work.total_tokens.mean()),
        )


def queue_done_at(cm: CostModel, roll: RolloutRun, bucket: int, t: float, expected: Expected) -> float:
    """When (the rollout's clock) the active instances of `bucket` are estimated to have finished the requests
    queued on them that were never admitted: the work a borrowed instance would take from them, which it shortens
    only if it is ready before then.

    Estimated from what a runtime knows at `t`: the queue, the instances' decode rate (the cost model's, at their
    largest batch) and a finished step's mean trajectory (`expected`), never the queued requests' own lengths. The
    queue is done no earlier than the instances can start on it (now, or when the first of them is ready) plus the
    larger of one mean trajectory at batch one on the widest of them (its decode and its tool calls) and the
    queue's mean decode tokens over their rate. The work already under way is left out and the rate is their
    largest: the estimate is if anything early, so the pool errs towards not borrowing. No active instance in the
    bucket: never."""
    inst = roll.inst
    mine = inst.active & (inst.bucket == bucket)
    if not mine.any():
        return math.inf
    on_mine = np.zeros(roll.state.size, bool)
    placed = roll.where >= 0
    on_mine[placed] = mine[roll.where[placed]]
    queued = int(((roll.state == WAIT) & roll.fresh & on_mine).sum())
    start = max(t, float(inst.ready_at[mine].min()))
    ctx = expected.total_tokens / 2.0
    tps = inst.tp[mine]
    one = float(np.asarray(cm.rollout.decode_step_time(int(tps.max()), np.array([1.0]), np.array([ctx])))[0])
    chain = expected.gen_tokens * one + expected.tool_s
    rate = decode_rate(cm, tps, ctx)
    return start + max(chain, queued * expected.gen_tokens / rate if rate > 0 else math.inf)


@attrs.frozen(kw_only=True)
class Borrow:
    """A borrow: `count` instances of degree `tp` started for `bucket` on `hybrid` training replicas, serving from
    `ready_at` (the stage's clock). The replicas must align again before they train at the next stage."""

    bucket: int
    tp: int
    count: int
    ready_at: float
    hybrid: int

    @property
    def gpus(self) -> int:
        return self.count * self.tp


@attrs.frozen(kw_only=True)
class BorrowRule:
    """The rule's settings: the share of training replicas that never leave training (`core_fraction`), the queued
    requests that justify a borrow (`min_backlog`), and an engine's start (`to_rollout_s`, seconds)."""

    core_fraction: float
    min_backlog: int
    to_rollout_s: float

    def __attrs_post_init__(self) -> None:
        checks.number("BorrowRule", "core_fraction", self.core_fraction, 0.0, high=1.0)
        checks.whole("BorrowRule", "min_backlog", self.min_backlog, 0)
        checks.number("BorrowRule", "to_rollout_s", self.to_rollout_s, 0.0)

    def decide(
        self, cm: CostModel, roll: RolloutRun, alloc: Allocation, *, t: float, expected: Expected, weights_at: float
    ) -> Borrow | None:
        """The borrow at `t` (the stage's clock, training done), or None. `weights_at` is when the stage's weight
        broadcast ends. None where no hybrid replica is left, fewer than `min_backlog` requests queue, the hybrid
        GPUs make no instance of the bucket's degree, or the instances would be ready no earlier than the bucket's
        own would have finished the queue (asked again at the next event, with the queue as it is then)."""
        cfg = alloc.train
        hybrid = cfg.dp - max(1, math.ceil(cfg.dp * self.core_fraction))
        if hybrid < 1:
            return None
        queued = (roll.state == WAIT) & roll.fresh
        if int(queued.sum()) < self.min_backlog:
            return None
        per_bucket = np.bincount(roll.inst.bucket[roll.where[queued]], minlength=len(alloc.rollout))
        gpus_b = np.array([g.num_gpus for g in alloc.rollout], float)
        b = int(np.argmax(per_bucket / gpus_b))
        tp = alloc.rollout[b].tp
        count = hybrid * cfg.tp * cfg.pp // tp
        if count < 1:
            return None
        ready = max(t + self.to_rollout_s, weights_at)  # the engine's start and the broadcast overlap
        if queue_done_at(cm, roll, b, t, expected) <= ready:
            return None
        return Borrow(bucket=b, tp=tp, count=count, ready_at=ready, hybrid=hybrid)
