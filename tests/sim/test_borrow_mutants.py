"""The mutants of the elastic pool's borrow rule (`libra.sim.borrow`) that the engine-level tests let through
(docs/testing.md, "The three-candidate chain and the borrow rule"): each test names the wrong answers it catches.

The rule's parts are checked on one real rollout of 88 one-token trajectories (`one_token_scenario`) whose queue is
laid out by hand: which requests wait, were admitted before, sit on which instance or on none. `queue_done_at` is
checked against its stated estimate (the queue's mean decode tokens over the instances' rate, or a mean trajectory
at batch one, whichever is longer), `decode_rate` against the KV pool and the engine's cap on sequences."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from conftest import one_token_scenario, policy_run

from libra.planning.cost import CostModel
from libra.sim import Decision, routes_for
from libra.sim.borrow import Borrow, BorrowRule, Expected, decode_rate, queue_done_at
from libra.sim.engine import weight_sync_s
from libra.sim.policies import Allocation
from libra.sim.rollout import RUN, WAIT, RolloutRun
from libra.spec import InstanceGroup, SpecError, TrainConfig

# bucket 0: two TP-1 instances (0, 1), 2 GPUs; bucket 1: two TP-2 instances (2, 3), 4 GPUs; a hybrid replica of 5
# GPUs to borrow
TWO_BUCKETS = Allocation(
    train=TrainConfig(num_gpus=10, tp=1, pp=5, dp=2),
    rollout=(InstanceGroup(tp=1, count=2, max_tokens=1000.0), InstanceGroup(tp=2, count=2, max_tokens=math.inf)),
    routing="single",
)
# the same with the degrees swapped: bucket 0 on 4 GPUs, bucket 1 on 2
SMALL_LAST = attrs.evolve(TWO_BUCKETS, rollout=tuple(attrs.evolve(g, tp=3 - g.tp) for g in TWO_BUCKETS.rollout))
RULE = BorrowRule(core_fraction=0.5, min_backlog=1, to_rollout_s=10.8)


@pytest.fixture
def laid_out(tmp_path) -> tuple[CostModel, RolloutRun, float]:
    return _laid_out(tmp_path, TWO_BUCKETS)


def _laid_out(tmp_path, allocation: Allocation) -> tuple[CostModel, RolloutRun, float]:
    """The 88 requests at the broadcast's end (`sync`), laid out by hand: 0-9 decoding on instance 0; 10-19 back
    from a tool call, waiting on instance 1 (admitted before); 20-34 and 35-49 never admitted, waiting on instances
    2 and 3 (bucket 1's queue: 30); 50-59 on no instance; 60-73 and 74-87 never admitted, waiting on instances 0
    and 1 (bucket 0's queue: 28)."""
    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    run = policy_run(sc, "libra")
    run.decide(Decision(step=0, allocation=allocation, reason="the layout under test"))
    run.begin_stage()
    work, sync = sc.source.step(0), weight_sync_s(run.cm)
    roll = run._rollout(work, routes_for("single", work, allocation.buckets, None), 0.0, sync)
    assert roll.inst.bucket.tolist() == [0, 0, 1, 1]
    roll.where[:] = np.repeat([0, 1, 2, 3, -1, 0, 1], [10, 10, 15, 15, 10, 14, 14])
    roll.state[:10] = RUN
    roll.fresh[:20] = False
    assert (roll.state[10:] == WAIT).all() and roll.fresh[20:].all()
    return run.cm, roll, sync


def _cost_model(tmp_path, **coeffs: float) -> CostModel:
    """The one-token scenario's cost model, with `coeffs` changed."""
    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    return CostModel(sc.cluster, sc.model, attrs.evolve(cm.coeffs, **coeffs))


def _context_for_batch(cm: CostModel, tp: int, batch: float) -> float:
    """The context at which an instance of degree `tp` holds `batch` + 0.5 sequences in its KV pool."""
    return cm.coeffs.kv_fill * cm.rollout.kv_capacity_tokens(tp) / (batch + 0.5)


def _step(cm: CostModel, tp: int, batch: float, ctx: float) -> float:
    return float(np.asarray(cm.rollout.decode_step_time(tp, np.array([batch]), np.array([ctx])))[0])


def test_the_decode_rate_is_each_instances_largest_batch_over_its_step(tmp_path) -> None:
    """Caught: `decode_rate` starting from 1 token/s, replacing the sum of its degrees with the last one's (`rate =`),
    dividing the KV pool by the context the wrong way, and clipping the batch to [2, ...], [None, ...] or
    [1, None]: the batch is the KV pool's `kv_fill` over the context, at least 1, at most `max_num_seqs`."""
    cm = _cost_model(tmp_path)
    for tp in (1, 2):
        one = np.array([tp])
        ctx = _context_for_batch(cm, tp, 7.0)  # the KV pool holds 7 sequences
        assert decode_rate(cm, one, ctx) == 7.0 / _step(cm, tp, 7.0, ctx)
        cap = float(cm.coeffs.max_num_seqs)  # a short context: the engine's cap
        assert decode_rate(cm, one, 100.0) == cap / _step(cm, tp, cap, 100.0)
        for share in (0.9, 1.5):  # the KV pool holds 1.1 or 0.7 of a sequence: one runs at a time
            ctx = cm.coeffs.kv_fill * cm.rollout.kv_capacity_tokens(tp) * share
            assert decode_rate(cm, one, ctx) == 1.0 / _step(cm, tp, 1.0, ctx)
    mixed = decode_rate(cm, np.array([1, 2, 1]), 3000.0)
    assert mixed == pytest.approx(2 * decode_rate(cm, np.array([1]), 3000.0) + decode_rate(cm, np.array([2]), 3000.0))


def test_a_context_under_one_token_counts_as_one(tmp_path) -> None:
    """Caught: `max(ctx, 2.0)` for `max(ctx, 1.0)`: with no cap on sequences a context of half a token lets the
    KV pool hold `kv_fill` x its tokens (at a context of 1), not half of them."""
    cm = _cost_model(tmp_path, max_num_seqs=1_000_000)
    batch = math.floor(cm.coeffs.kv_fill * cm.rollout.kv_capacity_tokens(1))
    assert batch < 1_000_000
    assert decode_rate(cm, np.array([1]), 0.5) == batch / _step(cm, 1, float(batch), 0.5)


def _estimate(cm: CostModel, roll: RolloutRun, bucket: int, t: float, queued: int, expected: Expected) -> float:
    """`queue_done_at` as its docstring states it, with the queue counted by the test."""
    mine = roll.inst.bucket == bucket
    ctx = expected.total_tokens / 2.0
    one = _step(cm, int(roll.inst.tp[mine].max()), 1.0, ctx)
    chain = expected.gen_tokens * one + expected.tool_s
    return t + max(chain, queued * expected.gen_tokens / decode_rate(cm, roll.inst.tp[mine], ctx))


def test_the_queue_is_the_buckets_never_admitted_waiting_requests(laid_out) -> None:
    """Caught: counting requests decoding, admitted before, waiting in another bucket or on no instance, dropping
    those on instance 0 (`where > 0`, `>= 1`) or every placed one, `/` for `*` in the queue's tokens, and the
    context taken at twice or a third of the mean total: the queue's term decides here (a context where a TP-1
    instance holds 4 sequences, 1,000 tokens each)."""
    cm, roll, sync = laid_out
    for bucket, queued in ((0, 28), (1, 30)):
        tp = 2 if bucket else 1
        expected = Expected(gen_tokens=1000.0, tool_s=0.0, total_tokens=2.0 * _context_for_batch(cm, tp, 4.0))
        got = queue_done_at(cm, roll, bucket, sync, expected)
        assert got == pytest.approx(_estimate(cm, roll, bucket, sync, queued, expected), rel=1e-12), bucket
        assert got > _estimate(cm, roll, bucket, sync, 0, expected)  # the queue, not the chain, sets it


def test_a_long_mean_trajectory_sets_the_estimate_at_batch_one(laid_out) -> None:
    """Caught: the mean trajectory's step taken at a batch of 2: with 100 s of tool calls its chain decides."""
    cm, roll, sync = laid_out
    expected = Expected(gen_tokens=500.0, tool_s=100.0, total_tokens=3000.0)
    for bucket in (0, 1):
        got = queue_done_at(cm, roll, bucket, sync, expected)
        assert got == pytest.approx(_estimate(cm, roll, bucket, sync, 0, expected), rel=1e-12)


def test_an_engine_slower_than_a_token_a_second_still_finishes_its_queue(laid_out) -> None:
    """Caught: `rate > 1` for `rate > 0`: at a 10 s engine step the bucket decodes under a token a second, and its
    queue is done late, not never."""
    cm, roll, sync = laid_out
    slow = CostModel(cm.cluster, cm.model, attrs.evolve(cm.coeffs, step_overhead_s=10.0))
    expected = Expected(gen_tokens=1000.0, tool_s=0.0, total_tokens=2.0 * _context_for_batch(cm, 1, 4.0))
    assert decode_rate(slow, roll.inst.tp[:2], expected.total_tokens / 2.0) < 1.0
    got = queue_done_at(slow, roll, 0, sync, expected)
    assert math.isfinite(got) and got == pytest.approx(_estimate(slow, roll, 0, sync, 28, expected), rel=1e-12)


# a mean trajectory that keeps bucket 0's instances busy long past a borrowed instance's start
BUSY = Expected(gen_tokens=20_000.0, tool_s=0.0, total_tokens=4000.0)


def test_the_borrow_goes_to_the_bucket_with_the_most_queued_requests_per_gpu(laid_out) -> None:
    """Caught: the bucket chosen by queued requests times GPUs, or always bucket 0 (`argmax(None)`, the GPUs an
    array of NaN)."""
    cm, roll, sync = laid_out
    roll.where[50:60] = 0  # bucket 0: 38 queued on 2 GPUs; bucket 1: 30 on 4 (times GPUs: 76 against 120)
    got = RULE.decide(cm, roll, TWO_BUCKETS, t=sync, expected=BUSY, weights_at=sync)
    assert got == Borrow(bucket=0, tp=1, count=5, ready_at=sync + RULE.to_rollout_s, hybrid=1)
    roll.where[50:80] = 2  # bucket 0: 8 queued on 2 GPUs; bucket 1: 60 on 4
    got = RULE.decide(cm, roll, TWO_BUCKETS, t=sync, expected=BUSY, weights_at=sync)
    assert got == Borrow(bucket=1, tp=2, count=2, ready_at=sync + RULE.to_rollout_s, hybrid=1)


def test_a_bucket_with_none_queued_is_counted_as_none(tmp_path) -> None:
    """Caught: a count of queued requests per bucket only as long as the last bucket holding one: the 68 queued of
    bucket 0 (4 GPUs) were then divided by every bucket's GPUs, and bucket 1 (2 GPUs, none queued) got the borrow."""
    cm, roll, sync = _laid_out(tmp_path, SMALL_LAST)
    roll.where[20:60] = 0
    got = RULE.decide(cm, roll, SMALL_LAST, t=sync, expected=BUSY, weights_at=sync)
    assert got == Borrow(bucket=0, tp=2, count=2, ready_at=sync + RULE.to_rollout_s, hybrid=1)


def test_the_backlog_counts_only_never_admitted_waiting_requests(laid_out) -> None:
    """Caught: `<=` for `<` against `min_backlog` and `|` for `&` in the backlog: 68 requests are queued (never
    admitted, waiting), 10 more wait that were admitted before; a backlog of exactly 68 is enough, 69 is not."""
    cm, roll, sync = laid_out
    roll.where[50:60] = 0
    for backlog, borrows in ((68, True), (69, False)):
        rule = attrs.evolve(RULE, min_backlog=backlog)
        got = rule.decide(cm, roll, TWO_BUCKETS, t=sync, expected=BUSY, weights_at=sync)
        assert (got is not None) is borrows, backlog


def test_no_borrow_is_made_that_would_be_ready_just_when_the_queue_is_done(laid_out) -> None:
    """Caught: `<` for `<=` in the rule's condition: a borrowed instance ready at the very moment the bucket's own
    would have finished the queue shortens nothing (a mean trajectory of no tokens and `to_rollout_s` of tools)."""
    cm, roll, sync = laid_out
    roll.where[50:60] = 0  # bucket 0 is the most backlogged
    expected = Expected(gen_tokens=0.0, tool_s=RULE.to_rollout_s, total_tokens=2.0)
    assert queue_done_at(cm, roll, 0, sync, expected) == sync + RULE.to_rollout_s
    assert RULE.decide(cm, roll, TWO_BUCKETS, t=sync, expected=expected, weights_at=sync) is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("core_fraction", 1.5, r"^BorrowRule\.core_fraction must be "),
        ("core_fraction", -0.1, r"^BorrowRule\.core_fraction must be "),
        ("min_backlog", -1, r"^BorrowRule\.min_backlog must be an integer >= 0, got -1$"),
        ("to_rollout_s", -1.0, r"^BorrowRule\.to_rollout_s must be "),
    ],
)
def test_a_rule_out_of_range_is_refused_with_its_field_named(field: str, value: float, message: str) -> None:
    """Caught: the owner or field left out of or misspelt in the one-line error, `core_fraction` allowed above 1
    (no bound, or 2), `min_backlog` of 0 refused."""
    with pytest.raises(SpecError, match=message):
        attrs.evolve(RULE, **{field: value})


def test_the_edges_of_the_ranges_are_accepted() -> None:
    rule = BorrowRule(core_fraction=1.0, min_backlog=0, to_rollout_s=0.0)
    assert (rule.core_fraction, rule.min_backlog, rule.to_rollout_s) == (1.0, 0, 0.0)
