"""Fewest workers moved, then packing: hand-checked scenarios with known optima."""

from __future__ import annotations

from libra.planning.placement import moved, solve_placement
from libra.spec import (
    ClusterSpec,
    InstanceGroup,
    Placement,
    Plan,
    Pool,
    Role,
    RolloutConfig,
    TrainConfig,
    WorkerPlacement,
    get_gpu,
)

A800 = get_gpu("A800-80GB")


def make_plan(tp: int, pp: int, dp: int, ep: int, instances: list[tuple[int, int]]) -> Plan:
    groups = tuple(InstanceGroup(tp=t, count=c, max_tokens=1000.0 * (i + 1)) for i, (t, c) in enumerate(instances))
    return Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep),
        rollout=RolloutConfig(num_gpus=sum(t * c for t, c in instances), time_s=1.0, instances=groups),
        makespan_s=1.0,
    )


def rollout(name: str, *ids: int) -> WorkerPlacement:
    return WorkerPlacement(name=name, role=Role.ROLLOUT_INSTANCE, tp=len(ids), gpu_ids=ids, pool=Pool.CORE_ROLLOUT)


def replica(name: str, tp: int, *ids: int) -> WorkerPlacement:
    return WorkerPlacement(name=name, role=Role.TRAIN_REPLICA, tp=tp, gpu_ids=ids, pool=Pool.CORE_TRAIN)


def test_fresh_placement_packs_training_onto_the_fewest_nodes_with_contiguous_ids() -> None:
    cluster = ClusterSpec(gpu=A800, num_nodes=4, gpus_per_node=8)
    result = solve_placement(make_plan(4, 1, 2, 1, [(1, 4), (2, 2)]), cluster)
    by_name = result.placement.by_name()
    assert by_name["train-0"].gpu_ids == (0, 1, 2, 3) and by_name["train-1"].gpu_ids == (4, 5, 6, 7)
    assert (result.cost.moves, result.cost.train_nodes, result.cost.nodes) == (0, 1, 2)
    assert result.optimal


def test_a_pipeline_replica_stays_inside_one_node_when_it_can() -> None:
    cluster = ClusterSpec(gpu=A800, num_nodes=2, gpus_per_node=8)
    result = solve_placement(make_plan(2, 2, 2, 1, []), cluster)
    for w in result.placement.workers:
        assert len({cluster.node_of(g) for g in w.gpu_ids}) == 1


def test_growing_training_into_freed_rollout_gpus_moves_nobody() -> None:
    cluster = ClusterSpec(gpu=A800, num_nodes=3, gpus_per_node=8)
    before = solve_placement(make_plan(4, 1, 2, 1, [(4, 2), (1, 8)]), cluster).placement
    after = solve_placement(make_plan(4, 1, 3, 1, [(4, 1), (1, 8)]), cluster, current=before)
    assert after.cost.moves == 0
    old = before.by_name()
    # train-2 takes the GPUs that rollout-tp4-1 gave up.
    assert set(after.placement.by_name()["train-2"].gpu_ids) == set(old["rollout-tp4-1"].gpu_ids)


def test_a_wide_instance_forces_exactly_the_necessary_moves() -> None:
    """Two 4-GPU nodes, TP-1 instances 0,1 on node 0 and 2,3 on node 1. A new TP-4 instance needs a whole node,
    so two TP-1 instances must move, and only two."""
    cluster = ClusterSpec(gpu=A800, num_nodes=2, gpus_per_node=4)
    current = Placement(
        workers=(
            rollout("rollout-tp1-0", 0),
            rollout("rollout-tp1-1", 1),
            rollout("rollout-tp1-2", 4),
            rollout("rollout-tp1-3", 5),
        )
    )
    result = solve_placement(make_plan(1, 1, 0, 1, [(1, 4), (4, 1)]), cluster, current=current)
    old = current.by_name()
    changed = [w.name for w in result.placement.workers if w.name in old and moved(old[w.name], w)]
    assert result.cost.moves == len(changed) == 2
    assert changed in (["rollout-tp1-0", "rollout-tp1-1"], ["rollout-tp1-2", "rollout-tp1-3"])


def test_a_replica_whose_stages_span_nodes_is_kept() -> None:
    """train-0's two stages sit on nodes 0 and 1 (a coupled replica); replanning keeps it in place."""
    cluster = ClusterSpec(gpu=A800, num_nodes=2, gpus_per_node=4)
    current = Placement(workers=(replica("train-0", 2, 2, 3, 4, 5), rollout("rollout-tp2-0", 0, 1)))
    result = solve_placement(make_plan(2, 2, 1, 1, [(2, 2)]), cluster, current=current)
    assert result.placement.by_name()["train-0"].gpu_ids == (2, 3, 4, 5)
    assert result.cost.moves == 0


def test_stage_order_matters_for_a_replica() -> None:
    """Swapping a replica's stages changes which layers each GPU holds: that counts as a move."""
    a, b = replica("train-0", 2, 0, 1, 4, 5), replica("train-0", 2, 4, 5, 0, 1)
    assert moved(a, b) and not moved(a, replica("train-0", 2, 1, 0, 5, 4))


def test_an_ep_block_keeps_its_replicas_together() -> None:
    """ep=2: train-0 and train-1 form a block whose stage must share a node. Keeping train-0 on node 1 pins
    train-1 to node 1 as well."""
    cluster = ClusterSpec(gpu=A800, num_nodes=2, gpus_per_node=4)
    current = Placement(workers=(replica("train-0", 2, 4, 5),))
    result = solve_placement(make_plan(2, 1, 2, 2, [(2, 2)]), cluster, current=current)
    by_name = result.placement.by_name()
    assert by_name["train-0"].gpu_ids == (4, 5)
    assert {cluster.node_of(g) for g in by_name["train-1"].gpu_ids} == {1}
    assert result.cost.moves == 0


def test_moves_outrank_packing() -> None:
    """train-1 on node 1 next to rollout-tp2-0; rollout-tp2-1 on node 0. Moving rollout-tp2-0 to node 0 would let
    train-0 join train-1 (one training node instead of two), but it costs a move, and a move weighs more."""
    cluster = ClusterSpec(gpu=A800, num_nodes=2, gpus_per_node=4)
    current = Placement(
        workers=(replica("train-1", 2, 4, 5), rollout("rollout-tp2-0", 6, 7), rollout("rollout-tp2-1", 0, 1))
    )
    result = solve_placement(make_plan(2, 1, 2, 1, [(2, 2)]), cluster, current=current)
    assert result.placement.by_name()["train-0"].gpu_ids == (2, 3)
    assert (result.cost.moves, result.cost.train_nodes) == (0, 2)
    fresh = solve_placement(make_plan(2, 1, 2, 1, [(2, 2)]), cluster)
    assert fresh.cost.train_nodes == 1
