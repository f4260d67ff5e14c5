"""The rollout table's fluid lower bound, checked against its definition and against the plans it bounds.

Mutation testing (docs/testing.md) found that the only check on `RolloutTable.fluid_gpu_seconds` was
`plan.makespan_s >= plan.lower_bound_s`, which every weaker bound passes: halving it, or giving start-small routing
the resident context of final-length routing, went unseen."""

from __future__ import annotations

import math

import attrs
import pytest

from libra.planning.rollout_dp import ROUTINGS, RolloutTable
from tests.planning.instances import sized_cost_model, skewed_groups

TPS = (1, 2, 4, 8)


def _instances(count: int = 40):
    for seed in range(count):
        cm, rng = sized_cost_model(20_000 + seed, max_gpus=12)
        groups = skewed_groups(rng, longest=cm.rollout.kv_capacity_tokens(1) * float(rng.uniform(0.3, 2.5)))
        tps = tuple(tp for tp in TPS if tp <= cm.cluster.gpus_per_node)
        cap = cm.rollout.kv_capacity_tokens(1)
        below = groups[-2].max_total if len(groups) > 1 else 0.0
        if seed % 4 == 0 and cap > below:  # the longest request exactly fills a TP-1 instance's KV cache (a tie)
            last = groups[-1]
            mean = min(last.mean_total, (below + cap) / 2)
            tie = attrs.evolve(last, max_total=cap, mean_total=mean, mean_gen=last.mean_gen * mean / last.mean_total)
            groups = (*groups[:-1], tie)
        for routing in ROUTINGS:
            yield seed, cm, groups, tps, routing


def _group_work(cm, group, tp: int, routing: str) -> float:
    """One group's GPU-seconds on degree `tp` at full concurrency, written out for a single group: its requests'
    decoded and prefilled tokens, and the decode-weighted resident context of a whole request (final-length) or the
    half-context lower bound of a request decoded piece by piece across buckets (start-small)."""
    n, total, gen = float(group.count), group.mean_total, group.mean_gen
    resident = total / 2.0 if routing == "start-small" else total - gen / 2.0
    return float(
        cm.rollout.fluid_gpu_seconds(
            tp, num_requests=n, decode_tokens=n * gen, prefill_tokens=n * (total - gen), resident_context=resident
        )
    )


def test_fluid_bound_is_each_group_on_its_cheapest_fitting_degree() -> None:
    """The bound is the sum over length groups of the least full-concurrency work over the TP degrees whose KV
    cache holds the group's longest request (inf when none does), computed group by group."""
    checked = 0
    for seed, cm, groups, tps, routing in _instances():
        table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing)
        expected = 0.0
        for g in groups:
            fitting = [tp for tp in table.tp_degrees if cm.rollout.fits(tp, g.max_total)]
            expected += min((_group_work(cm, g, tp, routing) for tp in fitting), default=math.inf)
        got = table.fluid_gpu_seconds()
        assert got == pytest.approx(expected, rel=1e-12) or got == expected == math.inf, (seed, routing)
        checked += math.isfinite(expected)
    assert checked >= 40  # most instances have a finite bound


def test_fluid_bound_never_exceeds_the_gpu_seconds_of_a_plan() -> None:
    """Every bucket plan the DP returns, at every limit it can meet, spends at least the bound in GPU-seconds (its
    instances busy for the bucket's time); and with start-small routing the bound is below the final-length one,
    whose resident context (a whole request's) is the larger."""
    compared = 0
    for seed, cm, groups, tps, routing in _instances(20):
        table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing)
        bound = table.fluid_gpu_seconds()
        for limit in table.candidates(0.0, math.inf)[::5]:
            gpus, buckets = table.min_gpus(float(limit))
            if math.isfinite(gpus):
                spent = sum(b.tp * b.count * b.time_s for b in buckets)
                assert spent >= bound * (1 - 1e-9), (seed, routing, limit)
                compared += 1
        if routing == "start-small":
            final = RolloutTable(
                cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing="final-length"
            )
            if math.isfinite(bound):
                assert bound < final.fluid_gpu_seconds(), seed
    assert compared >= 100
