"""The documented flow a running job follows after a workload drift: replan the rollout side, place it beside the
current placement, and let the elastic controller turn the difference into instance starts and stops. A whole
replan may pick another training layout, which the controller refuses (the core training pool is fixed): that is
why `GlobalPlanner.replan_rollout` exists."""

from __future__ import annotations

import pytest

from libra.elastic import CoreTopologyChange, ElasticController, StartInstance, StopInstance
from libra.planning import GlobalPlanner, ReplanGate
from libra.planning.placement import place
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import WorkloadGenerator, profile_from_trajectories


def test_a_rollout_replan_keeps_the_training_layout_and_the_controller_carries_it_out() -> None:
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8)
    planner = GlobalPlanner(
        cluster=cluster, model=get_model("Qwen3-14B"), rl=RLSettings(num_prompts=64, samples_per_prompt=16)
    )
    gen = WorkloadGenerator("r2e-gym", seed=0, num_prompts=64, samples_per_prompt=16)
    before, drifted = profile_from_trajectories(gen.step(0)), profile_from_trajectories(gen.step(100))
    plan = planner.plan(before)
    placement = place(plan, cluster)

    whole, _ = planner.replan(plan, drifted)
    assert whole.train != plan.train  # this drift moves the training layout too
    with pytest.raises(CoreTopologyChange):
        ElasticController(placement=placement).apply_plan(place(whole, cluster, current=placement), step=3, why="")

    candidate, decision = planner.replan_rollout(plan, drifted, gate=ReplanGate(min_relative_gain=0.0))
    assert candidate.train == plan.train and candidate.rollout.num_gpus == plan.rollout.num_gpus
    assert candidate.rollout.instances != plan.rollout.instances and decision.apply
    assert decision.candidate_s < decision.current_s
    decisions = ElasticController(placement=placement).apply_plan(
        place(candidate, cluster, current=placement), step=3, why=decision.reason
    )
    assert decisions and all(isinstance(d, StartInstance | StopInstance) for d in decisions)
    started = sum(d.tp for d in decisions if isinstance(d, StartInstance))
    assert started == sum(g.tp * g.count for g in candidate.rollout.instances)  # this drift replaces every instance


def test_the_controller_refuses_a_placement_that_holds_a_gpu_twice() -> None:
    from libra.spec.placement import Placement, Pool, Role, WorkerPlacement

    core = WorkerPlacement(name="train-0", role=Role.TRAIN_REPLICA, tp=1, gpu_ids=(0, 1), pool=Pool.CORE_TRAIN)
    r0 = WorkerPlacement(name="rollout-tp1-0", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(2,))
    with pytest.raises(ValueError, match=r"GPU 1 is placed under several workers \['train-0', 'rollout-tp1-1'\]"):
        ElasticController(
            placement=Placement(
                workers=(
                    core,
                    r0,
                    WorkerPlacement(name="rollout-tp1-1", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(1,)),
                )
            )
        )
    ctl = ElasticController(placement=Placement(workers=(core, r0)))
    clash = WorkerPlacement(name="rollout-tp1-1", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(2,))
    with pytest.raises(ValueError, match="GPU 2 is placed under several workers"):
        ctl.apply_plan(Placement(workers=(core, r0, clash)), step=1, why="")
    assert ctl.placement == Placement(workers=(core, r0))  # refused before anything changed
