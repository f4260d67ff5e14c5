"""From node counts to concrete GPU ids, deterministically.

Order of filling: kept workers take back their old GPUs; then, node by node, training takes the lowest free GPU
ids (replicas of a block that a kept replica pins first, then the other blocks), then rollout instances from the
widest TP degree down, so that every unit gets a run of free ids in its node. Free training blocks are formed from
the per-node stage counts so that replicas stay contiguous: first every whole replica that fits in one node
(`pp` stages there), then the leftover stages chained in node order, so a replica crosses as few node boundaries
as the counts allow under this rule (a heuristic tie-break: the counts, not this step, are what CP-SAT optimises).
"""

from __future__ import annotations

from collections import defaultdict

from libra.planning.placement.errors import PlacementModelError
from libra.planning.placement.model import NodeSolution
from libra.planning.placement.problem import TRAIN_KIND, PlacementProblem, WorkerShape
from libra.spec import Placement, WorkerPlacement


class _FreeGPUs:
    def __init__(self, problem: PlacementProblem, taken: set[int]) -> None:
        cluster = problem.cluster
        self._free = {n: [g for g in cluster.gpus_of_node(n) if g not in taken] for n in range(cluster.num_nodes)}

    def take(self, node: int, size: int) -> tuple[int, ...]:
        ids = self._free[node][:size]
        if len(ids) < size:
            raise PlacementModelError(
                f"node {node} has {len(ids)} free GPUs left but the solution puts {size} more "
                "there (the node-level solution violates capacity)"
            )
        del self._free[node][:size]
        return tuple(ids)


def _train_slots(remaining: list[int], pp: int) -> list[list[int]]:
    """Stage nodes of the free blocks: whole blocks inside one node first, then leftovers chained in node order."""
    blocks, leftover = [], []
    for n, count in enumerate(remaining):
        blocks.extend([[n] * pp for _ in range(count // pp)])
        leftover.extend([n] * (count % pp))
    blocks.extend(leftover[i : i + pp] for i in range(0, len(leftover), pp))
    return blocks


def _assign_training(
    problem: PlacementProblem, solution: NodeSolution, free: _FreeGPUs, groups: dict[str, tuple[tuple[int, ...], ...]]
) -> None:
    replicas = [w for w in problem.workers if w.kind == TRAIN_KIND]
    if not replicas:
        return
    k, pp, tp = problem.train_block, problem.train_stages, replicas[0].tp
    old = {o.name: o for o in problem.old}
    blocks: dict[int, list[WorkerShape]] = defaultdict(list)
    for r in replicas:
        blocks[r.block].append(r)
    remaining = list(solution.counts[TRAIN_KIND])
    free_blocks = []
    for _, members in sorted(blocks.items()):
        pinned = next((old[r.name] for r in members if r.name in solution.kept), None)
        if pinned is None:
            free_blocks.append(members)
            continue
        for n in pinned.nodes:
            remaining[n] -= 1
            for r in members:
                if r.name not in solution.kept:
                    groups[r.name] = groups.get(r.name, ()) + (free.take(n, tp),)
    slots = _train_slots(remaining, pp)
    if len(slots) != len(free_blocks) or any(len(s) != pp for s in slots):
        raise PlacementModelError(
            f"the solution has {sum(remaining)} free training stages for {len(free_blocks)} blocks of {pp} stages"
        )
    for members, nodes in zip(free_blocks, slots):
        for n in nodes:
            ids = free.take(n, k * tp)
            for j, r in enumerate(members):
                groups[r.name] = groups.get(r.name, ()) + (ids[j * tp : (j + 1) * tp],)


def _assign_rollout(
    problem: PlacementProblem, solution: NodeSolution, free: _FreeGPUs, groups: dict[str, tuple[tuple[int, ...], ...]]
) -> None:
    old = {o.name: o for o in problem.old}
    for kind in problem.kinds:
        if kind.key == TRAIN_KIND:
            continue
        remaining = list(solution.counts[kind.key])
        movers = []
        for w in problem.workers:
            if w.kind != kind.key:
                continue
            if w.name in solution.kept:
                remaining[old[w.name].nodes[0]] -= 1
            else:
                movers.append(w)
        slots = [n for n, count in enumerate(remaining) for _ in range(count)]
        if len(slots) != len(movers) or any(count < 0 for count in remaining):
            raise PlacementModelError(
                f"the solution has {len(slots)} free {kind.key} slots for {len(movers)} instances"
            )
        for w, n in zip(movers, slots):
            groups[w.name] = (free.take(n, kind.size),)


def assign_gpus(problem: PlacementProblem, solution: NodeSolution) -> Placement:
    """Concrete GPU ids for every worker of the plan, in plan order."""
    old = {o.name: o for o in problem.old}
    groups: dict[str, tuple[tuple[int, ...], ...]] = {name: old[name].groups for name in solution.kept}
    free = _FreeGPUs(problem, {g for name in solution.kept for g in old[name].gpu_ids})
    _assign_training(problem, solution, free, groups)
    _assign_rollout(problem, solution, free, groups)
    return Placement(
        workers=tuple(
            WorkerPlacement(
                name=w.name,
                role=w.role,
                tp=w.tp,
                pool=w.pool,
                gpu_ids=tuple(g for group in groups[w.name] for g in group),
            )
            for w in problem.workers
        )
    )


def describe(placement: Placement, problem: PlacementProblem) -> str:
    """One line per node listing the worker on each GPU (`-` for a free GPU), for logs and docs."""
    cluster = problem.cluster
    owner = {g: w.name for w in placement.workers for g in w.gpu_ids}
    return "\n".join(
        f"node {n}: " + " ".join(owner.get(g, "-") for g in cluster.gpus_of_node(n)) for n in range(cluster.num_nodes)
    )
