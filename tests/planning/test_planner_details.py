"""Global planner properties the oracle comparison cannot see (found by mutation testing, docs/testing.md): the
plan scored on its own workload, spare GPUs, tree options, and the errors that explain why no plan exists."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.planner import PlanningError
from libra.planning.rollout_dp import ROUTINGS
from libra.planning.train_tree import TreeOptions
from libra.spec import ModelSpec, RLSettings, SpecError, WorkloadProfile
from tests.planning.instances import sized_cost_model, skewed_groups

TPS = (1, 2, 4, 8)
PER_GROUP = 4


def _identical_request_instance(seed: int, routing: str, tool_s: float, **options):
    """A planner and a profile whose length groups each hold `PER_GROUP` identical requests (so the DP's group
    means are the requests themselves), with the global batch equal to the profile's size."""
    cm, rng = sized_cost_model(30_000 + seed, max_gpus=12)
    groups = skewed_groups(rng, longest=cm.rollout.kv_capacity_tokens(1) * float(rng.uniform(0.5, 2.0)))
    # decoded tokens and turns grow with the length, so a bucket's longest chain is its last group's (the DP takes
    # the tail from the bucket's last group, `evaluate` from every request ending in the bucket)
    turns = np.maximum.accumulate([g.mean_turns for g in groups])
    gens = np.maximum.accumulate([g.max_total * g.mean_gen / g.mean_total for g in groups])
    shapes = [(g.max_total, float(gen), float(t)) for g, gen, t in zip(groups, gens, turns, strict=True)]
    profile = WorkloadProfile.build(name="identical", shapes=shapes * PER_GROUP, mean_tool_time_s=tool_s)
    tps = tuple(tp for tp in TPS if tp <= cm.cluster.gpus_per_node)
    planner = GlobalPlanner(
        cluster=cm.cluster,
        model=cm.model,
        rl=RLSettings(num_prompts=len(shapes), samples_per_prompt=PER_GROUP),
        coeffs=cm.coeffs,
        options=PlannerOptions(tp_degrees=tps, num_groups=len(shapes), routing=routing, **options),
    )
    return cm, planner, profile


def test_a_plan_scored_on_its_own_workload_gets_its_own_times() -> None:
    """`evaluate` routes every raw request; when each length group holds identical requests that is exactly the
    DP's model, so a plan scored on the profile it was made for gets the times it was planned with, for both
    routings, with and without tool latency and turn counts, spare GPUs handed out or not."""
    compared = multi = 0
    for seed in range(40):
        routing = ROUTINGS[seed % 2]
        tool_s = (0.0, 1.5, 40.0)[(seed // 2) % 3]  # 40 s: the queued tail bounds later buckets
        cm, planner, profile = _identical_request_instance(seed, routing, tool_s, fill_spare_gpus=seed % 3 > 0)
        if seed % 5 == 0:  # no turn counts: one turn per request
            profile = attrs.evolve(profile, turns=())
        try:
            plan = planner.plan(profile)
        except SpecError:
            continue
        train_s, rollout_s = planner.evaluate(plan, profile)
        assert train_s == pytest.approx(plan.train.time_s, rel=1e-12), seed
        assert rollout_s == pytest.approx(plan.rollout.time_s, rel=1e-9), seed
        compared += 1
        multi += len(plan.rollout.instances) > 1
        # and every bucket plan of the DP's table, not only the optimum (long tool calls make the optimum a single
        # bucket, while the queued tail of later buckets is what they test)
        table = planner.tables(profile).rollout
        for limit in table.candidates(0.0, math.inf)[::4]:
            _, buckets = table.min_gpus(float(limit))
            if len(buckets) > 1:
                got = planner.rollout_time(table.instance_groups(buckets), profile)
                assert got == pytest.approx(max(b.time_s for b in buckets), rel=1e-9), (seed, limit)
                multi += 1
    assert compared >= 25 and multi >= 40, (compared, multi)


def test_requests_that_only_pass_through_a_bucket() -> None:
    """Scored on a workload whose requests all outgrow the plan's first bucket (start-small routing), that bucket
    serves them only on their way through: a finite time, and the plan is slower on the longer requests."""
    for seed in range(40):
        _, planner, profile = _identical_request_instance(seed, "start-small", 1.0)
        try:
            plan = planner.plan(profile)
        except SpecError:
            continue
        if len(plan.rollout.instances) < 2:
            continue
        first = plan.rollout.instances[0].max_tokens
        longer = [t for t in profile.total_lengths if t > first]
        gens = [g for t, g in zip(profile.total_lengths, profile.gen_tokens, strict=True) if t > first]
        shapes = [(t, g, 2.0) for t, g in zip(longer, gens, strict=True)]
        shapes = (shapes * len(profile.total_lengths))[: len(profile.total_lengths)]
        drifted = WorkloadProfile.build(name="longer", shapes=shapes, mean_tool_time_s=1.0)
        slower = planner.rollout_time(plan.rollout.instances, drifted)
        assert math.isfinite(slower) and slower > planner.rollout_time(plan.rollout.instances, profile)
        return
    pytest.fail("no instance had a plan with several buckets")


def test_turn_counts_default_to_one_per_request() -> None:
    for seed in range(10):
        _, planner, profile = _identical_request_instance(seed, "start-small", 2.0)
        ones = attrs.evolve(profile, turns=tuple(1.0 for _ in profile.total_lengths))
        try:
            plan = planner.plan(ones)
        except SpecError:
            continue
        assert planner.rollout_time(plan.rollout.instances, attrs.evolve(profile, turns=())) == pytest.approx(
            planner.rollout_time(plan.rollout.instances, ones), rel=1e-12
        )
        return
    pytest.fail("no instance had a plan")


def _tables(seed: int):
    cm, planner, profile = _identical_request_instance(seed, "start-small", 0.0)
    return cm, planner.tables(profile).rollout


def test_spare_gpus_go_to_the_slowest_bucket_and_keep_the_times_consistent() -> None:
    """With exactly enough spare GPUs for one more instance of the slowest bucket, and one more instance makes
    it faster, filling gives them to it (the rollout time falls), never to a faster bucket first; every bucket's
    time is the table's time for its new count, and the GPUs used are within the budget."""
    checked = 0
    for seed in range(60):
        cm, table = _tables(seed)
        for limit in table.candidates(0.0, math.inf)[::3]:
            gpus, buckets = table.min_gpus(float(limit))
            if not math.isfinite(gpus) or len(buckets) < 2:
                continue
            slow = max(range(len(buckets)), key=lambda k: buckets[k].time_s)
            b = buckets[slow]
            if slow == 0 or table.time(b.start, b.stop, b.tp, b.count + 1) >= b.time_s:
                continue
            budget = int(gpus) + b.tp
            filled = GlobalPlanner._fill_spares(table, buckets, budget)
            assert max(x.time_s for x in filled) < b.time_s, seed
            assert sum(x.tp * x.count for x in filled) <= budget
            for x in filled:
                assert x.time_s == table.time(x.start, x.stop, x.tp, x.count)
            checked += 1
    assert checked >= 10, checked


def test_tree_options_reach_the_training_search() -> None:
    for seed in range(20):
        _, planner, profile = _identical_request_instance(seed, "start-small", 0.0)
        try:
            free = planner.plan(profile)
        except SpecError:
            continue
        if free.train.micro_batch == 1:
            continue
        planner = GlobalPlanner(
            cluster=planner.cluster,
            model=planner.model,
            rl=planner.rl,
            coeffs=planner.cost_model.coeffs,
            options=attrs.evolve(planner.options, tree=TreeOptions(micro_batches=(1,), allow_recompute=False)),
        )
        plan = planner.plan(profile)
        assert plan.train.micro_batch == 1 and not plan.train.recompute
        assert plan.makespan_s >= free.makespan_s
        return
    pytest.fail("no instance trained with micro-batches above 1")


def test_no_plan_errors_name_the_cause() -> None:
    cm, planner, profile = _identical_request_instance(1, "start-small", 0.0)
    planner.plan(profile)
    with pytest.raises(SpecError, match=f"num_gpus must be between 2 and {cm.cluster.num_gpus}, got 1"):
        planner.plan(profile, num_gpus=1)
    # no rollout instance holds the longest request
    long = attrs.evolve(profile, total_lengths=tuple(t * 1e4 for t in profile.total_lengths))
    with pytest.raises(PlanningError, match=r"no rollout instance of TP 1/2 has a KV cache that holds \d+ tokens"):
        planner.plan(long, tp_degrees=(1, 2))


def test_training_alone_needing_every_gpu_is_blamed() -> None:
    """When training needs every GPU of the budget, the error says so rather than blaming the rollout."""
    found = 0
    for seed in range(40):
        cm, planner, profile = _identical_request_instance(seed, "start-small", 0.0)
        train_min = int(np.argmax(np.isfinite(planner.tables(profile).train_runmin)))
        if 2 <= train_min <= cm.cluster.num_gpus and np.isfinite(planner.tables(profile).train_runmin).any():
            with pytest.raises(PlanningError, match=f"training alone needs {train_min} of them"):
                planner.plan(profile, num_gpus=train_min)
            found += 1
    assert found >= 3, found


def test_rollout_degrees_must_divide_the_heads_when_asked_for() -> None:
    cm, planner, profile = _identical_request_instance(2, "start-small", 0.0)
    model = ModelSpec(
        name="four-heads",
        num_layers=4,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
        ffn_hidden_size=1024,
        vocab_size=8000,
    )
    cluster = attrs.evolve(cm.cluster, gpus_per_node=8)
    planner = GlobalPlanner(cluster=cluster, model=model, rl=planner.rl)
    with pytest.raises(SpecError, match=r"rollout TP degree\(s\) \[8\] must divide the 4 attention heads"):
        planner.tables(profile, tp_degrees=(1, 8))
    assert planner.tables(profile).rollout.tp_degrees == (1, 2, 4)  # the defaults it cannot use are left out


def test_a_plan_reports_its_solve_time() -> None:
    _, planner, profile = _identical_request_instance(1, "start-small", 0.0)
    plan = planner.plan(profile)
    assert isinstance(plan.solve_time_s, float) and 0.0 < plan.solve_time_s < math.inf


def test_batch_stats_are_each_profiles_own_when_asked_again():
    cm, _ = sized_cost_model(7, max_gpus=12)
    planner = GlobalPlanner(cluster=cm.cluster, model=cm.model, rl=RLSettings(num_prompts=4), coeffs=cm.coeffs)
    short = WorkloadProfile.build(name="s", shapes=[(1000.0, 500.0, 1.0)] * 4)
    long = WorkloadProfile.build(name="l", shapes=[(3000.0, 2000.0, 2.0)] * 4)
    first = planner.batch_stats(short)
    assert planner.batch_stats(short) is first  # asked again: the same value, not made again
    assert planner.batch_stats(long).mean_len == 3000.0
    assert planner.batch_stats(short) == first and first.mean_len == 1000.0
