"""Tests that kill surviving mutants of the placement solver (`bash scripts/mutation.sh placement`; docs/testing.md,
"Mutation testing"). Each names the property a survivor broke and was checked to fail on that mutant."""

from __future__ import annotations

import time

import pytest

from libra.planning.placement import InfeasiblePlacementError, build_problem, describe, place, solve_placement
from libra.spec import (
    ClusterSpec,
    GPUSpec,
    InstanceGroup,
    Plan,
    Pool,
    Role,
    RolloutConfig,
    TrainConfig,
    get_gpu,
    get_model,
)

A800 = get_gpu("A800-80GB")


def make_plan(tp: int, pp: int, dp: int, ep: int, instances: list[tuple[int, int]]) -> Plan:
    groups = tuple(InstanceGroup(tp=t, count=c, max_tokens=1000.0 * (i + 1)) for i, (t, c) in enumerate(instances))
    return Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep),
        rollout=RolloutConfig(num_gpus=sum(t * c for t, c in instances), time_s=1.0, instances=groups),
        makespan_s=1.0,
    )


def cluster(num_nodes: int, gpus_per_node: int, gpu: GPUSpec = A800) -> ClusterSpec:
    return ClusterSpec(gpu=gpu, num_nodes=num_nodes, gpus_per_node=gpus_per_node)


def test_every_worker_gets_the_pool_of_its_role() -> None:
    """Training replicas in CORE_TRAIN, rollout instances in CORE_ROLLOUT (mutant: `pool=None` for replicas)."""
    placement = place(make_plan(2, 2, 2, 1, [(2, 1), (1, 2)]), cluster(2, 8))
    pools = {w.name: (w.role, w.pool) for w in placement.workers}
    assert pools == {
        "train-0": (Role.TRAIN_REPLICA, Pool.CORE_TRAIN),
        "train-1": (Role.TRAIN_REPLICA, Pool.CORE_TRAIN),
        "rollout-tp2-0": (Role.ROLLOUT_INSTANCE, Pool.CORE_ROLLOUT),
        "rollout-tp1-0": (Role.ROLLOUT_INSTANCE, Pool.CORE_ROLLOUT),
        "rollout-tp1-1": (Role.ROLLOUT_INSTANCE, Pool.CORE_ROLLOUT),
    }


def test_describe_lists_the_worker_on_each_gpu_node_by_node() -> None:
    """The log line format: one line per node, GPU owners separated by one space, `-` for a free GPU."""
    cl = cluster(2, 4)
    plan = make_plan(2, 1, 1, 1, [(1, 1)])
    placement = place(plan, cl)
    assert describe(placement, build_problem(plan, cl)) == "node 0: train-0 train-0 rollout-tp1-0 -\nnode 1: - - - -"


TP_GROUP = "training: 2 replicas x 1 stages, each stage's TP-4 group (4 GPUs) in one node"
EP_BLOCK = "training: 4 replicas x 1 stages, each stage's EP block of 2 replicas x TP-1 (2 GPUs) in one node"


@pytest.mark.parametrize(("tp", "pp", "dp", "ep", "label"), [(4, 1, 2, 1, TP_GROUP), (1, 1, 4, 2, EP_BLOCK)])
def test_the_training_constraint_is_named_by_its_shape(tp: int, pp: int, dp: int, ep: int, label: str) -> None:
    """The training kind's label, as the conflict core prints it: a TP group without EP, an EP block with it, and
    the GPUs per unit (`k * tp`)."""
    (kind,) = [k for k in build_problem(make_plan(tp, pp, dp, ep, []), cluster(4, 8)).kinds if k.key == "train"]
    assert kind.label == label


def test_the_rollout_memory_conflict_states_the_weights_in_gb() -> None:
    model = get_model("Llama-3-70B")
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(1, 2)]), cluster(2, 4), model=model)
    (conflict,) = info.value.conflicts
    assert f"({model.weight_bytes / 1e9:.1f} GB of Llama-3-70B weights / TP-1 + KV reserve of 4096 tokens)" in conflict


def test_total_time_is_the_time_the_call_took() -> None:
    """`total_time_s` covers the whole call: at least CP-SAT's own time, at most the time around the call (no speed
    is asserted)."""
    start = time.perf_counter()
    result = solve_placement(make_plan(2, 1, 2, 1, [(1, 4)]), cluster(2, 8))
    around = time.perf_counter() - start
    assert isinstance(result.total_time_s, float)
    assert 0.0 <= result.solve_time_s <= result.total_time_s <= around
