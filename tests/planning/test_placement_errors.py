"""Infeasible requests get an InfeasiblePlacementError whose conflicts name the constraints; other statuses get
their own types."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from libra.planning.placement import (
    InfeasiblePlacementError,
    PlacementModelError,
    PlacementTimeoutError,
    place,
    rollout_gb_per_gpu,
)
from libra.planning.placement import model as placement_model
from libra.spec import ClusterSpec, GPUSpec, InstanceGroup, Plan, RolloutConfig, TrainConfig, get_gpu, get_model

A800 = get_gpu("A800-80GB")


def make_plan(tp: int, pp: int, dp: int, ep: int, instances: list[tuple[int, int]], memory_gb: float = 0.0) -> Plan:
    groups = tuple(InstanceGroup(tp=t, count=c, max_tokens=1000.0 * (i + 1)) for i, (t, c) in enumerate(instances))
    return Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep, memory_gb=memory_gb),
        rollout=RolloutConfig(num_gpus=sum(t * c for t, c in instances), time_s=1.0, instances=groups),
        makespan_s=1.0,
    )


def cluster(num_nodes: int, gpus_per_node: int, gpu: GPUSpec = A800) -> ClusterSpec:
    return ClusterSpec(gpu=gpu, num_nodes=num_nodes, gpus_per_node=gpus_per_node)


def conflicts_of(plan: Plan, cl: ClusterSpec, **kwargs) -> tuple[str, ...]:
    with pytest.raises(InfeasiblePlacementError) as info:
        place(plan, cl, **kwargs)
    assert "\n" not in str(info.value)
    return info.value.conflicts


def test_tp8_instance_on_4_gpu_nodes() -> None:
    conflicts = conflicts_of(make_plan(1, 1, 0, 1, [(8, 2)]), cluster(4, 4))
    assert conflicts == (
        "instance rollout-tp8-0 needs 8 GPUs in one node but nodes have 4 (and 1 more TP-8 instances)",
    )


def test_training_tp_group_wider_than_a_node() -> None:
    (conflict,) = conflicts_of(make_plan(8, 1, 1, 1, []), cluster(4, 4))
    assert "train-0" in conflict and "TP-8 group (8 GPUs) in one node but nodes have 4" in conflict


def test_ep_block_wider_than_a_node() -> None:
    (conflict,) = conflicts_of(make_plan(2, 1, 4, 4, []), cluster(2, 4))
    assert "EP block (ep=4 replicas x TP-2 = 8 GPUs per stage)" in conflict and "nodes have 4" in conflict


def test_more_gpus_than_the_cluster() -> None:
    (conflict,) = conflicts_of(make_plan(2, 1, 4, 1, [(1, 10)]), cluster(2, 8))
    assert conflict == "the plan needs 18 GPUs (training 8 + rollout 10) but the cluster has 16 (2 nodes x 8 GPUs)"


def test_model_that_fits_nowhere() -> None:
    small = GPUSpec(
        name="S-16GB",
        memory_gb=16,
        bf16_tflops=100,
        hbm_bandwidth_gbs=1000,
        nvlink_bandwidth_gbs=100,
        network_bandwidth_gbs=10,
    )
    (conflict,) = conflicts_of(make_plan(1, 1, 0, 1, [(4, 1)]), cluster(2, 4, small), model=get_model("Llama-3-70B"))
    assert conflict.startswith("instance rollout-tp4-0 needs")
    assert "Llama-3-70B fits nowhere: even TP-4 (a whole node)" in conflict


def test_model_too_big_for_the_requested_tp_names_the_smallest_that_fits() -> None:
    (conflict,) = conflicts_of(make_plan(1, 1, 0, 1, [(1, 2)]), cluster(2, 4), model=get_model("Llama-3-70B"))
    assert "but A800-80GB has 80 GB; the smallest TP degree that fits is TP-2" in conflict


def test_rollout_memory_is_weights_over_tp_plus_kv_reserve() -> None:
    model = get_model("Qwen3-14B")
    expected = (model.weight_bytes / 2 + 4096 * model.kv_bytes_per_token(2)) / 1e9
    assert rollout_gb_per_gpu(model, 2, 4096) == pytest.approx(expected)
    place(make_plan(1, 1, 0, 1, [(1, 4)]), cluster(1, 4), model=model)  # 30 GB per GPU fits 80 GB


def test_training_memory_over_the_gpu() -> None:
    (conflict,) = conflicts_of(make_plan(2, 1, 2, 1, [], memory_gb=95.0), cluster(1, 4))
    assert conflict == "replica train-0 needs 95.0 GB per GPU (plan.train.memory_gb) but A800-80GB has 80 GB"


def test_every_presolve_conflict_is_listed_at_once() -> None:
    plan = make_plan(8, 1, 1, 1, [(8, 1), (1, 10)])
    assert len(conflicts_of(plan, cluster(2, 4))) == 3


def test_fragmentation_is_explained_by_the_cp_sat_core() -> None:
    """Three TP-4 instances on two 6-GPU nodes: 12 GPUs for 12, but only one TP-4 fits per node."""
    conflicts = conflicts_of(make_plan(1, 1, 0, 1, [(4, 3)]), cluster(2, 6))
    assert conflicts == (
        "rollout: 3 TP-4 instances, each in one node",
        "node capacity: 2 nodes x 6 GPUs, each GPU used at most once",
    )


def test_core_names_training_and_rollout_when_both_conflict() -> None:
    conflicts = conflicts_of(make_plan(4, 1, 2, 1, [(4, 1), (2, 0)]), cluster(2, 6))
    assert any(c.startswith("training: 2 replicas x 1 stages") for c in conflicts)
    assert "rollout: 1 TP-4 instances, each in one node" in conflicts
    assert conflicts[-1].startswith("node capacity")


def test_core_is_minimal_and_leaves_out_kinds_not_in_conflict() -> None:
    """Four TP-4 instances and two TP-1 on three 6-GPU nodes: 18 GPUs for 18, but only three TP-4 fit; the TP-1
    instances fit anywhere, so they are not part of the conflict."""
    conflicts = conflicts_of(make_plan(1, 1, 0, 1, [(4, 4), (1, 2)]), cluster(3, 6))
    assert conflicts == (
        "rollout: 4 TP-4 instances, each in one node",
        "node capacity: 3 nodes x 6 GPUs, each GPU used at most once",
    )


def test_model_invalid_is_a_different_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model CP-SAT rejects (here: a variable with an empty domain added to the real model) is a bug in the
    model builder, reported as PlacementModelError, not as an infeasibility."""
    build = placement_model.build_model

    def broken(*args, **kwargs):
        model, v = build(*args, **kwargs)
        model.new_int_var(1, 0, "empty domain")
        return model, v

    monkeypatch.setattr(placement_model, "build_model", broken)
    with pytest.raises(PlacementModelError, match="CP-SAT rejected"):
        place(make_plan(1, 1, 0, 1, [(1, 2)]), cluster(1, 4))


def test_time_limit_without_a_solution_is_a_timeout_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda self, model, *a: cp_model.UNKNOWN)
    with pytest.raises(PlacementTimeoutError, match="no placement found within 0.5 s"):
        place(make_plan(1, 1, 0, 1, [(1, 2)]), cluster(1, 4), time_limit_s=0.5)
