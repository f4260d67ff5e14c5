"""The elastic pool borrows hybrid replicas for rollout only where the borrowed instances are ready before the
bucket's own instances would have finished the queued work they take (`libra.sim.borrow.queue_done_at`).

It used to borrow whenever training was done and `min_backlog` requests queued. At the end of the weight broadcast
(13.5 s for Qwen3-14B on A800) every request of a step still queues, since no instance has served yet: on a step
of 88 one-token trajectories `libra` started instances ready 10.8 s later, moved a share of the queue onto them, and
rolled out for 25.0 s where the same layout without the pool takes 14.5 s (docs/sim.md, "The elastic pool borrowed
instances that started after the work was done").

A borrowed instance serves the weights of the stage's broadcast, so it is ready no earlier than the broadcast's end
(`libra.sim.borrow`). The stage's first event is that end only while the broadcast is shorter than the longest time
slice (`SimOptions.max_slice_s`, 60 s): with a 1 s slice the pool borrowed at 1.0 s on the 88-trajectory step and
its 5 instances were ready at 11.8 s (1.0 + 10.8 s to start), 1.7 s before the weights had arrived."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from conftest import one_token_scenario, policy_run, small_scenario

from libra.planning.cost import CostModel
from libra.sim import Decision, PolicyRun, Scenario, routes_for, simulate
from libra.sim.engine import weight_sync_s
from libra.sim.policies import Allocation
from libra.sim.records import StageRecord
from libra.spec import InstanceGroup, TrainConfig

# a layout of the 88-trajectory step with a hybrid replica to borrow (training TP-1 x PP-5 on two replicas, one of
# them hybrid: 5 GPUs): the planner trains this step on one replica of 4 GPUs, which leaves the pool none
HYBRID_LAYOUT = Allocation(
    train=TrainConfig(num_gpus=10, tp=1, pp=5, dp=2),
    rollout=(InstanceGroup(tp=1, count=38, max_tokens=math.inf),),
    routing="single",
)


def _run(sc: Scenario, name: str, allocation: Allocation) -> PolicyRun:
    """A policy's run whose first stage runs `allocation`, begun."""
    run = policy_run(sc, name)
    run.decide(Decision(step=0, allocation=allocation, reason="the layout under test"))
    run.begin_stage()
    return run


def _stage(sc: Scenario, name: str, allocation: Allocation) -> StageRecord:
    run = _run(sc, name, allocation)
    work = sc.source.step(0)
    return run.stage(work, routes_for(allocation.routing, work, allocation.buckets, None))


def test_no_instance_is_borrowed_that_would_start_after_the_queued_work_is_done(tmp_path) -> None:
    """Measured: 14.48 s with and without the pool; 24.96 s with it before (5 GPUs borrowed at 13.5 s)."""
    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    pooled, alone = (_stage(sc, name, HYBRID_LAYOUT) for name in ("libra", "libra-cmlfq"))
    assert pooled.borrowed_gpu_s == 0.0
    assert pooled.rollout_s == alone.rollout_s < weight_sync_s(CostModel(sc.cluster, sc.model, sc.coeffs)) + 1.0


def test_a_borrow_at_the_broadcast_end_that_delayed_the_tail_is_not_made() -> None:
    """r2e-gym on 16 GPUs (the golden report's case): the borrow at 13.5 s moved a third of the step onto an
    instance ready at 24.3 s, where the bucket's own two instances would have finished a mean trajectory of the
    queue by 22.2 s; `libra` rolled out step 0 in 200.7 s against 193.8 s for the same plan without the pool."""
    sc = small_scenario(workload="r2e-gym", gpus=16, prompts=16, samples=4)
    results = simulate(sc, num_steps=1, policies=["libra", "libra-cmlfq"]).results
    pooled, alone = (r.records[0] for r in results)
    assert pooled.borrowed_gpu_s == 0.0 and pooled.rollout_s == alone.rollout_s


def test_a_borrow_that_pays_is_still_made_and_shortens_the_step() -> None:
    """search-r1 on 16 GPUs, 32 prompts x 4: 128 requests on two TP-4 instances, which a mean trajectory (2,205
    decoded tokens, 5.2 s of tools) keeps busy past the borrowed instance's start: step 0 takes 161.9 s with the
    borrow, 177.2 s without."""
    sc = small_scenario(workload="search-r1", gpus=16, prompts=32)
    results = simulate(sc, num_steps=1, policies=["libra", "libra-cmlfq"]).results
    pooled, alone = (r.records[0] for r in results)
    assert pooled.borrowed_gpu_s > 0.0 and pooled.rollout_s < alone.rollout_s


@pytest.mark.parametrize(("gen", "tool_s", "borrow"), [(1.0, 0.0, False), (5_000.0, 0.0, True), (1.0, 60.0, True)])
def test_the_queue_is_done_after_a_mean_trajectory_on_the_buckets_own_instances(tmp_path, gen, tool_s, borrow):
    """The estimate reads the mean trajectory of a finished step, not the queued requests' own lengths (one token
    each here): long decodes or long tool calls keep the bucket's instances past a borrowed instance's start."""
    from libra.sim.borrow import Expected, queue_done_at  # (here: the tests above also run on the engine before)

    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    run = _run(sc, "libra", HYBRID_LAYOUT)
    work, sync = sc.source.step(0), weight_sync_s(run.cm)
    roll = run._rollout(work, routes_for("single", work, HYBRID_LAYOUT.buckets, None), 0.0, sync)
    expected = Expected(gen_tokens=gen, tool_s=tool_s, total_tokens=2.0 + gen)
    done = queue_done_at(run.cm, roll, 0, sync, expected)  # at the broadcast's end: the stage's first event
    assert done >= sync + tool_s  # nothing starts before the instances serve, nor finishes before its tool calls
    assert (done > sync + sc.costs.to_rollout_s) is borrow
    roll.lend(np.flatnonzero(roll.inst.bucket == 0))
    assert queue_done_at(run.cm, roll, 0, sync, expected) == math.inf  # no instance of its own left to serve it


FINE_SLICE_S = 1.0  # shorter than the broadcast: the stage's events fall inside it


def test_an_instance_borrowed_during_the_broadcast_is_ready_at_its_end(tmp_path) -> None:
    from libra.sim.borrow import Expected

    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    run, work = _run(sc, "libra", HYBRID_LAYOUT), sc.source.step(0)
    sync = weight_sync_s(run.cm)
    roll = run._rollout(work, routes_for("single", work, HYBRID_LAYOUT.buckets, None), 0.0, sync)
    own, t = len(roll.inst), FINE_SLICE_S
    assert t + sc.costs.to_rollout_s < sync  # the engine would have started before the weights arrive
    assert run._borrow(roll, None, t, Expected.of(work), sync) == 5.0  # the hybrid replica's 5 GPUs, as TP-1
    assert roll.inst.ready_at[own:].tolist() == [sync] * 5
    assert (roll.inst.ready_at[:own] == sync).all()  # as the stage's own instances


def test_a_stage_at_a_fine_slice_counts_borrowed_instances_only_from_the_broadcast_end(tmp_path) -> None:
    """43 TP-1 instances, all serving from the broadcast's end, hold 43 / 38 of the 38 own instances' decode
    capacity: 182,676 tokens (217,922 when the borrowed ones counted from 11.8 s)."""
    sc = one_token_scenario(tmp_path / "tiny.jsonl")
    fine = attrs.evolve(sc, options=attrs.evolve(sc.options, max_slice_s=FINE_SLICE_S))
    pooled, alone = _stage(fine, "libra", HYBRID_LAYOUT), _stage(sc, "libra", HYBRID_LAYOUT)
    assert alone.borrowed_gpu_s == 0.0  # at a 60 s slice the first event is the broadcast's end: no borrow
    # borrowed at the stage's first event (1 s), inside the broadcast: 5 GPUs lent from 1 s to the rollout's end
    assert pooled.borrowed_gpu_s == pytest.approx(5 * (pooled.rollout_s - FINE_SLICE_S))
    assert pooled.decode_capacity_tokens == pytest.approx(alone.decode_capacity_tokens * 43 / 38, rel=1e-4)
    assert pooled.rollout_s == pytest.approx(alone.rollout_s)
