"""A length group's chain points (`LengthGroup.chain_points`, `chain_hull`): the requests whose own chain of turns,
tokens at a pace plus tool seconds, is the group's longest at some pace. The rollout DP, the oracle and the chain
bound look for a bucket's longest chain among them; before, among each group's longest decoder and its request
longest in tool calls only, and a request second in both, in the middle of a group, could outlast the two (on the
real sources by up to 71 s: docs/sim.md)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.oracle import bucket_time
from libra.spec import InstanceGroup, RLSettings, WorkloadProfile, get_model
from libra.spec.profile import chain_hull
from tests.planning.chains import CLUSTER

sizes = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(sizes, sizes), min_size=1, max_size=30), st.lists(st.floats(0.0, 1e3), max_size=8))
def test_at_every_pace_the_hull_holds_the_longest_chain(requests, paces) -> None:
    """The longest chain of the hull's requests is the longest of all, at pace 0, at any pace and far out; the hull's
    requests are some of the given ones, in order of more tokens and fewer tool seconds."""
    gen, tool_s = [g for g, _ in requests], [t for _, t in requests]
    hull = chain_hull(gen, tool_s)
    assert set(hull) <= set(zip(gen, tool_s))
    assert all(a[0] < b[0] and a[1] > b[1] for a, b in zip(hull, hull[1:]))
    for pace in [0.0, 1e-3, 1.0, 1e6, *paces]:
        assert max(g * pace + t for g, t in hull) == pytest.approx(max(g * pace + t for g, t in requests), rel=1e-12)


def test_the_hull_keeps_a_request_second_in_tokens_and_in_tool_seconds() -> None:
    """The shape the two representatives miss: the longest decoder (300 tokens, 1 s), the request longest in tool
    calls (10 tokens, 10 s) and one second in both (200 tokens, 9 s), whose chain is the longest between paces of
    about 0.01 and 0.08 s a token; a request under the hull (100 tokens, 2 s) is left out."""
    assert chain_hull([300.0, 10.0, 200.0, 100.0], [1.0, 10.0, 9.0, 2.0]) == ((10.0, 10.0), (200.0, 9.0), (300.0, 1.0))


# one length group of four requests (total, decoded, turns, tool seconds): the longest decoder, the request longest
# in tool calls, one second in both and one under the hull
SHAPES = [(3000.0, 300.0, 2.0, 1.0), (3100.0, 10.0, 2.0, 10.0), (3200.0, 200.0, 3.0, 9.0), (3300.0, 100.0, 2.0, 2.0)]


def _planner() -> GlobalPlanner:
    return GlobalPlanner(
        cluster=CLUSTER,
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=len(SHAPES), samples_per_prompt=1),
        options=PlannerOptions(num_groups=1, tp_degrees=(1, 2)),
    )


def test_a_bucket_lives_through_the_chain_of_a_request_inside_its_group() -> None:
    """One group, one bucket: its time is at least the middle request's own chain at a batch of one's pace (which
    neither representative reaches), as is the raw requests' (`rollout_time`), and it equals the oracle's."""
    planner = _planner()
    profile = WorkloadProfile.build(name="hull", shapes=SHAPES, mean_tool_time_s=3.0)
    table = planner.tables(profile).rollout
    (group,) = table.groups
    assert group.chain_points == ((10.0, 10.0), (200.0, 9.0), (300.0, 1.0))
    rc = planner.cost_model.rollout
    for tp in (1, 2):
        step = float(rc.decode_step_time(tp, 1.0, 0.0))
        middle = 200.0 * step + 9.0
        assert middle > max(300.0 * step + 1.0, 10.0 * step + 10.0) + 1.0  # the case the two representatives miss
        for count in (1, 2, 4):
            got = table.time(0, 1, tp, count)
            raw = planner.rollout_time((InstanceGroup(tp=tp, count=count, max_tokens=math.inf),), profile)
            direct = bucket_time(planner.cost_model, table.groups, 0, 1, tp, count, 3.0)
            assert got >= middle and raw >= middle, (tp, count)
            assert got == pytest.approx(direct, rel=1e-9), (tp, count)
            assert got == pytest.approx(raw, rel=1e-3), (tp, count)  # (the raw requests' third candidate is the
            # request longest in total, the DP's the last group's longest decoder: one request a group, the same)


def test_the_chain_bound_holds_the_middle_request() -> None:
    """The chain bound (no plan is faster) counts the middle request's chain too, at the fastest degree's step."""
    planner = _planner()
    profile = WorkloadProfile.build(name="hull", shapes=SHAPES, mean_tool_time_s=3.0)
    table = planner.tables(profile).rollout
    rc = planner.cost_model.rollout
    step = min(float(rc.decode_step_time(tp, 1.0, 0.0)) for tp in table.tp_degrees)
    assert table.chain_bound_s() == pytest.approx(max(200.0 * step + 9.0, 300.0 * step + 1.0, 10.0 * step + 10.0))
    assert table.chain_bound_s() == pytest.approx(200.0 * step + 9.0)
