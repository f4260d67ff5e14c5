"""The rollout table's lower bounds (fluid and chain), checked against their definitions and the plans they bound.

Mutation testing (docs/testing.md) found that the only check on `RolloutTable.fluid_gpu_seconds` was
`plan.makespan_s >= plan.lower_bound_s`, which every weaker bound passes: halving it, or giving start-small routing
the resident context of final-length routing, went unseen."""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner
from libra.planning.rollout_dp import ROUTINGS, RolloutTable
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import WorkloadGenerator, profile_from_trajectories
from tests.planning.instances import sized_cost_model, skewed_groups, table_optimum, with_tool_tails

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


def _chained(count: int = 40):
    """`_instances`, every other seed with each request's tool seconds known, at a mean call of 0 or 2 s."""
    for seed, cm, groups, tps, routing in _instances(count):
        if seed % 2:
            groups = with_tool_tails(groups, np.random.default_rng([seed, 7]))
        yield seed, cm, groups, tps, routing, (0.0, 2.0)[seed % 3 == 0]


def _fastest_step(cm, tps: tuple[int, ...], tokens: float) -> float:
    """A batch of one at an empty context on the fastest of `tps` whose KV cache holds `tokens` (inf: none does)."""
    fit = [tp for tp in tps if cm.rollout.fits(tp, tokens)]
    return min((float(cm.rollout.decode_step_time(tp, 1.0, 0.0)) for tp in fit), default=math.inf)


def test_chain_bound_is_the_longest_chains_at_a_batch_of_one() -> None:
    """The bound written out from its definition: over every length group, its longest decoder's chain (its tokens
    at the fastest degree's step for a batch of one at an empty context among those holding the group, plus its
    tool seconds, or its turns at the mean call where tool seconds are unknown) and, where they are known, its
    request longest in tool calls' (its seconds plus its tokens at that step); the longest of them. It is at least
    the bound of the last group's longest decoder and the request longest in tool calls alone (before 2026-12-06),
    and larger on some instances."""
    checked = tighter = 0
    for seed, cm, groups, tps, routing, latency in _chained():
        table = RolloutTable(
            cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing, tool_latency_s=latency
        )
        step = functools.partial(_fastest_step, cm, table.tp_degrees)
        last = groups[-1]
        if math.isinf(step(last.max_total)):
            assert table.chain_bound_s() == 0.0
            continue
        known = last.max_tool_s is not None
        chains = []
        for g in groups:
            s = step(g.max_total)
            if known:
                chains += [g.tail_gen * s + g.max_gen_tool_s, g.max_tool_gen * s + g.max_tool_s]
            else:
                chains.append(g.tail_gen * s + g.tail_turns * latency)
        expected = max(chains)
        old = last.tail_gen * step(last.max_total) + (last.max_gen_tool_s if known else last.tail_turns * latency)
        if known:
            top = max(g.max_tool_s for g in groups)
            holder = next(g for g in groups if g.max_tool_s == top)
            old = max(old, top + holder.max_tool_gen * step(holder.max_total))
        assert table.chain_bound_s() == pytest.approx(expected, rel=1e-12), (seed, routing)
        assert table.chain_bound_s() >= old * (1 - 1e-12), (seed, routing)
        tighter += table.chain_bound_s() > old * (1 + 1e-9)
        checked += 1
    assert checked >= 40 and tighter >= 1, (checked, tighter)


def test_chain_bound_never_exceeds_the_fastest_rollout() -> None:
    """No plan of the DP, on all its GPUs, rolls out faster than the chain bound (the DP equals the brute-force
    oracle: test_rollout_and_planner.py); and the bound is not idle: on some instances it is within 2x of that
    fastest rollout, so a bound made twice as large fails here."""
    close = compared = 0
    for seed, cm, groups, tps, routing, latency in _chained(24):
        table = RolloutTable(
            cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing, tool_latency_s=latency
        )
        fastest, bound = table_optimum(table, table.max_gpus), table.chain_bound_s()
        if math.isfinite(fastest):
            assert bound <= fastest * (1 + 1e-12), (seed, routing, bound, fastest)
            close += bound >= fastest / 2
            compared += 1
    assert compared >= 30 and close >= 5, (compared, close)


def test_at_scale_the_chain_bound_certifies_the_plan() -> None:
    """At 1,024 GPUs the fluid bound says little (more GPUs shorten the throughput phase, not one request's own
    turns and tool calls): the chain bound is the lower bound there, and the planner's plan is within 10 % of it
    (about 7 % on this synthetic r2e-gym step), which no plan at all could be with a weaker bound."""
    rl = RLSettings(num_prompts=512)
    trajectories = WorkloadGenerator("r2e-gym", seed=0, num_prompts=512, samples_per_prompt=16).step(0)
    profile = profile_from_trajectories(trajectories)
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=1024, gpus_per_node=8)
    plan = GlobalPlanner(cluster=cluster, model=get_model("Qwen3-14B"), rl=rl).plan(profile)
    assert plan.chain_bound_s > 3 * plan.fluid_bound_s
    assert plan.lower_bound_s == max(plan.fluid_bound_s, plan.chain_bound_s)
    assert plan.lower_bound_s <= plan.makespan_s <= 1.10 * plan.lower_bound_s
