"""Global-planner properties found by the whole-file mutation run of `libra/planning/planner.py` (docs/testing.md,
"Mutation testing"): a bucket whose ending requests have no tail is charged none, the profile is a sample of the
batch (only its shape counts), a bucket no request reaches changes nothing under final-length routing, training that
no longer fits memory scores infinite, and `replan` keeps the current plan's GPU count."""

from __future__ import annotations

import itertools
import math
import time

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.planner import PlanningError
from libra.planning.rollout_dp import BucketChoice
from libra.spec import ModelSpec, RLSettings, SpecError, WorkloadProfile
from tests.planning.instances import sized_cost_model, skewed_groups

TPS = (1, 2, 4, 8)
PER_GROUP = 4


def _prompt_only_first_groups(
    seed: int, routing: str, tool_s: float, prompt_only: bool = True, delay: float = 0.5, **coeffs
):
    """A planner and a profile whose length groups each hold `PER_GROUP` identical requests, the shorter groups
    prompt-only (no decoded token, no turn: a request that ends with its prompt), the longer ones decoding with
    turns that grow with length (so the DP's group means are the requests themselves and a bucket's longest
    chain is its last group's). `delay`: the admission delay; `coeffs`: cost coefficients to change."""
    cm, rng = sized_cost_model(31_000 + seed, max_gpus=12)
    groups = skewed_groups(rng, max_groups=4, longest=cm.rollout.kv_capacity_tokens(1) * float(rng.uniform(0.5, 2.0)))
    silent = int(rng.integers(1, len(groups))) if len(groups) > 1 and prompt_only else 0
    turns = np.maximum.accumulate([g.mean_turns for g in groups])
    gens = np.maximum.accumulate([g.max_total * g.mean_gen / g.mean_total for g in groups])
    shapes = [
        (g.max_total, 0.0 if k < silent else float(gen), 0.0 if k < silent else float(t))
        for k, (g, gen, t) in enumerate(zip(groups, gens, turns, strict=True))
    ]
    profile = WorkloadProfile.build(name="prompt-only", shapes=shapes * PER_GROUP, mean_tool_time_s=tool_s)
    tps = tuple(tp for tp in TPS if tp <= cm.cluster.gpus_per_node)
    planner = GlobalPlanner(
        cluster=cm.cluster,
        model=cm.model,
        rl=RLSettings(num_prompts=len(shapes), samples_per_prompt=PER_GROUP),
        coeffs=cm.coeffs.replace(**coeffs),
        options=PlannerOptions(tp_degrees=tps, num_groups=len(shapes), routing=routing, admission_delay=delay),
    )
    return planner, profile, silent


def _requests_of(profile: WorkloadProfile, lo: int, hi: int) -> WorkloadProfile:
    """The requests lo..hi-1 of a profile (sorted by length), with its tool latency."""
    return WorkloadProfile(
        name=f"{profile.name}[{lo}:{hi}]",
        total_lengths=profile.total_lengths[lo:hi],
        gen_tokens=profile.gen_tokens[lo:hi],
        turns=profile.turns[lo:hi],
        mean_tool_time_s=profile.mean_tool_time_s,
    )


def _with_batch(planner: GlobalPlanner, requests: int) -> GlobalPlanner:
    """The same planner with a global batch of `requests` (one prompt per request)."""
    return GlobalPlanner(
        cluster=planner.cluster,
        model=planner.model,
        rl=RLSettings(num_prompts=requests, samples_per_prompt=1),
        coeffs=planner.cost_model.coeffs,
        options=planner.options,
    )


def test_a_bucket_whose_requests_decode_nothing_has_no_tail() -> None:
    """A bucket in which only prompt-only requests end (no decoded token, no tool turn) has no tail chain: its
    longest chain is 0 tokens and 0 turns, not one of each. Under final-length routing each bucket serves only the
    requests that end in it, so scoring a bucket plan of the DP's table on the requests of one bucket alone (a
    planner whose global batch is their number) gives that bucket's own time; with identical requests per length
    group, `rollout_time` on raw requests is the DP's model, so it must be the table's time, for the prompt-only
    first bucket as for every other."""
    checked = 0
    for seed in range(20):
        planner, profile, silent = _prompt_only_first_groups(seed, "final-length", (0.0, 2.0, 40.0)[seed % 3])
        if silent == 0:
            continue
        try:
            table = planner.tables(profile).rollout
        except SpecError:
            continue
        for limit in table.candidates(0.0, math.inf)[::3]:
            gpus, buckets = table.min_gpus(float(limit))
            if not math.isfinite(gpus) or buckets[0].stop > silent:
                continue
            instances = table.instance_groups(buckets)
            for b in buckets:
                part = _requests_of(profile, b.start * PER_GROUP, b.stop * PER_GROUP)
                alone = _with_batch(planner, part.num_samples)
                assert alone.rollout_time(instances, part) == pytest.approx(b.time_s, rel=1e-9), (seed, limit, b)
            checked += 1
    assert checked >= 15, checked


def _plans(routing: str, seeds: range = range(20)):
    """(planner, profile, plan) of the instances that have a plan, requests decoding as usual."""
    for seed in seeds:
        planner, profile, _ = _prompt_only_first_groups(seed, routing, (0.0, 2.0, 40.0)[seed % 3], prompt_only=False)
        try:
            yield planner, profile, planner.plan(profile)
        except SpecError:
            continue


def test_the_profile_is_a_sample_of_the_batch() -> None:
    """The profile's requests stand for the global batch: every request repeated twice is the same workload, so
    every plan of the table scores the same (the per-instance requests, decoded and prefilled tokens are scaled
    by batch / samples, not divided by it)."""
    checked = 0
    for routing in ("start-small", "final-length"):
        for planner, profile, plan in _plans(routing, range(8)):
            twice = WorkloadProfile.build(
                name="twice",
                shapes=list(zip(profile.total_lengths, profile.gen_tokens, profile.turns, strict=True)) * 2,
                mean_tool_time_s=profile.mean_tool_time_s,
            )
            got = planner.rollout_time(plan.rollout.instances, twice)
            assert got == pytest.approx(planner.rollout_time(plan.rollout.instances, profile), rel=1e-12)
            assert got == pytest.approx(plan.rollout.time_s, rel=1e-9)
            checked += 1
    assert checked >= 8, checked


def test_under_final_length_a_bucket_no_request_ends_in_changes_nothing() -> None:
    """Under final-length routing a bucket serves only the requests that end in it, so a plan scored on requests
    that all outgrew its first bucket takes as long as its other buckets alone (the empty bucket is skipped and
    the ones after it are still scored)."""
    checked = 0
    for planner, profile, plan in _plans("final-length"):
        instances = plan.rollout.instances
        if len(instances) < 2:
            continue
        first = instances[0].max_tokens
        longer = [k for k, t in enumerate(profile.total_lengths) if t > first]
        part = _requests_of(profile, longer[0], len(profile.total_lengths))
        alone = _with_batch(planner, part.num_samples)
        got = alone.rollout_time(instances, part)
        assert 0.0 < got < math.inf
        assert got == alone.rollout_time(instances[1:], part)
        checked += 1
    assert checked >= 5, checked


def test_training_that_no_longer_fits_memory_scores_infinite() -> None:
    """`evaluate` of a plan on a workload whose sequences no longer fit its training layout's memory: the
    training time is infinite (a float), not a missing value."""
    found = 0
    for planner, profile, plan in _plans("start-small"):
        longer = WorkloadProfile.build(
            name="longer",
            shapes=[(t * 64, g * 64, 1.0) for t, g in zip(profile.total_lengths, profile.gen_tokens, strict=True)],
        )
        batch = planner.batch_stats(longer)
        tr, training = plan.train, planner.cost_model.training
        if training.fits(training.memory_bytes(tr.tp, tr.pp, tr.dp, tr.ep, tr.micro_batch, tr.recompute, batch)):
            continue
        train_s, _ = planner.evaluate(plan, longer)
        assert train_s == math.inf
        found += 1
    assert found >= 3, found


def test_replan_keeps_the_gpu_count_and_looks_ten_steps_ahead() -> None:
    """`replan` plans the candidate on the current plan's GPUs (not the whole cluster), and by default weighs the
    per-step gain over 10 steps (the runtime's default horizon)."""
    checked = 0
    for planner, profile, _ in _plans("start-small"):
        total = planner.cluster.num_gpus
        if total < 4:
            continue
        try:
            current = planner.plan(profile, num_gpus=total - 1)
        except SpecError:
            continue
        drifted = WorkloadProfile.build(
            name="drifted",
            shapes=[(t * 1.5, g * 1.5, 1.0) for t, g in zip(profile.total_lengths, profile.gen_tokens, strict=True)],
        )
        candidate, decision = planner.replan(current, drifted)
        assert candidate.num_gpus == current.num_gpus == total - 1
        assert decision.saving_s == (decision.current_s - decision.candidate_s) * 10
        checked += 1
    assert checked >= 3, checked


def test_requests_shorter_than_one_token_are_scored_as_the_dp_scores_them() -> None:
    """Token counts are floats (a profile may hold averages): a first length group of half-token requests that
    decode a tenth of a token each is scored by `rollout_time` as the DP scores it, bucket by bucket (under
    final-length routing, as above): its decoded share is 0.2 of its length, not of one token, and its resident
    context is weighted by its 0.4 decoded tokens, not by one (no per-request engine cost here: it would hide the
    decode time of so few tokens)."""
    checked = 0
    for seed in range(20):
        planner, profile, _ = _prompt_only_first_groups(
            seed, "final-length", 0.0, prompt_only=False, per_request_overhead_s=0.0
        )
        shapes = list(zip(profile.total_lengths, profile.gen_tokens, profile.turns, strict=True))
        shapes[:PER_GROUP] = [(0.5, 0.1, 1.0)] * PER_GROUP
        tiny = WorkloadProfile.build(name="tiny", shapes=shapes)
        try:
            table = planner.tables(tiny).rollout
        except SpecError:
            continue
        for limit in table.candidates(0.0, math.inf)[::2]:
            gpus, buckets = table.min_gpus(float(limit))
            if not math.isfinite(gpus) or buckets[0].stop > 1:
                continue
            instances = table.instance_groups(buckets)
            b = buckets[0]
            part = _requests_of(tiny, 0, PER_GROUP)
            alone = _with_batch(planner, part.num_samples)
            assert alone.rollout_time(instances, part) == pytest.approx(b.time_s, rel=1e-9), (seed, limit, b)
            checked += 1
    assert checked >= 12, checked


def test_the_lower_bound_is_both_sides_least_gpu_seconds_over_the_budget() -> None:
    """`fluid_bound_s` is (W_train + W_rollout) / G (the module's definition): W_train the least GPU-seconds of any
    training layout on fewer than G GPUs (each GPU count's best layout from the tree search, not the frontier the
    planner reads), W_rollout the rollout's fluid bound; `lower_bound_s` the larger of it and the chain bound; and
    no plan beats it."""
    checked = 0
    for planner, profile, plan in _plans("start-small", range(10)):
        budget = plan.num_gpus
        tab = planner.tables(profile)
        layouts = [tab.search.best(g) for g in range(1, budget)]
        train = min(c.num_gpus * c.time_s for c in layouts if c is not None)
        expected = (train + tab.rollout.fluid_gpu_seconds()) / budget
        assert plan.fluid_bound_s == pytest.approx(expected, rel=1e-12)
        assert plan.chain_bound_s == tab.rollout.chain_bound_s()
        assert plan.lower_bound_s == max(plan.fluid_bound_s, plan.chain_bound_s)
        assert plan.lower_bound_s <= plan.makespan_s
        checked += 1
    assert checked >= 5, checked


def test_spare_gpus_only_go_where_they_make_a_bucket_faster() -> None:
    """Spare GPUs are handed out one instance at a time, and only to a bucket that the instance makes strictly
    faster. With 40-s tool calls a later bucket's time is often its queued tail, which one more instance does not
    shorten (the same time to the bit): such a bucket gets none. Every two-bucket split of the table, one instance
    per bucket, 8 spare GPUs."""
    flat = 0
    for seed in range(8):
        planner, profile, _ = _prompt_only_first_groups(seed, "start-small", 40.0, prompt_only=False)
        try:
            table = planner.tables(profile).rollout
        except SpecError:
            continue
        for buckets in _two_bucket_splits(table):
            used = sum(b.tp for b in buckets)
            flat += any(table.time(b.start, b.stop, b.tp, 2) == b.time_s for b in buckets)
            filled = GlobalPlanner._fill_spares(table, buckets, used + 8)
            assert sum(x.tp * x.count for x in filled) <= used + 8
            for b, x in zip(buckets, filled, strict=True):
                for count in range(b.count + 1, x.count + 1):
                    assert table.time(x.start, x.stop, x.tp, count) < table.time(x.start, x.stop, x.tp, count - 1)
    assert flat >= 10, flat


def _two_bucket_splits(table):
    """Every split of the table's groups into two buckets, each one instance of each usable TP degree."""
    q = len(table.groups)
    for split in range(1, q):
        for tps in itertools.product(table.tp_degrees, repeat=2):
            ranges = ((0, split), (split, q))
            times = [table.time(a, b, tp, 1) for (a, b), tp in zip(ranges, tps, strict=True)]
            if all(math.isfinite(t) for t in times):
                yield [
                    BucketChoice(start=a, stop=b, tp=tp, count=1, time_s=t)
                    for (a, b), tp, t in zip(ranges, tps, times, strict=True)
                ]


def test_the_admission_delay_reaches_the_rollout_table() -> None:
    """With a non-default admission delay (0.8), every two-bucket plan of the DP's table scored on its own
    workload gets its own times: the table and `rollout_time` both price the queued tail with the planner's delay
    (40-s tool calls, so the tail is what sets the later bucket's time)."""
    checked = 0
    for seed in range(6):
        planner, profile, _ = _prompt_only_first_groups(seed, "start-small", 40.0, prompt_only=False, delay=0.8)
        try:
            table = planner.tables(profile).rollout
        except SpecError:
            continue
        for buckets in _two_bucket_splits(table):
            got = planner.rollout_time(table.instance_groups(buckets), profile)
            assert got == pytest.approx(max(b.time_s for b in buckets), rel=1e-9), (seed, buckets)
            checked += 1
    assert checked >= 10, checked


def test_the_given_cost_coefficients_are_the_ones_used() -> None:
    """The same plan scored by a planner whose per-request engine cost is 10x larger takes longer (the planner
    prices with the coefficients it is given, not the defaults)."""
    planner, profile, plan = next(_plans("start-small"))
    coeffs = planner.cost_model.coeffs
    costly = GlobalPlanner(
        cluster=planner.cluster,
        model=planner.model,
        rl=planner.rl,
        coeffs=coeffs.replace(per_request_overhead_s=10 * coeffs.per_request_overhead_s),
        options=planner.options,
    )
    assert costly.cost_model.coeffs.per_request_overhead_s == 10 * coeffs.per_request_overhead_s > 0
    assert costly.rollout_time(plan.rollout.instances, profile) > planner.rollout_time(plan.rollout.instances, profile)


def test_the_memo_returns_each_profiles_own_tables() -> None:
    """Tables are memoised per (profile, TP degrees): an equal profile (another object) gets the memoised tables,
    a different profile gets its own (the same as a fresh planner's), never another profile's."""
    planner, profile, _ = _prompt_only_first_groups(2, "start-small", 0.0, prompt_only=False)
    other = WorkloadProfile.build(
        name="other",
        shapes=[(t * 1.5, g, 1.0) for t, g in zip(profile.total_lengths, profile.gen_tokens, strict=True)],
    )
    first = planner.tables(profile)
    assert planner.tables(attrs.evolve(profile)) is first  # equal, not identical
    second = planner.tables(other)
    assert second is not first
    assert second.groups == _with_batch(planner, planner.rl.global_batch).tables(other).groups != first.groups
    assert planner.tables(profile) is first


def test_tp_degrees_outside_a_node_or_none_at_all_are_clear_errors() -> None:
    planner, profile, _ = _prompt_only_first_groups(3, "start-small", 0.0, prompt_only=False)
    node = planner.cluster.gpus_per_node
    with pytest.raises(
        SpecError, match=rf"TP degree\(s\) \[{2 * node}\] must be between 1 and the GPUs per node \({node}\)"
    ):
        planner.tables(profile, tp_degrees=(1, 2 * node))
    with pytest.raises(SpecError, match=r"TP degree\(s\) \[0\] must be between 1"):
        planner.tables(profile, tp_degrees=(0, 1))
    for given in ((), (2 * node,)):  # none at all, or none that fits in a node: the error names that cause
        empty = GlobalPlanner(
            cluster=planner.cluster, model=planner.model, rl=planner.rl, options=PlannerOptions(tp_degrees=given)
        )
        with pytest.raises(SpecError, match=rf"no rollout TP degree to plan with: .* a node holds {node} GPUs"):
            empty.tables(profile)


def test_the_solve_time_is_the_time_the_call_took() -> None:
    planner, profile, _ = next(_plans("start-small"))
    before = time.perf_counter()
    plan = planner.plan(profile)
    assert 0.0 < plan.solve_time_s <= time.perf_counter() - before


def test_no_plan_errors_when_training_fits_nowhere_or_both_sides_only_apart() -> None:
    """No layout trains the model at all: the error says so. Training and rollout each fit on the budget but not
    together: the error gives both sides' least GPU counts."""
    apart = 0
    for seed in range(20):
        planner, profile, _ = _prompt_only_first_groups(seed, "start-small", 0.0, prompt_only=False)
        tab = planner.tables(profile)
        finite = np.isfinite(tab.train_runmin)
        if not finite.any():
            continue
        train_min = int(np.argmax(finite))
        rollout_min = tab.rollout.min_gpus(math.inf)[0]
        budget = int(train_min + rollout_min - 1) if math.isfinite(rollout_min) else 0
        if budget <= train_min or budget < 2 or budget > planner.cluster.num_gpus:
            continue
        with pytest.raises(
            PlanningError, match=f"training needs at least {train_min} and rollout at least {rollout_min:.0f} "
        ):
            planner.plan(profile, num_gpus=budget)
        apart += 1
    assert apart >= 3, apart
    huge = ModelSpec(
        name="huge",
        num_layers=4,
        hidden_size=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden_size=65536,
        vocab_size=256_000,
    )
    planner = GlobalPlanner(cluster=planner.cluster, model=huge, rl=planner.rl, coeffs=planner.cost_model.coeffs)
    with pytest.raises(PlanningError, match=r"huge cannot be trained on \d+ .* no layout fits memory"):
        planner.plan(profile)
