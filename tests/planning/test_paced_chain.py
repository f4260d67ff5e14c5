"""A bucket's chain of turns takes a fourth request beside `chain_of`'s three: the one whose own chain (its tokens at
the step time of a batch of one plus its seconds in tool calls) is the longest (`RolloutCost.instance_time`'s
`paced_tail`). A request second both in tokens and in tool seconds can outlast the longest decoder, the request
longest in tool calls and the request longest in total: MedAgentBench gpt4o's step, where a run of 208 tokens and
7.9 s of tool calls ended the simulated step 2-3 s after the planner's chain (242 tokens with 3.6 s, 57 tokens with
7.9 s) ended, docs/sim.md. The rollout DP, `GlobalPlanner.rollout_time` on the raw requests and the oracle's
`bucket_time` must agree on it, and the grid must stay `instance_time` bit for bit."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from libra.planning import GlobalPlanner
from libra.planning.cost.rollout import paced_pick
from libra.planning.oracle import bucket_time
from libra.planning.rollout_dp import ROUTINGS, RolloutTable
from libra.spec import InstanceGroup, LengthGroup, WorkloadProfile
from tests.planning.chains import one_request_a_group
from tests.planning.instances import random_cost_model, sized_cost_model, skewed_groups, with_tool_tails

# (total, decoded, turns, tool seconds), one request a group, MedAgentBench gpt4o's four: the longest decoder, the
# request longest in tool calls, the request second in both (whose chain is the longest at any pace near a batch of
# one's), and the request longest in total
SHAPES = [
    (3500.0, 242.0, 2.0, 3.6),
    (3550.0, 57.0, 2.0, 7.94),
    (4150.0, 208.0, 3.0, 7.93),
    (5000.0, 71.0, 2.0, 3.64),
]


def _planner(routing: str = "start-small") -> GlobalPlanner:
    return one_request_a_group(len(SHAPES), routing)


def _own_chain(groups: tuple[LengthGroup, ...], start: int, stop: int, step: float) -> float:
    """The longest own chain at `step` of any request the range's groups name (each group's longest decoder and its
    request longest in tool calls): a bucket takes at least that long."""
    return max(
        max(g.tail_gen * step + (g.max_gen_tool_s or 0.0), g.max_tool_gen * step + (g.max_tool_s or 0.0))
        for g in groups[start:stop]
    )


def test_the_request_second_in_tokens_and_in_tool_seconds_sets_the_chain() -> None:
    """One bucket of the four: it lives through the third request's chain, which none of `chain_of`'s three
    candidates reaches; the DP, the raw requests and the oracle say the same."""
    planner = _planner()
    profile = WorkloadProfile.build(name="paced", shapes=SHAPES, mean_tool_time_s=3.0)
    table = planner.tables(profile).rollout
    rc = planner.cost_model.rollout
    for tp in (1, 2):
        step = float(rc.decode_step_time(tp, 1.0, 0.0))
        three = max(242.0 * step + 3.6, 57.0 * step + 7.94, 71.0 * step + 3.64)
        own = 208.0 * step + 7.93
        assert own > three + 1.0  # the case: the three candidates fall over a second short of the longest chain
        for count in range(1, len(SHAPES) + 1):
            got = table.time(0, len(SHAPES), tp, count)
            raw = planner.rollout_time((InstanceGroup(tp=tp, count=count, max_tokens=math.inf),), profile)
            direct = bucket_time(planner.cost_model, table.groups, 0, len(SHAPES), tp, count, 3.0)
            assert got >= own, (tp, count)
            assert got == pytest.approx(raw, rel=1e-9) and got == pytest.approx(direct, rel=1e-9), (tp, count)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_every_range_lives_through_its_longest_own_chain(routing: str) -> None:
    planner = _planner(routing)
    profile = WorkloadProfile.build(name="paced", shapes=SHAPES, mean_tool_time_s=3.0)
    table = planner.tables(profile).rollout
    cm, q = planner.cost_model, len(SHAPES)
    for start in range(q):
        for stop in range(start + 1, q + 1):
            for tp in (1, 2):
                own = _own_chain(table.groups, start, stop, float(cm.rollout.decode_step_time(tp, 1.0, 0.0)))
                for count in range(1, q + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, table.groups, start, stop, tp, count, 3.0, routing)
                    assert got == pytest.approx(direct, rel=1e-9), (start, stop, tp, count)
                    assert got >= own, (start, stop, tp, count)


@pytest.mark.parametrize("seed", range(12))
def test_random_groups_live_through_every_named_requests_chain(seed: int) -> None:
    """Skewed groups whose requests' tool seconds are drawn heavy-tailed and in no order of tokens: every table
    entry is the oracle's and at least the longest own chain of any request its groups name."""
    cm, rng = sized_cost_model(seed, max_gpus=8)
    groups = skewed_groups(rng, max_groups=5, longest=cm.rollout.kv_capacity_tokens(1) * 2.0)
    shortest = groups[0].max_total
    groups = tuple(attrs.evolve(g, max_gen=float(rng.uniform(0.1, 1.0) * shortest)) for g in groups)
    groups = with_tool_tails(groups, np.random.default_rng([seed, 7]))
    routing = ROUTINGS[seed % 2]
    tps = tuple(tp for tp in (1, 2, 4) if tp <= cm.cluster.gpus_per_node)
    gpus = cm.cluster.num_gpus
    table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=gpus, tool_latency_s=2.0, routing=routing)
    checked = 0
    for start in range(len(groups)):
        for stop in range(start + 1, len(groups) + 1):
            for tp in table.tp_degrees:
                own = _own_chain(groups, start, stop, float(cm.rollout.decode_step_time(tp, 1.0, 0.0)))
                for count in range(1, gpus // tp + 1):
                    got = table.time(start, stop, tp, count)
                    direct = bucket_time(cm, groups, start, stop, tp, count, 2.0, routing)
                    assert got == pytest.approx(direct, rel=1e-9) or got == direct == math.inf
                    assert got >= own * (1 - 1e-12) or got == math.inf, (start, stop, tp, count)
                    checked += math.isfinite(got)
    assert checked


@pytest.mark.parametrize("seed", range(20))
def test_the_grid_equals_instance_time_with_a_paced_request(seed: int) -> None:
    """Rows where the paced request covers the request longest in tool calls (three chains at the batch's pace) and
    rows where it does not (all four), bit for bit."""
    cm, rng = random_cost_model(seed, memory_gb=(16, 40, 80))
    tp = int(rng.choice([1, 2, 4, 8]))
    rows, width = int(rng.integers(1, 12)), int(rng.integers(1, 9))
    max_gen = rng.uniform(10, 8000, rows)
    most = rng.lognormal(1.0, 1.5, rows)
    per_row = dict(
        num_requests=rng.uniform(1, 300, rows),
        decode_tokens=rng.uniform(1e2, 1e6, rows),
        prefill_tokens=rng.uniform(0, 1e6, rows),
        resident_context=rng.uniform(0.5, 9000, rows),
        max_gen=max_gen,
        max_turns=rng.integers(1, 30, rows).astype(float),
        new_requests=rng.uniform(0, 300, rows),
        queued_share=np.where(rng.random(rows) < 0.5, rng.uniform(0, 0.9, rows), 0.0),
        tool_tail=(rng.uniform(0, 1, rows) * most, rng.uniform(0, 8000, rows), most, max_gen / 2, most / 3),
        paced_tail=(rng.uniform(0, 1, rows) * max_gen, rng.uniform(0, 1.2, rows) * most),
    )
    shares = np.arange(1, width + 1, dtype=float)
    grid = cm.rollout.instance_time_grid(tp, shares, tool_latency_s=0.0, **per_row)
    row, k = np.repeat(np.arange(rows), width), np.tile(shares, rows)
    divided = ("num_requests", "decode_tokens", "prefill_tokens", "new_requests")
    expanded = {n: (v[row] / k if n in divided else v[row]) for n, v in per_row.items() if not n.endswith("_tail")}
    tails = {n: tuple(x[row] for x in per_row[n]) for n in ("tool_tail", "paced_tail")}
    assert np.array_equal(grid.ravel(), cm.rollout.instance_time(tp, tool_latency_s=0.0, **expanded, **tails))


def test_a_paced_request_that_does_not_cover_the_longest_in_tools_is_taken_beside_it() -> None:
    """A paced request that covers the request longest in tool calls (more tokens, a longer chain at a batch of one's
    pace) lengthens the chain in its place; one that decodes fewer tokens but waits longer on its tools is taken
    beside it (neither is dropped); one shorter at every pace changes nothing."""
    rc = _planner().cost_model.rollout
    args = dict(num_requests=4.0, decode_tokens=600.0, prefill_tokens=14000.0, resident_context=4000.0, max_gen=242.0)
    tool_tail = (3.6, 57.0, 7.94, 71.0, 3.64)
    base = float(rc.instance_time(1, **args, tool_tail=tool_tail))
    covering = float(rc.instance_time(1, **args, tool_tail=tool_tail, paced_tail=(208.0, 7.93)))
    beside = float(rc.instance_time(1, **args, tool_tail=tool_tail, paced_tail=(30.0, 9.5)))
    shorter = float(rc.instance_time(1, **args, tool_tail=tool_tail, paced_tail=(10.0, 0.5)))
    assert shorter == base < beside < covering


def test_paced_pick_is_the_longest_own_chain_first_of_ties() -> None:
    gen, tools = np.array([242.0, 57.0, 208.0, 208.0]), np.array([3.6, 7.94, 7.93, 7.93])
    assert paced_pick(gen, tools, 0.02) == 2
    assert paced_pick(gen, tools, 1.0) == 0  # at a slow pace the longest decoder's chain is the longest
    assert paced_pick(gen, tools, 0.0) == 1  # at no pace at all, the request longest in tool calls
    with pytest.raises(ValueError, match="paced_pick needs two equal non-empty 1-D arrays"):
        paced_pick(gen, tools[:2], 0.02)
