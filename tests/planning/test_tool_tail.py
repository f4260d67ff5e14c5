"""The tail of tool latencies in the planner (issue 14's real agents): where each trajectory's seconds in tool calls
are known, the chain that bounds a bucket is the longer of the longest decoder's and of the request longest in tool
calls, not the most turns at the mean call. docs/sim.md, "The planner against the simulator on real agents"."""

from __future__ import annotations

import math

import attrs
import pytest

from libra.planning import GlobalPlanner
from libra.spec import ClusterSpec, RLSettings, SpecError, WorkloadProfile, get_gpu, get_model
from libra.workloads import profile_from_trajectories
from libra.workloads.trace import Trajectory, Turn

CLUSTER = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)


def _cost():
    return GlobalPlanner(cluster=CLUSTER, model=get_model("Qwen3-14B"), rl=RLSettings(num_prompts=64)).cost_model


BUCKET = dict(
    num_requests=200.0,
    decode_tokens=200 * 150.0,
    prefill_tokens=200 * 400.0,
    resident_context=500.0,
    max_gen=300.0,
    max_turns=3.0,
    tool_latency_s=2.0,
    new_requests=200.0,
)


def test_the_chain_with_every_request_at_the_mean_call_is_the_old_formula() -> None:
    rc = _cost().rollout
    old = rc.instance_time(1, **BUCKET)
    calls = BUCKET["max_turns"] * BUCKET["tool_latency_s"]
    gen = BUCKET["max_gen"]
    for share in (0.0, 0.5):
        same = rc.instance_time(1, **{**BUCKET, "queued_share": share}, tool_tail=(calls, gen, calls, gen, calls))
        assert same == rc.instance_time(1, **{**BUCKET, "queued_share": share})
    assert rc.instance_time(1, **BUCKET, tool_tail=(calls, 0.0, 0.0, 0.0, 0.0)) == old
    with pytest.raises(ValueError, match="5 values, got 3"):
        rc.instance_time(1, **BUCKET, tool_tail=(calls, 0.0, 0.0))


def test_one_slow_tool_call_sets_the_tail_of_a_step_of_short_runs() -> None:
    """A 300 s call of a request that decodes little: the bucket ends after it, whatever the mean call says."""
    rc = _cost().rollout
    mean_based = float(rc.instance_time(1, **BUCKET))
    slow = float(rc.instance_time(1, **BUCKET, tool_tail=(4.0, 50.0, 300.0, 0.0, 0.0)))
    assert mean_based < 300.0 < slow
    # and the longest decoder's own tool seconds count where they are the longer chain
    slow_decoder = float(rc.instance_time(1, **BUCKET, tool_tail=(300.0, 50.0, 301.0, 0.0, 0.0)))
    assert slow_decoder > slow
    # and the request longest in total's, which decodes less than the longest decoder but waits longer on its tools
    slow_last = float(rc.instance_time(1, **BUCKET, tool_tail=(4.0, 50.0, 300.0, 250.0, 300.0)))
    assert slow_last > slow


def test_profile_groups_name_the_requests_of_the_chain() -> None:
    shapes = [(100.0, 40.0, 2.0, 9.0), (200.0, 90.0, 3.0, 1.0), (300.0, 120.0, 4.0, 5.0), (400.0, 60.0, 2.0, 30.0)]
    p = WorkloadProfile.build(name="t", shapes=shapes)
    assert p.tool_s == (9.0, 1.0, 5.0, 30.0)
    low, high = p.groups(2)
    assert (low.max_gen, low.max_gen_tool_s, low.max_tool_s, low.max_tool_gen) == (90.0, 1.0, 9.0, 40.0)
    assert (high.max_gen, high.max_gen_tool_s, high.max_tool_s, high.max_tool_gen) == (120.0, 5.0, 30.0, 60.0)
    unknown = WorkloadProfile.build(name="t", shapes=[s[:3] for s in shapes]).groups(2)
    assert all(g.max_tool_s is None and g.max_gen_tool_s is None for g in unknown)
    with pytest.raises(SpecError, match="triples or all quadruples"):
        WorkloadProfile.build(name="t", shapes=[shapes[0], shapes[1][:3]])
    with pytest.raises(SpecError, match="tool_s"):
        attrs.evolve(p, tool_s=(1.0, 2.0))
    with pytest.raises(SpecError, match="tool_s"):
        attrs.evolve(p, tool_s=(1.0, 2.0, math.nan, 3.0))


def _trajectory(prompt: str, latencies: list[float | None]) -> Trajectory:
    turns = [
        Turn(
            gen_tokens=50,
            tool="bash",
            tool_status="ok",
            tool_tokens=100,
            extra={} if lat is None else {"tool_latency_s": lat},
        )
        for lat in latencies
    ]
    return Trajectory(prompt_id=prompt, sample=0, prompt_tokens=300, turns=(*turns, Turn(gen_tokens=20)), extra={})


def test_a_trace_that_records_every_tool_call_gives_each_trajectorys_seconds() -> None:
    recorded = profile_from_trajectories([_trajectory("a", [1.0, 2.5]), _trajectory("b", [40.0])])
    assert sorted(recorded.tool_s) == [3.5, 40.0] and recorded.mean_tool_time_s == pytest.approx(43.5 / 3)
    partly = profile_from_trajectories([_trajectory("a", [1.0, None]), _trajectory("b", [40.0])])
    assert partly.tool_s == () and partly.mean_tool_time_s == pytest.approx(41.0 / 2)
    # a run cut off on a tool call: that call returns to nothing (the simulator never runs it), so it is not counted
    cut = _trajectory("c", [3.0, 500.0])
    cut = attrs.evolve(cut, turns=cut.turns[:-1])
    assert profile_from_trajectories([cut]).tool_s == (3.0,)


def test_the_planner_prices_the_slow_call_only_where_it_is_known() -> None:
    """The same step with one 120 s call among 2 s ones: known per trajectory, the rollout cannot end before it."""
    fast = [_trajectory(f"p{i}", [2.0, 2.0]) for i in range(63)]
    trajectories = [*fast, _trajectory("slow", [120.0, 2.0])]
    known = profile_from_trajectories(trajectories)
    unknown = attrs.evolve(known, tool_s=())
    planner = GlobalPlanner(cluster=CLUSTER, model=get_model("Qwen3-14B"), rl=RLSettings(num_prompts=64))
    with_tail, without = planner.plan(known), planner.plan(unknown)
    assert with_tail.rollout.time_s > 122.0 > without.rollout.time_s
    assert max(planner.evaluate(with_tail, known)) >= with_tail.rollout.time_s * (1 - 1e-9)
