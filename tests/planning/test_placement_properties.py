"""Hypothesis properties of `place`: TP groups and EP blocks never cross a node, GPU totals are never exceeded, each
GPU is used at most once, and every worker of the plan is placed exactly once with the right number of GPUs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.planning.placement import InfeasiblePlacementError, plan_workers, solve_placement
from libra.spec import ClusterSpec, InstanceGroup, Placement, Plan, Role, RolloutConfig, TrainConfig, get_gpu

A800 = get_gpu("A800-80GB")


@st.composite
def instances(draw: st.DrawFn) -> tuple[Plan, ClusterSpec]:
    g = draw(st.sampled_from([1, 2, 4, 6, 8]))
    cluster = ClusterSpec(gpu=A800, num_nodes=draw(st.integers(1, 12)), gpus_per_node=g)
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= g]))
    pp = draw(st.integers(1, 3))
    budget = cluster.num_gpus + draw(st.sampled_from([0, 0, 0, 2]))  # sometimes a little over the cluster
    dp = draw(st.integers(0, max(0, budget // (tp * pp))))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0 and e * tp <= g] or [1])) if dp else 1
    left = budget - tp * pp * dp
    groups = []
    for i, t in enumerate(draw(st.lists(st.sampled_from([t for t in (1, 2, 4, 8) if t <= g]), max_size=3))):
        count = draw(st.integers(0, max(0, left // t)))
        left -= count * t
        groups.append(InstanceGroup(tp=t, count=count, max_tokens=1000.0 * (i + 1)))
    plan = Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep),
        rollout=RolloutConfig(num_gpus=sum(x.num_gpus for x in groups), time_s=1.0, instances=tuple(groups)),
        makespan_s=1.0,
    )
    return plan, cluster


def check_placement(placement: Placement, plan: Plan, cluster: ClusterSpec) -> None:
    workers, k = plan_workers(plan)
    # Every worker of the plan placed exactly once, with its shape.
    assert [w.name for w in placement.workers] == [w.name for w in workers]
    for shape, w in zip(workers, placement.workers):
        assert (w.role, w.tp, w.pool, len(w.gpu_ids)) == (shape.role, shape.tp, shape.pool, shape.num_gpus)
    # Each GPU used at most once, inside the cluster; totals within the cluster.
    ids = [g for w in placement.workers for g in w.gpu_ids]
    assert len(ids) == len(set(ids)) <= cluster.num_gpus
    assert all(0 <= g < cluster.num_gpus for g in ids)
    # TP groups never cross a node.
    for w in placement.workers:
        for s in range(0, len(w.gpu_ids), w.tp):
            assert len({cluster.node_of(g) for g in w.gpu_ids[s : s + w.tp]}) == 1, w
    # EP blocks: stage s of the k replicas of a block share one node.
    replicas = [w for w in placement.workers if w.role is Role.TRAIN_REPLICA]
    for b in range(0, len(replicas), k):
        for s in range(plan.train.pp):
            stage = [g for r in replicas[b : b + k] for g in r.gpu_ids[s * r.tp : (s + 1) * r.tp]]
            assert len({cluster.node_of(g) for g in stage}) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_placements_respect_every_hard_constraint(case: tuple[Plan, ClusterSpec]) -> None:
    plan, cluster = case
    try:
        result = solve_placement(plan, cluster)
    except InfeasiblePlacementError as exc:
        assert exc.conflicts
        return
    check_placement(result.placement, plan, cluster)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), instances())
def test_replanning_from_any_current_placement_respects_them_too(first, second) -> None:
    plan_a, cluster = first
    plan_b = second[0]
    try:
        current = solve_placement(plan_a, cluster).placement
        result = solve_placement(plan_b, cluster, current=current)
    except InfeasiblePlacementError:
        return
    check_placement(result.placement, plan_b, cluster)
    # Workers present in both plans that kept their GPUs are exactly the unmoved ones.
    assert result.cost.moves <= sum(1 for w in result.placement.workers if w.name in current.by_name())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_replanning_the_same_plan_moves_nothing(case: tuple[Plan, ClusterSpec]) -> None:
    plan, cluster = case
    try:
        first = solve_placement(plan, cluster).placement
    except InfeasiblePlacementError:
        return
    again = solve_placement(plan, cluster, current=first)
    assert again.cost.moves == 0
    assert again.placement == first
