"""Tests that kill surviving mutants of the placement solver (`bash scripts/mutation.sh placement`; docs/testing.md,
"Mutation testing"). Each names the property a survivor broke and was checked to fail on that mutant."""

from __future__ import annotations

import importlib
import time

import attrs
import pytest

from libra.planning.placement import (
    InfeasiblePlacementError,
    PlacementModelError,
    build_problem,
    describe,
    moved,
    patterns,
    place,
    rollout_gb_per_gpu,
    solve_placement,
)
from libra.planning.placement.assign import assign_gpus
from libra.planning.placement.brute import brute_force_nodes
from libra.planning.placement.model import NodeSolution
from libra.spec import (
    ClusterSpec,
    GPUSpec,
    InstanceGroup,
    Placement,
    Plan,
    Pool,
    Role,
    RolloutConfig,
    TrainConfig,
    WorkerPlacement,
    get_gpu,
    get_model,
)

A800 = get_gpu("A800-80GB")
# The package exports the function `place`, which hides the module of the same name.
place_module = importlib.import_module("libra.planning.placement.place")


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


def rollout_at(name: str, *ids: int) -> WorkerPlacement:
    return WorkerPlacement(name=name, role=Role.ROLLOUT_INSTANCE, tp=len(ids), gpu_ids=ids, pool=Pool.CORE_ROLLOUT)


def replica_at(name: str, tp: int, *ids: int) -> WorkerPlacement:
    return WorkerPlacement(name=name, role=Role.TRAIN_REPLICA, tp=tp, gpu_ids=ids, pool=Pool.CORE_TRAIN)


def test_a_fresh_placement_fills_the_lowest_nodes_and_leaves_the_highest_free() -> None:
    """Nodes of one class: the training node first, then the used ones, then the free ones (mutant: the free nodes
    sorted before the used ones)."""
    cl = cluster(3, 4)
    plan = make_plan(4, 1, 1, 1, [(4, 1)])
    placement = place(plan, cl)
    assert describe(placement, build_problem(plan, cl)).splitlines() == [
        "node 0: train-0 train-0 train-0 train-0",
        "node 1: rollout-tp4-0 rollout-tp4-0 rollout-tp4-0 rollout-tp4-0",
        "node 2: - - - -",
    ]


def test_an_entity_that_cannot_be_kept_does_not_hide_the_ones_that_can() -> None:
    """Node 0 holds replica train-0 (3 stages, all on node 0) and rollout-tp1-0. The EP block of train-0 (ep = 2)
    would pin 3 stages x 2 GPUs = 6 GPUs on the 4-GPU node, so it cannot be kept there; the rollout instance can.
    The pattern enumeration must skip the impossible combination and go on (mutant: `break`, which also drops
    "keep the rollout instance alone"): one move, the optimum of the exhaustive search."""
    cl = cluster(3, 4)
    plan = make_plan(1, 3, 2, 2, [(1, 2)])
    current = Placement(workers=(replica_at("train-0", 1, 0, 1, 2), rollout_at("rollout-tp1-0", 3)))
    result = solve_placement(plan, cl, current=current)
    oracle = brute_force_nodes(build_problem(plan, cl, current=current))
    assert oracle is not None and oracle.moves == 1
    assert result.cost == oracle
    assert result.placement.by_name()["rollout-tp1-0"].gpu_ids == (3,)


def test_the_other_replicas_of_a_kept_block_get_every_stage() -> None:
    """EP block of train-0 and train-1 (ep = 2, 2 stages): train-0 keeps its GPUs, train-1 is new and must get one
    TP group per stage, each on the node of train-0's same stage (mutant: only its last stage's GPUs)."""
    cl = cluster(2, 4)
    plan = make_plan(1, 2, 2, 2, [])
    current = Placement(workers=(replica_at("train-0", 1, 0, 4),))
    placement = solve_placement(plan, cl, current=current).placement
    workers = placement.by_name()
    assert workers["train-0"].gpu_ids == (0, 4)
    new = workers["train-1"].gpu_ids
    assert len(new) == 2 and [cl.node_of(g) for g in new] == [0, 1]
    assert len(placement.gpus_used()) == 4


def test_wide_instance_conflicts_are_listed_widest_first() -> None:
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(8, 1), (16, 1)]), cluster(8, 4))
    assert info.value.conflicts == (
        "instance rollout-tp16-0 needs 16 GPUs in one node but nodes have 4",
        "instance rollout-tp8-0 needs 8 GPUs in one node but nodes have 4",
    )


def test_a_model_that_exactly_fills_the_gpu_fits() -> None:
    """The rollout memory check is `need <= capacity`: a GPU whose memory is exactly the weight shard plus the KV
    reserve holds the instance."""
    model = get_model("Qwen3-14B")
    exact = attrs.evolve(A800, name="exact", memory_gb=rollout_gb_per_gpu(model, 2, 4096))
    placement = place(make_plan(1, 1, 0, 1, [(2, 1)]), cluster(1, 2, exact), model=model)
    assert placement.by_name()["rollout-tp2-0"].gpu_ids == (0, 1)


def test_the_smallest_fitting_degree_is_looked_for_inside_a_node_only() -> None:
    """One-GPU nodes: Llama-3-70B does not fit TP-1; TP-2 would fit but no node has 2 GPUs, so the hint is that
    the model fits nowhere (mutant: the search runs to `gpus_per_node + 1` and suggests TP-2)."""
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(1, 1)]), cluster(2, 1), model=get_model("Llama-3-70B"))
    (conflict,) = info.value.conflicts
    assert "Llama-3-70B fits nowhere: even TP-1 (a whole node)" in conflict


def test_the_kv_reserve_reaches_the_memory_check() -> None:
    """Qwen3-14B on one A800 GPU: fits with the default 4,096-token reserve, not with a 10^6-token one."""
    model = get_model("Qwen3-14B")
    plan = make_plan(1, 1, 0, 1, [(1, 1)])
    assert rollout_gb_per_gpu(model, 1, 4096) <= A800.memory_gb < rollout_gb_per_gpu(model, 1, 1_000_000)
    place(plan, cluster(1, 1), model=model)
    with pytest.raises(InfeasiblePlacementError, match="KV reserve of 1000000 tokens"):
        place(plan, cluster(1, 1), model=model, kv_reserve_tokens=1_000_000)


@pytest.mark.parametrize(
    ("num_nodes", "tp", "dp", "instances"),
    [(2, 2, 1, []), (3, 2, 1, []), (3, 1, 2, [(1, 1)]), (4, 2, 2, [(2, 1)]), (3, 4, 1, [(2, 1)])],
)
def test_nodes_modelled_one_by_one_are_used_in_node_order(
    monkeypatch: pytest.MonkeyPatch, num_nodes: int, tp: int, dp: int, instances: list[tuple[int, int]]
) -> None:
    """The per-node fallback's symmetry breaking (`model.py`): interchangeable single nodes are used in node order,
    training first, so a fresh placement uses a prefix of the nodes with training counts non-increasing (mutant:
    each node ordered only against the node two further on)."""
    monkeypatch.setattr(patterns, "MAX_PATTERNS", -1)
    cl = cluster(num_nodes, 4)
    placement = place(make_plan(tp, 1, dp, 1, instances), cl)
    used = [any(cl.node_of(g) == n for g in placement.gpus_used()) for n in range(num_nodes)]
    train = [
        sum(cl.node_of(g) == n for w in placement.workers if w.role is Role.TRAIN_REPLICA for g in w.gpu_ids)
        for n in range(num_nodes)
    ]
    assert used == sorted(used, reverse=True)
    assert train == sorted(train, reverse=True)


# Found by the whole-run of `bash scripts/mutation.sh placement` (docs/testing.md).


def _node_solution(counts: dict[str, tuple[int, ...]]) -> NodeSolution:
    return NodeSolution(counts=counts, kept=frozenset(), objective=0, optimal=True, solve_time_s=0.0)


def test_a_node_solution_over_a_nodes_capacity_is_a_model_error() -> None:
    """`assign_gpus` checks what it is given: two TP-4 instances counted on one 4-GPU node."""
    cl = cluster(2, 4)
    problem = build_problem(make_plan(1, 1, 0, 1, [(4, 2)]), cl)
    with pytest.raises(PlacementModelError) as info:
        assign_gpus(problem, _node_solution({"rollout-tp4": (2, 0)}))
    assert str(info.value) == (
        "node 0 has 0 free GPUs left but the solution puts 4 more there (the node-level solution violates capacity)"
    )


@pytest.mark.parametrize("counts", [(1, 0), (2, 1)])
def test_a_node_solution_with_the_wrong_training_stage_count_is_a_model_error(counts: tuple[int, int]) -> None:
    """Two replicas of 2 stages need 4 training units: 1 (too few slots) and 3 (a block short of a stage) are bugs
    of the node-level model, reported as such."""
    problem = build_problem(make_plan(1, 2, 2, 1, []), cluster(2, 4))
    with pytest.raises(PlacementModelError, match=f"the solution has {sum(counts)} free training stages for 2 blocks"):
        assign_gpus(problem, _node_solution({"train": counts}))


def test_a_current_gpu_id_just_past_the_cluster_is_not_keepable() -> None:
    """A current worker on GPU id `num_gpus` (one past the last) cannot be kept; the placement still works."""
    cl = cluster(1, 4)
    current = Placement(workers=(rollout_at("rollout-tp1-0", 4),))
    result = solve_placement(make_plan(1, 1, 0, 1, [(1, 1)]), cl, current=current)
    assert result.cost.moves == 1
    assert result.placement.by_name()["rollout-tp1-0"].gpu_ids == (0,)


def test_a_role_or_tp_change_alone_is_a_move() -> None:
    same_gpus_other_role = replica_at("w", 2, 0, 1)
    assert moved(rollout_at("w", 0, 1), same_gpus_other_role)
    assert moved(replica_at("w", 2, 0, 1), replica_at("w", 1, 0, 1))  # TP 2 -> TP 1 x PP 2 on the same GPUs
    assert not moved(rollout_at("w", 0, 1), rollout_at("w", 1, 0))


def test_rollout_memory_is_in_gigabytes_of_1e9_bytes() -> None:
    model = get_model("Qwen3-14B")
    assert rollout_gb_per_gpu(model, 2, 4096) == (model.weight_bytes / 2 + 4096 * model.kv_bytes_per_token(2)) / 1e9


def test_the_hint_names_a_degree_that_exactly_fills_the_gpu() -> None:
    model = get_model("Qwen3-14B")
    exact = attrs.evolve(A800, name="exact", memory_gb=rollout_gb_per_gpu(model, 2, 4096))
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(1, 1)]), cluster(1, 4, exact), model=model)
    (conflict,) = info.value.conflicts
    assert conflict.endswith("the smallest TP degree that fits is TP-2")


def test_place_passes_its_time_limit_and_defaults_to_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = place_module.solve_nodes

    def spy(problem, *, time_limit_s, num_workers):
        seen.append((time_limit_s, num_workers))
        return real(problem, time_limit_s=time_limit_s, num_workers=num_workers)

    monkeypatch.setattr(place_module, "solve_nodes", spy)
    plan = make_plan(1, 1, 0, 1, [(1, 1)])
    place(plan, cluster(1, 4))
    place(plan, cluster(1, 4), time_limit_s=3.0)
    assert seen == [(10.0, 1), (3.0, 1)]


def test_a_node_solution_with_the_wrong_rollout_slot_count_is_a_model_error() -> None:
    problem = build_problem(make_plan(1, 1, 0, 1, [(1, 2)]), cluster(2, 4))
    with pytest.raises(PlacementModelError) as info:
        assign_gpus(problem, _node_solution({"rollout-tp1": (1, 0)}))
    assert str(info.value) == "the solution has 1 free rollout-tp1 slots for 2 instances"


def test_place_keeps_the_current_placement() -> None:
    """`place` (not only `solve_placement`) passes `current`: an instance on the last GPU stays there."""
    current = Placement(workers=(rollout_at("rollout-tp1-0", 7),))
    placement = place(make_plan(1, 1, 0, 1, [(1, 1)]), cluster(2, 4), current=current)
    assert placement.by_name()["rollout-tp1-0"].gpu_ids == (7,)


def test_rollout_instances_take_gpu_ids_widest_first() -> None:
    cl = cluster(1, 4)
    plan = make_plan(1, 1, 0, 1, [(1, 1), (2, 1)])
    assert describe(place(plan, cl), build_problem(plan, cl)) == "node 0: rollout-tp2-0 rollout-tp2-0 rollout-tp1-0 -"


def test_a_plan_without_training_ignores_the_training_fields() -> None:
    """With dp = 0 the training TP degree and memory are not checked (no replica exists)."""
    wide = make_plan(8, 1, 0, 1, [(1, 2)])
    heavy = attrs.evolve(wide, train=attrs.evolve(wide.train, memory_gb=95.0))
    for plan in (wide, heavy):
        assert len(place(plan, cluster(1, 4)).workers) == 2


@pytest.mark.parametrize(("memory_gb", "fits"), [(80.0, True), (80.5, False)])
def test_training_memory_up_to_the_gpu_fits(memory_gb: float, fits: bool) -> None:
    plan = make_plan(2, 1, 1, 1, [])
    plan = attrs.evolve(plan, train=attrs.evolve(plan.train, memory_gb=memory_gb))
    if fits:
        place(plan, cluster(1, 4))
    else:
        with pytest.raises(InfeasiblePlacementError, match="train-0 needs 80.5 GB per GPU"):
            place(plan, cluster(1, 4))


def test_the_ep_block_conflict_names_the_replicas_of_the_block() -> None:
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(2, 1, 4, 4, []), cluster(2, 4))
    assert info.value.conflicts[0].startswith("replicas train-0..train-3 form an EP block (ep=4 replicas x TP-2 = ")


def test_the_hint_can_name_a_whole_node() -> None:
    """Two-GPU nodes: Llama-3-70B needs TP-2, the whole node (mutant: the search stops before the last degrees)."""
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(1, 1)]), cluster(2, 2), model=get_model("Llama-3-70B"))
    (conflict,) = info.value.conflicts
    assert conflict.endswith("the smallest TP degree that fits is TP-2")


def test_an_infeasible_placement_says_so_before_the_conflicts() -> None:
    with pytest.raises(InfeasiblePlacementError) as info:
        place(make_plan(1, 1, 0, 1, [(4, 3)]), cluster(2, 6))
    assert str(info.value).startswith("infeasible placement, these constraints conflict")


def test_solve_placement_defaults_to_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = place_module.solve_nodes

    def spy(problem, *, time_limit_s, num_workers):
        seen.append(time_limit_s)
        return real(problem, time_limit_s=time_limit_s, num_workers=num_workers)

    monkeypatch.setattr(place_module, "solve_nodes", spy)
    solve_placement(make_plan(1, 1, 0, 1, [(1, 1)]), cluster(1, 4))
    assert seen == [10.0]
