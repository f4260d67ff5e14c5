"""A bucket's chain of turns is its range's longest decoder's, whichever group of the range holds it (issue h9,
MedAgentBench gpt4o-mini: the request decoding 380 tokens over 4 turns sat in an earlier group than the last one,
whose longest decoder decoded 123). Groups are sorted by total length, prompt and tool returns included, so a
request of a short total may decode the most. The rollout DP, `GlobalPlanner.rollout_time` on the raw requests and
the oracle's `bucket_time` must agree on it."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.oracle import bucket_time
from libra.planning.rollout_dp import ROUTINGS, RolloutTable, _first_max
from libra.spec import ClusterSpec, InstanceGroup, RLSettings, WorkloadProfile, get_gpu, get_model
from tests.planning.instances import sized_cost_model, skewed_groups, with_tool_tails

CLUSTER = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
# (total, decoded, turns, tool seconds), one request a group: the first decodes the most over the most turns; the
# last, longest in total, decodes little; the third is the longest in tool calls, so the tool tail does not hide
# the longest decoder's chain
SHAPES = [
    (3000.0, 1500.0, 4.0, 10.0),
    (4000.0, 200.0, 2.0, 1.0),
    (5000.0, 150.0, 2.0, 12.0),
    (6000.0, 100.0, 2.0, 3.0),
]


def _planner(routing: str = "start-small") -> GlobalPlanner:
    return GlobalPlanner(
        cluster=CLUSTER,
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=len(SHAPES), samples_per_prompt=1),
        options=PlannerOptions(routing=routing, num_groups=len(SHAPES), tp_degrees=(1, 2)),
    )


def _profile(tools_known: bool) -> WorkloadProfile:
    shapes = SHAPES if tools_known else [s[:3] for s in SHAPES]
    return WorkloadProfile.build(name="chain", shapes=shapes, mean_tool_time_s=3.0)


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
def test_the_table_and_the_oracle_agree_on_every_range(routing: str, tools_known: bool) -> None:
    planner, profile = _planner(routing), _profile(tools_known)
    table = planner.tables(profile).rollout
    cm, q = planner.cost_model, len(SHAPES)
    for start in range(q):
        for stop in range(start + 1, q + 1):
            for tp in (1, 2):
                for count in range(1, q + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, table.groups, start, stop, tp, count, profile.mean_tool_time_s, routing)
                    assert got == pytest.approx(direct, rel=1e-9), (start, stop, tp, count)


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
    them, tool seconds): every table entry is the oracle's."""
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
                for count in range(1, gpus // tp + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, groups, start, stop, tp, count, 2.0, routing)
                    assert got == pytest.approx(direct, rel=1e-9) or got == direct == math.inf
                    checked += math.isfinite(got)
    assert checked
