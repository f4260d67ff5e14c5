"""Oracle tests: CP-SAT placement against exhaustive search on seeded random small instances.

Each instance: 1-4 nodes, at most 16 GPUs, a small training config (TP, PP, DP, EP) and a few rollout instances,
half of them with a `current` placement (the placement of a different random plan, or random and partly invalid
GPU ids). CP-SAT's cost must equal the brute-force optimum and both must agree on feasibility.
"""

from __future__ import annotations

import random

import pytest

from libra.planning.placement import InfeasiblePlacementError, build_problem, patterns, placement_cost, solve_placement
from libra.planning.placement.brute import brute_force_gpus, brute_force_nodes
from libra.planning.placement.patterns import decompose
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

GPU = get_gpu("A800-80GB")
NUM_NODE_INSTANCES = 1000
NUM_GPU_INSTANCES = 150


def make_plan(tp: int, pp: int, dp: int, ep: int, instances: list[tuple[int, int]]) -> Plan:
    groups = tuple(InstanceGroup(tp=t, count=c, max_tokens=1000.0 * (i + 1)) for i, (t, c) in enumerate(instances))
    return Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep),
        rollout=RolloutConfig(num_gpus=sum(t * c for t, c in instances), time_s=1.0, instances=groups),
        makespan_s=1.0,
    )


def random_plan(rng: random.Random, cluster: ClusterSpec, max_units: int) -> Plan:
    """A plan that fits the cluster's GPU total and whose units fit a node (it may still not fit the nodes:
    pre-solve conflicts are tested in test_placement_errors.py)."""
    g, total = cluster.gpus_per_node, cluster.num_gpus
    while True:
        dp = rng.choice([0, 1, 1, 2, 2, 3, 4])
        tp = rng.choice([t for t in (1, 2, 4) if t <= g] or [1])
        pp = rng.choice([1, 1, 2])
        ep = rng.choice([e for e in (1, 1, 2, 4) if dp and dp % e == 0 and e * tp <= g] or [1])
        train = tp * pp * dp
        instances, used = [], train
        for t in rng.sample([1, 2, 4], rng.randint(0, 3)):
            if t > g:
                continue
            count = rng.randint(0, max(0, (total - used) // t))
            if count:
                instances.append((t, count))
                used += t * count
        plan = make_plan(tp, pp, dp, ep, instances)
        units = (dp * pp) + sum(c for _, c in instances)
        if plan.num_gpus <= total and 0 < units <= max_units:
            return plan


def random_current(rng: random.Random, plan: Plan, cluster: ClusterSpec) -> Placement | None:
    """None, the placement of another random plan, or random (possibly overlapping, node-crossing) GPU ids."""
    mode = rng.random()
    if mode < 0.5:
        return None
    if mode < 0.85:
        try:
            return solve_placement(random_plan(rng, cluster, 8), cluster).placement
        except InfeasiblePlacementError:
            return None
    problem = build_problem(plan, cluster)
    workers = []
    for w in problem.workers:
        if rng.random() < 0.7:
            ids = tuple(rng.sample(range(cluster.num_gpus), min(w.num_gpus, cluster.num_gpus)))
            workers.append(WorkerPlacement(name=w.name, role=w.role, tp=w.tp, gpu_ids=ids, pool=w.pool))
    workers.append(
        WorkerPlacement(name="rollout-tp1-99", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(0,), pool=Pool.CORE_ROLLOUT)
    )
    return Placement(workers=tuple(workers))


def random_instance(seed: int, max_gpus: int = 16, max_units: int = 10):
    rng = random.Random(seed)
    g = rng.choice([1, 2, 3, 4, 6, 8])  # 3 and 6 fragment: TP-2/TP-4 units leave holes
    num_nodes = rng.randint(1, max(1, min(4, max_gpus // g)))
    cluster = ClusterSpec(gpu=GPU, num_nodes=num_nodes, gpus_per_node=g)
    plan = random_plan(rng, cluster, max_units)
    return plan, cluster, random_current(rng, plan, cluster)


def check_against(oracle_cost, plan, cluster, current) -> str:
    try:
        result = solve_placement(plan, cluster, current=current)
    except InfeasiblePlacementError:
        assert oracle_cost is None, f"CP-SAT says infeasible, brute force found {oracle_cost}"
        return "infeasible"
    assert oracle_cost is not None, f"brute force says infeasible, CP-SAT found {result.cost}"
    assert result.optimal
    assert result.cost == oracle_cost
    assert placement_cost(result.placement, build_problem(plan, cluster, current=current), current) == result.cost
    return "with current" if current is not None else "fresh"


def test_cp_sat_matches_node_level_brute_force_on_1000_instances() -> None:
    kinds = {"infeasible": 0, "with current": 0, "fresh": 0}
    moved = 0
    for seed in range(NUM_NODE_INSTANCES):
        plan, cluster, current = random_instance(seed)
        problem = build_problem(plan, cluster, current=current)
        oracle = brute_force_nodes(problem)
        kinds[check_against(oracle, plan, cluster, current)] += 1
        moved += bool(oracle and oracle.moves)
    # The generator must exercise every branch, or the comparison proves little.
    assert min(kinds.values()) >= 20, kinds
    assert moved >= 20


def test_node_level_model_loses_nothing_against_gpu_level_brute_force() -> None:
    """Tiny instances (<= 8 GPUs, <= 4 workers): enumerate concrete GPU ids, no node-level reasoning."""
    kinds = {"infeasible": 0, "with current": 0, "fresh": 0}
    for seed in range(NUM_GPU_INSTANCES):
        plan, cluster, current = random_instance(10_000 + seed, max_gpus=8, max_units=4)
        problem = build_problem(plan, cluster, current=current)
        oracle = brute_force_gpus(plan, cluster, problem, current)
        assert oracle == brute_force_nodes(problem)
        kinds[check_against(oracle, plan, cluster, current)] += 1
    assert min(kinds.values()) >= 3, kinds


def test_same_inputs_give_the_same_gpu_ids() -> None:
    checked = 0
    for seed in range(500, 600):
        plan, cluster, current = random_instance(seed)
        try:
            first = solve_placement(plan, cluster, current=current).placement
        except InfeasiblePlacementError:
            continue
        assert solve_placement(plan, cluster, current=current).placement == first
        checked += 1
    assert checked >= 50


def test_per_node_fallback_matches_brute_force_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no pattern enumeration at all (every node modelled one by one, as for wide nodes), the same optima."""
    monkeypatch.setattr(patterns, "MAX_PATTERNS", -1)
    for seed in range(300):
        plan, cluster, current = random_instance(20_000 + seed)
        problem = build_problem(plan, cluster, current=current)
        assert not decompose(problem).classes
        check_against(brute_force_nodes(problem), plan, cluster, current)
