"""The mutants of the three-candidate chain that the earlier tests let through (docs/testing.md, "The three-candidate
chain and the borrow rule"): each test names the wrong answer it catches.

A bucket lives through the chain of turns of each of its requests: every request's own tokens at the step time of a
batch of one plus its own seconds in tool calls is a lower bound on the bucket's time, whichever of the candidates
(`libra.planning.cost.rollout.chain_of`) the code picks. The tests assert that bound, and that the planner's
`rollout_time` on the raw requests is the rollout DP's time where the two see the same requests."""

from __future__ import annotations

import math

import attrs
import pytest

from libra.planning import GlobalPlanner
from libra.planning.oracle import bucket_time
from libra.planning.rollout_dp import RolloutTable
from libra.spec import InstanceGroup, LengthGroup, WorkloadProfile
from tests.planning.chains import one_request_a_group as _planner
from tests.planning.chains import shaped_profile


def _one(tp: int) -> InstanceGroup:
    """One instance of degree `tp` taking every request."""
    return InstanceGroup(tp=tp, count=1, max_tokens=math.inf)


def _profile(shapes: list[tuple[float, float, float, float]]) -> WorkloadProfile:
    return shaped_profile(shapes, "chain-mutants")


def _own_chain(planner: GlobalPlanner, gen: float, tool_s: float, tp: int = 1) -> float:
    """A request's own chain at the step time of a batch of one at an empty context: no bucket holding it is faster."""
    return gen * float(planner.cost_model.rollout.decode_step_time(tp, 1.0, 0.0)) + tool_s


# (total, decoded, turns, tool seconds), sorted by total: the longest decoder is neither the first request nor the
# longest in tool calls, and the first request spends no time in tool calls
LONGEST_DECODER_INSIDE = [
    (2000.0, 10.0, 1.0, 0.0),
    (4000.0, 3000.0, 4.0, 30.0),
    (5000.0, 10.0, 2.0, 35.0),
    (6000.0, 10.0, 1.0, 0.0),
]
# the last request (longest in total) decodes a little and waits long on its tools; the second, a second longer in
# tool calls, decodes little: the last one's chain is the longest of the step
LONG_TOOLS_LAST = [
    (3000.0, 1500.0, 4.0, 30.0),
    (4000.0, 200.0, 2.0, 61.0),
    (5000.0, 150.0, 2.0, 12.0),
    (6000.0, 1400.0, 2.0, 60.0),
]


def test_the_longest_decoder_is_charged_its_own_tool_seconds() -> None:
    """Caught: `cost.rollout.tool_tail_of` (`planner._tool_tail` before it moved) taking the tool seconds of the
    first request (`np.argmax(None)` is 0) for the longest decoder's (0 s here: its chain lost its 30 s of tool
    calls)."""
    planner, profile = _planner(4), _profile(LONGEST_DECODER_INSIDE)
    assert planner.rollout_time((_one(1),), profile) >= _own_chain(planner, 3000.0, 30.0)


@pytest.mark.parametrize("routing", ["start-small", "final-length"])
def test_the_last_requests_chain_is_its_own_tokens_and_tool_seconds(routing: str) -> None:
    """Caught: `tool_tail_of` reading the last request's tokens or tool seconds at another index (`gen[+1]`,
    `gen[-2]`, `tool_s[+1]`, `tool_s[-2]`): one bucket of every request takes at least the last one's own chain, and
    exactly what the rollout DP prices for the same requests (one request a group, so nothing is lost to grouping)."""
    planner, profile = _planner(4, routing), _profile(LONG_TOOLS_LAST)
    table = planner.tables(profile).rollout
    for tp in (1, 2):
        assert planner.rollout_time((_one(tp),), profile) >= _own_chain(planner, 1400.0, 60.0, tp)
        for count in (1, 2, 4):
            group = InstanceGroup(tp=tp, count=count, max_tokens=math.inf)
            assert planner.rollout_time((group,), profile) == pytest.approx(table.time(0, 4, tp, count), rel=1e-9)


def test_a_bucket_where_no_request_ends_has_no_chain() -> None:
    """Caught: `tool_tail_of` of a bucket where no request ends (start-small: every request passes through the
    small bucket) giving a request 1 s of tool calls, or 1 token: that bucket, which decodes a fraction of a token
    per request, then took a tail of its own (1.0 s more at a 1 s call, 6 ms at a token). With every tool call known
    to take 0 s the time is the one priced without tool seconds (the chain is the longest decoder's tokens either
    way), to the bit."""
    shapes = [(150.0, 1.0, 1.0, 0.0)] * 6
    planner = _planner(len(shapes))
    known = _profile(shapes)
    unknown = WorkloadProfile.build(name="no-tools", shapes=[s[:3] for s in shapes], mean_tool_time_s=0.0)
    small = InstanceGroup(tp=1, count=1, max_tokens=100.0)
    for count in (1, len(shapes)):
        instances = (attrs.evolve(small, count=count), InstanceGroup(tp=1, count=count, max_tokens=math.inf))
        assert planner.rollout_time(instances, known) == planner.rollout_time(instances, unknown)


def _group(
    max_total: float, max_gen: float, gen_tools: float, most_tool_s: float, most_tool_gen: float, count: int = 2
) -> LengthGroup:
    return LengthGroup(
        count=count,
        mean_total=max_total * 0.9,
        mean_gen=max_gen / 2.0,
        max_total=max_total,
        mean_turns=2.0,
        max_gen=max_gen,
        max_turns=2.0,
        max_tool_s=most_tool_s,
        max_tool_gen=most_tool_gen,
        max_gen_tool_s=gen_tools,
    )


def test_tied_longest_decoders_are_charged_the_first_ones_chain() -> None:
    """Caught: `rollout_dp._first_max` keeping the last of ties (`>=`): two groups' longest decoders decode 1,000
    tokens each, the first with 40 s of tool calls, the second with 1 s; each group's request longest in tool calls
    decodes little. A bucket holding both takes at least the first's own chain (it took about 50 s of tool calls
    and 10 tokens: the second's chain and the 50 s request's)."""
    planner = _planner(6)
    groups = (
        _group(3000.0, 1000.0, gen_tools=40.0, most_tool_s=50.0, most_tool_gen=10.0),
        _group(4000.0, 1000.0, gen_tools=1.0, most_tool_s=2.0, most_tool_gen=1000.0),
        _group(5000.0, 100.0, gen_tools=1.0, most_tool_s=1.0, most_tool_gen=100.0),
    )
    table = RolloutTable(
        planner.cost_model.rollout, groups, tp_degrees=(1, 2), max_gpus=8, tool_latency_s=3.0, routing="start-small"
    )
    for tp in (1, 2):
        for stop in (2, 3):
            for count in (1, 2):
                assert table.time(0, stop, tp, count) >= _own_chain(planner, 1000.0, 40.0, tp), (stop, tp, count)


# (total, decoded, turns, tool seconds) among 60 short requests (10 tokens, no tool calls): at a batch of one the
# request longest in tool calls (10 tokens, 100 s) has the longest own chain (`paced_tail`: about 100 s against
# 88 s), at the batch's pace (about 1.8 times slower a token here) the longest decoder (3,000 tokens, 30 s) or the
# last request (1,400 tokens, 60 s) does
DECODER_AT_THE_BATCHS_PACE = [(4000.0, 3000.0, 4.0, 30.0), (5000.0, 10.0, 2.0, 100.0), (6000.0, 10.0, 1.0, 0.0)]
LAST_AT_THE_BATCHS_PACE = [(3000.0, 1500.0, 4.0, 30.0), (4000.0, 10.0, 2.0, 100.0), (6000.0, 1400.0, 2.0, 60.0)]


@pytest.mark.parametrize(
    "shapes", [DECODER_AT_THE_BATCHS_PACE, LAST_AT_THE_BATCHS_PACE], ids=["longest-decoder", "last-request"]
)
def test_a_busy_bucket_prices_the_candidates_at_the_batchs_pace(shapes: list) -> None:
    """Caught, where the request of the longest own chain at a batch of one is a fourth candidate (bc68b6d): the
    longest decoder's tool seconds read from the first request, the last request's tokens or tool seconds read at
    another index. That request covers each at a batch of one's pace, not at the batch's, where the bucket's share
    of its chain left after the throughput phase is priced. `rollout_time` on the raw requests is the DP's time for
    them (one request a group)."""
    fillers = [(1000.0 + i, 10.0, 1.0, 0.0) for i in range(60)]
    planner, profile = _planner(len(shapes) + 60), _profile(shapes + fillers)
    table = planner.tables(profile).rollout
    q = len(table.groups)
    for count in (1, 2):
        group = InstanceGroup(tp=1, count=count, max_tokens=math.inf)
        assert planner.rollout_time((group,), profile) == pytest.approx(table.time(0, q, 1, count), rel=1e-9)


def test_tied_longest_decoders_in_a_busy_bucket_are_the_oracles() -> None:
    """Caught, where the request of the longest own chain at a batch of one is a fourth candidate (bc68b6d), as
    above: `_first_max` keeping the last of ties. The first group's request longest in tool calls (10 tokens, 70 s)
    is that request at a batch of one; at the pace of 90 requests the first tied decoder's chain (1,000 tokens, 40 s)
    is longer, and only the candidate of the first of ties names it. The DP's time is the oracle's."""
    planner = _planner(6)
    groups = (
        _group(3000.0, 1000.0, gen_tools=40.0, most_tool_s=70.0, most_tool_gen=10.0, count=30),
        _group(4000.0, 1000.0, gen_tools=1.0, most_tool_s=2.0, most_tool_gen=1000.0, count=30),
        _group(5000.0, 100.0, gen_tools=1.0, most_tool_s=1.0, most_tool_gen=100.0, count=30),
    )
    cm = planner.cost_model
    table = RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=8, tool_latency_s=3.0, routing="start-small")
    for stop in (2, 3):
        for count in (1, 2):
            want = bucket_time(cm, groups, 0, stop, 1, count, 3.0, "start-small")
            assert table.time(0, stop, 1, count) == pytest.approx(want, rel=1e-9), (stop, count)
