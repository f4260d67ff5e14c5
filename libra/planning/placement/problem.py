"""The placement problem as data: which workers a plan has, what each one needs, and what a current placement offers.

Notation (used by `model.py`, `assign.py` and `brute.py`)
-------------------------------------------------------
- `N` nodes of `G` GPUs each (`cluster.num_nodes`, `cluster.gpus_per_node`).
- A **unit** is a set of GPUs that must share one node. A rollout instance of degree `tp` is one unit of `tp` GPUs.
  A training replica has `pp` pipeline stages; stage `s` of a replica is its TP group of `tp` GPUs.
- **EP block.** As in Megatron-core (and `TrainConfig`), the expert layers of a stage are split over `ep` ranks
  taken from the data-parallel ranks: for TP rank `j`, the EP group of block `b` is TP rank `j` of the stage-`s` TP
  groups of the `ep` replicas `b*ep .. b*ep + ep - 1`. Each EP group meets every TP group of those replicas, so
  "every EP group and every TP group inside one node" holds exactly when the stage-`s` TP groups of the block's
  `k = ep` replicas share one node. A training unit is one **block-stage**: `k * tp` GPUs in one node, and the plan
  has `(dp / k) * pp` of them (`ep` divides `dp`). With `ep = 1` a unit is one stage's TP group.
- A **kind** groups units of equal shape: `train` (block-stages) and `rollout-tp<x>` (instances of degree `x`).
- A worker of `current` with the same name, role, `tp` and GPU count, whose GPUs lie in the cluster and whose TP
  groups each lie in one node, is **keepable**: the solver may give it back exactly its old GPUs. If `current` gives
  one GPU to two workers, only the first of them (in plan order) is keepable.

`gpu_ids` lists a training replica stage by stage (stage 0's TP group first); within a TP group the order carries
no meaning, so two placements of a worker are equal when each TP group holds the same GPU set
(`normalized_groups`). A worker **moves** when that changes, or its role or TP degree does (`moved`).
"""

from __future__ import annotations

import attrs

from libra.planning.placement.errors import InfeasiblePlacementError
from libra.spec import ClusterSpec, ModelSpec, Placement, Plan, Pool, Role, WorkerPlacement

TRAIN_KIND = "train"
DEFAULT_KV_RESERVE_TOKENS = 4096


def rollout_kind(tp: int) -> str:
    return f"rollout-tp{tp}"


@attrs.frozen(kw_only=True)
class UnitKind:
    """`count` interchangeable units of `size` GPUs, each inside one node."""

    key: str
    size: int
    count: int
    label: str


@attrs.frozen(kw_only=True)
class WorkerShape:
    """One worker of the plan: `num_stages` TP groups of `tp` GPUs. Training replica `i` is in EP block `i // k`."""

    name: str
    role: Role
    pool: Pool
    tp: int
    num_stages: int
    kind: str
    block: int

    @property
    def num_gpus(self) -> int:
        return self.tp * self.num_stages


@attrs.frozen(kw_only=True)
class OldWorker:
    """A keepable worker's GPUs in `current`: `groups[s]` is stage `s`'s TP group, on node `nodes[s]`."""

    name: str
    groups: tuple[tuple[int, ...], ...]
    nodes: tuple[int, ...]

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return tuple(g for group in self.groups for g in group)


@attrs.frozen(kw_only=True)
class PlacementProblem:
    """Everything the solvers need. `matched` counts workers of `current` that the plan keeps by name (keepable or
    not); `unkeepable` counts those that must move whatever the solver does (shape or GPUs no longer valid)."""

    cluster: ClusterSpec
    kinds: tuple[UnitKind, ...]
    workers: tuple[WorkerShape, ...]
    train_block: int
    train_stages: int
    old: tuple[OldWorker, ...]
    matched: int
    unkeepable: int

    def worker(self, name: str) -> WorkerShape:
        return next(w for w in self.workers if w.name == name)

    def nodes_touched_by_current(self) -> set[int]:
        return {n for o in self.old for n in o.nodes}


def normalized_groups(gpu_ids: tuple[int, ...] | list[int], tp: int) -> tuple[tuple[int, ...], ...]:
    """Split `gpu_ids` into TP groups of `tp` (stage order kept) and sort each group."""
    ids = tuple(gpu_ids)
    return tuple(tuple(sorted(ids[i : i + tp])) for i in range(0, len(ids), tp))


def plan_workers(plan: Plan) -> tuple[tuple[WorkerShape, ...], int]:
    """Workers of `plan` with stable names: `train-<i>` and `rollout-tp<x>-<i>` (numbered per TP degree across
    instance groups, in plan order). Returns the workers and `k`, the replicas per EP block."""
    t = plan.train
    k = t.ep if t.dp > 0 else 1
    workers = [
        WorkerShape(
            name=f"train-{i}",
            role=Role.TRAIN_REPLICA,
            pool=Pool.CORE_TRAIN,
            tp=t.tp,
            num_stages=t.pp,
            kind=TRAIN_KIND,
            block=i // k,
        )
        for i in range(t.dp)
    ]
    per_tp: dict[int, int] = {}
    for group in plan.rollout.instances:
        for _ in range(group.count):
            i = per_tp.get(group.tp, 0)
            per_tp[group.tp] = i + 1
            workers.append(
                WorkerShape(
                    name=f"rollout-tp{group.tp}-{i}",
                    role=Role.ROLLOUT_INSTANCE,
                    pool=Pool.CORE_ROLLOUT,
                    tp=group.tp,
                    num_stages=1,
                    kind=rollout_kind(group.tp),
                    block=len(workers),
                )
            )
    return tuple(workers), k


def _kinds(plan: Plan, workers: tuple[WorkerShape, ...], k: int) -> tuple[UnitKind, ...]:
    kinds = []
    t = plan.train
    if t.dp > 0:
        span = f"EP block of {k} replicas x TP-{t.tp}" if k > 1 else f"TP-{t.tp} group"
        kinds.append(
            UnitKind(
                key=TRAIN_KIND,
                size=k * t.tp,
                count=(t.dp // k) * t.pp,
                label=f"training: {t.dp} replicas x {t.pp} stages, each stage's {span} ({k * t.tp} GPUs) in one node",
            )
        )
    for tp in sorted({w.tp for w in workers if w.role is Role.ROLLOUT_INSTANCE}, reverse=True):
        n = sum(1 for w in workers if w.kind == rollout_kind(tp))
        kinds.append(
            UnitKind(key=rollout_kind(tp), size=tp, count=n, label=f"rollout: {n} TP-{tp} instances, each in one node")
        )
    return tuple(kinds)


def _precheck(
    plan: Plan,
    cluster: ClusterSpec,
    workers: tuple[WorkerShape, ...],
    k: int,
    model: ModelSpec | None,
    kv_reserve_tokens: int,
) -> list[str]:
    """Conflicts visible without search: GPU totals, units wider than a node, a model or a replica that does not
    fit in one GPU's memory."""
    g, n_nodes = cluster.gpus_per_node, cluster.num_nodes
    shape = f"{n_nodes} nodes x {g} GPUs"
    out = []
    used = sum(w.num_gpus for w in workers)
    if plan.num_gpus > cluster.num_gpus or used > cluster.num_gpus:
        out.append(
            f"the plan needs {max(plan.num_gpus, used)} GPUs (training {plan.train.num_gpus} + rollout "
            f"{plan.rollout.num_gpus}) but the cluster has {cluster.num_gpus} ({shape})"
        )
    t = plan.train
    if t.dp > 0 and k * t.tp > g:
        if k == 1:
            out.append(
                f"replica train-0 needs each stage's TP-{t.tp} group ({t.tp} GPUs) in one node but nodes have {g}"
            )
        else:
            out.append(
                f"replicas train-0..train-{k - 1} form an EP block (ep={t.ep} replicas x TP-{t.tp} = "
                f"{k * t.tp} GPUs per stage) that must share one node but nodes have {g}"
            )
    wide = sorted({w.tp for w in workers if w.role is Role.ROLLOUT_INSTANCE and w.tp > g}, reverse=True)
    for tp in wide:
        n = sum(1 for w in workers if w.kind == rollout_kind(tp))
        more = f" (and {n - 1} more TP-{tp} instances)" if n > 1 else ""
        out.append(f"instance rollout-tp{tp}-0 needs {tp} GPUs in one node but nodes have {g}{more}")
    cap = cluster.gpu.memory_gb
    if t.dp > 0 and t.memory_gb > cap:
        out.append(
            f"replica train-0 needs {t.memory_gb:.1f} GB per GPU (plan.train.memory_gb) but "
            f"{cluster.gpu.name} has {cap:g} GB"
        )
    if model is not None:
        out.extend(_rollout_memory(workers, cluster, model, kv_reserve_tokens))
    return out


def rollout_gb_per_gpu(model: ModelSpec, tp: int, kv_reserve_tokens: int) -> float:
    """Memory one GPU of a TP-`tp` instance needs: its shard of the weights plus a KV reserve of
    `kv_reserve_tokens` tokens (activations and the CUDA context are not counted)."""
    return (model.weight_bytes / tp + kv_reserve_tokens * model.kv_bytes_per_token(tp)) / 1e9


def _rollout_memory(
    workers: tuple[WorkerShape, ...], cluster: ClusterSpec, model: ModelSpec, kv_reserve_tokens: int
) -> list[str]:
    cap = cluster.gpu.memory_gb
    out = []
    for tp in sorted({w.tp for w in workers if w.role is Role.ROLLOUT_INSTANCE}):
        need = rollout_gb_per_gpu(model, tp, kv_reserve_tokens)
        if need <= cap:
            continue
        fits = [
            d for d in range(1, cluster.gpus_per_node + 1) if rollout_gb_per_gpu(model, d, kv_reserve_tokens) <= cap
        ]
        hint = (
            f"the smallest TP degree that fits is TP-{fits[0]}"
            if fits
            else f"{model.name} fits nowhere: even TP-{cluster.gpus_per_node} (a whole node) needs "
            f"{rollout_gb_per_gpu(model, cluster.gpus_per_node, kv_reserve_tokens):.1f} GB per GPU"
        )
        out.append(
            f"instance rollout-tp{tp}-0 needs {need:.1f} GB per GPU ({model.weight_bytes / 1e9:.1f} GB of "
            f"{model.name} weights / TP-{tp} + KV reserve of {kv_reserve_tokens} tokens) but "
            f"{cluster.gpu.name} has {cap:g} GB; {hint}"
        )
    return out


def _keepable(shape: WorkerShape, old: WorkerPlacement, cluster: ClusterSpec) -> OldWorker | None:
    ids = old.gpu_ids
    if old.role is not shape.role or old.tp != shape.tp or len(ids) != shape.num_gpus or len(set(ids)) != len(ids):
        return None
    if not all(0 <= g < cluster.num_gpus for g in ids):
        return None
    groups = normalized_groups(ids, shape.tp)
    nodes = []
    for group in groups:
        group_nodes = {cluster.node_of(g) for g in group}
        if len(group_nodes) != 1:
            return None
        nodes.append(group_nodes.pop())
    return OldWorker(name=shape.name, groups=groups, nodes=tuple(nodes))


def build_problem(
    plan: Plan,
    cluster: ClusterSpec,
    *,
    model: ModelSpec | None = None,
    current: Placement | None = None,
    kv_reserve_tokens: int = DEFAULT_KV_RESERVE_TOKENS,
) -> PlacementProblem:
    """Read `plan` and `current` into a `PlacementProblem`; raise `InfeasiblePlacementError` for conflicts that
    need no search (see `_precheck`)."""
    workers, k = plan_workers(plan)
    conflicts = _precheck(plan, cluster, workers, k, model, kv_reserve_tokens)
    if conflicts:
        raise InfeasiblePlacementError(conflicts)
    old, matched, unkeepable = [], 0, 0
    if current is not None:
        by_name = current.by_name()
        held: set[int] = set()
        for w in workers:
            if w.name not in by_name:
                continue
            matched += 1
            kept = _keepable(w, by_name[w.name], cluster)
            # A current placement that reuses a GPU is repaired: the later worker (plan order) cannot be kept.
            if kept is None or held.intersection(kept.gpu_ids):
                unkeepable += 1
            else:
                held.update(kept.gpu_ids)
                old.append(kept)
    return PlacementProblem(
        cluster=cluster,
        kinds=_kinds(plan, workers, k),
        workers=workers,
        train_block=k,
        train_stages=plan.train.pp,
        old=tuple(old),
        matched=matched,
        unkeepable=unkeepable,
    )


def moved(old: WorkerPlacement, new: WorkerPlacement) -> bool:
    """A worker moves when its role or TP degree changes (it must be rebuilt) or any TP group's GPU set does."""
    return (
        old.role is not new.role
        or old.tp != new.tp
        or normalized_groups(old.gpu_ids, old.tp) != normalized_groups(new.gpu_ids, new.tp)
    )


@attrs.frozen(kw_only=True, order=True)
class PlacementCost:
    """The lexicographic objective: workers moved, then nodes holding training GPUs, then nodes holding any GPU."""

    moves: int
    train_nodes: int
    nodes: int


def placement_cost(placement: Placement, problem: PlacementProblem, current: Placement | None) -> PlacementCost:
    """Evaluate a concrete placement (independently of how it was found)."""
    old = current.by_name() if current is not None else {}
    node_of = problem.cluster.node_of
    moves = sum(1 for w in placement.workers if w.name in old and moved(old[w.name], w))
    train = {node_of(g) for w in placement.workers if w.role is Role.TRAIN_REPLICA for g in w.gpu_ids}
    return PlacementCost(moves=moves, train_nodes=len(train), nodes=len({node_of(g) for g in placement.gpus_used()}))
