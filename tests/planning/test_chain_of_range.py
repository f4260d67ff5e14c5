"""A bucket's chain of turns is the longest of three requests' own (`RolloutCost.chain_of`): the range's longest
decoder, whichever group of the range holds it (MedAgentBench gpt4o-mini: the request decoding 380 tokens over 4
turns sat in an earlier group than the last one, whose longest decoder decoded 123), the range's request longest in
tool calls, and the last group's longest decoder, the request longest in total (few tokens may come with very long
tool calls: `tests/cli/test_unusual_traces.py::test_plan[latency_max]`, where a chain of the first two alone let the
plan fall below `RolloutTable.chain_bound_s`). Groups are sorted by total length, prompt and tool returns included,
so a request of a short total may decode the most. The rollout DP, `GlobalPlanner.rollout_time` on the raw
requests and the oracle's `bucket_time` must agree on it."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner
from libra.planning.oracle import bucket_time
from libra.planning.rollout_dp import ROUTINGS, RolloutTable, _first_max
from libra.spec import InstanceGroup, LengthGroup, WorkloadProfile
from tests.planning.chains import one_request_a_group
from tests.planning.instances import sized_cost_model, skewed_groups, with_tool_tails

# (total, decoded, turns, tool seconds), one request a group: the first decodes the most over the most turns; the
# last, longest in total, decodes little; the third is the longest in tool calls, so the tool tail does not hide
# the longest decoder's chain
SHAPES = [
    (3000.0, 1500.0, 4.0, 10.0),
    (4000.0, 200.0, 2.0, 1.0),
    (5000.0, 150.0, 2.0, 12.0),
    (6000.0, 100.0, 2.0, 3.0),
]
# the latency_max shape: the last request decodes a little less than the first but waits far longer on its tools,
# and the second, a hair longer in tool calls, decodes little: the last one's chain is the longest of the three
LONG_LAST = [
    (3000.0, 1500.0, 4.0, 30.0),
    (4000.0, 200.0, 2.0, 61.0),
    (5000.0, 150.0, 2.0, 12.0),
    (6000.0, 1400.0, 2.0, 60.0),
]


def _planner(routing: str = "start-small", shapes: list = SHAPES) -> GlobalPlanner:
    return one_request_a_group(len(shapes), routing)


def _profile(tools_known: bool, shapes: list = SHAPES) -> WorkloadProfile:
    shapes = shapes if tools_known else [s[:3] for s in shapes]
    return WorkloadProfile.build(name="chain", shapes=shapes, mean_tool_time_s=3.0)


def _own_chains(rc, groups: tuple[LengthGroup, ...], start: int, stop: int, tp: int, tool_latency_s: float) -> float:
    """The longest of the range's candidate requests' own chains at the step of a batch of one at an empty context,
    which the bucket takes at least: with tool seconds known, the range's longest decoder (the first of ties), its
    request longest in tool calls and its last group's longest decoder; else any group's longest decoder at its
    group's most turns (the chain then takes the range's most of each)."""
    step = float(rc.decode_step_time(tp, 1.0, 0.0))
    span = groups[start:stop]
    if any(g.max_gen_tool_s is None or g.max_tool_s is None for g in groups):
        return max(g.tail_gen * step + g.tail_turns * tool_latency_s for g in span)
    longest = max(span, key=lambda g: g.tail_gen)
    most = max(span, key=lambda g: g.max_tool_s or 0.0)
    last = span[-1]
    return max(
        longest.tail_gen * step + (longest.max_gen_tool_s or 0.0),
        most.max_tool_gen * step + (most.max_tool_s or 0.0),
        last.tail_gen * step + (last.max_gen_tool_s or 0.0),
    )


@pytest.mark.parametrize("tools_known", [True, False])
def test_one_bucket_lives_through_its_longest_decoder_in_an_earlier_group(tools_known: bool) -> None:
    """One bucket of every request: the DP's time is the raw requests' (one request a group, so nothing is lost
    to grouping), and at least the longest decoder's own chain at a batch of one's pace."""
    planner, profile = _planner(), _profile(tools_known)
    table = planner.tables(profile).rollout
    assert table.groups[0].max_gen == 1500.0 and table.groups[-1].max_gen == 100.0
    rc = planner.cost_model.rollout
    tools = 10.0 if tools_known else 4 * 3.0
    for tp in (1, 2):
        chain = 1500.0 * float(rc.decode_step_time(tp, 1.0, 0.0)) + tools
        for count in range(1, len(SHAPES) + 1):
            raw = planner.rollout_time((InstanceGroup(tp=tp, count=count, max_tokens=math.inf),), profile)
            got = table.time(0, len(SHAPES), tp, count)
            assert got == pytest.approx(raw, rel=1e-9), (tp, count)
            assert got >= chain, (tp, count)


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("tools_known", [True, False])
@pytest.mark.parametrize("shapes", [SHAPES, LONG_LAST], ids=["longest-decoder-first", "long-tools-last"])
def test_the_table_and_the_oracle_agree_on_every_range(routing: str, tools_known: bool, shapes: list) -> None:
    """Every range of both shapes: the DP's time is the oracle's, and each range takes at least its candidate
    requests' longest own chain at a batch of one (the oracle alone could share the DP's mistake)."""
    planner, profile = _planner(routing, shapes), _profile(tools_known, shapes)
    table = planner.tables(profile).rollout
    cm, q = planner.cost_model, len(shapes)
    for start in range(q):
        for stop in range(start + 1, q + 1):
            for tp in (1, 2):
                own = _own_chains(cm.rollout, table.groups, start, stop, tp, profile.mean_tool_time_s)
                for count in range(1, q + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, table.groups, start, stop, tp, count, profile.mean_tool_time_s, routing)
                    assert got == pytest.approx(direct, rel=1e-9), (start, stop, tp, count)
                    assert got >= own or got == math.inf, (start, stop, tp, count)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_last_requests_long_tool_calls_keep_the_plan_above_the_chain_bound(routing: str) -> None:
    """The latency_max shape: the last group's longest decoder, with its long tool calls, has the longest chain of
    the step; every plan and every table entry of a range holding it stays at or above `chain_bound_s`, which prices
    that request, and the plan's time is what its instances take on the raw requests."""
    planner, profile = _planner(routing, LONG_LAST), _profile(True, LONG_LAST)
    table = planner.tables(profile).rollout
    bound = table.chain_bound_s()
    step = min(float(planner.cost_model.rollout.decode_step_time(tp, 1.0, 0.0)) for tp in (1, 2))
    assert bound == pytest.approx(1400.0 * step + 60.0, rel=1e-12)  # the last request's own chain sets the bound
    assert bound > max(1500.0 * step + 30.0, 200.0 * step + 61.0)
    plan = planner.plan(profile)
    assert plan.rollout.time_s >= bound and plan.makespan_s >= plan.lower_bound_s
    assert plan.rollout.time_s == pytest.approx(planner.rollout_time(plan.rollout.instances, profile), rel=1e-9)
    q = len(LONG_LAST)
    for start in range(q):
        for tp in (1, 2):
            for count in range(1, q + 1):
                assert table.time(start, q, tp, count) >= bound, (start, tp, count)


@pytest.mark.parametrize("tools_known", [True, False])
def test_the_plan_predicts_what_its_instances_take_on_the_raw_requests(tools_known: bool) -> None:
    planner, profile = _planner(), _profile(tools_known)
    plan = planner.plan(profile)
    raw = planner.rollout_time(plan.rollout.instances, profile)
    assert plan.rollout.time_s == pytest.approx(raw, rel=1e-9)
    assert np.isfinite(raw)


def test_the_range_maximum_is_the_first_of_ties() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        values = rng.integers(0, 4, size=int(rng.integers(1, 9))).astype(float)  # many ties
        at = _first_max(values)
        for s in range(len(values)):
            for e in range(s, len(values)):
                assert at[s, e] == s + int(np.argmax(values[s : e + 1])), (values, s, e)


@pytest.mark.parametrize("seed", range(12))
def test_random_groups_whose_longest_decoders_fall_anywhere(seed: int) -> None:
    """Skewed groups with each group's most decoded tokens and turns drawn in no order of length (and, for half of
    them, tool seconds): every table entry is the oracle's, and at least its candidates' longest own chain."""
    cm, rng = sized_cost_model(seed, max_gpus=8)
    groups = skewed_groups(rng, max_groups=5, longest=cm.rollout.kv_capacity_tokens(1) * 2.0)
    shortest = groups[0].max_total
    groups = tuple(
        attrs.evolve(g, max_gen=float(rng.uniform(0.1, 1.0) * shortest), max_turns=float(rng.integers(1, 6)))
        for g in groups
    )
    if seed % 2:
        groups = with_tool_tails(groups, np.random.default_rng([seed, 5]))
    routing = ROUTINGS[seed % 4 // 2]
    tps = tuple(tp for tp in (1, 2, 4) if tp <= cm.cluster.gpus_per_node)
    gpus = cm.cluster.num_gpus
    table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=gpus, tool_latency_s=2.0, routing=routing)
    checked = 0
    for start in range(len(groups)):
        for stop in range(start + 1, len(groups) + 1):
            for tp in table.tp_degrees:
                own = _own_chains(cm.rollout, groups, start, stop, tp, 2.0)
                for count in range(1, gpus // tp + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, groups, start, stop, tp, count, 2.0, routing)
                    assert got == pytest.approx(direct, rel=1e-9) or got == direct == math.inf
                    assert got >= own * (1 - 1e-12) or got == math.inf, (start, stop, tp, count)
                    checked += math.isfinite(got)
    assert checked
