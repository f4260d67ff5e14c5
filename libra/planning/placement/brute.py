"""Exhaustive oracles for placement, for tests on small instances only (exponential time).

- `brute_force_nodes`: every subset of keepable workers to keep, then every assignment of the remaining units to
  nodes (units of one kind are identical, so assignments are enumerated as per-node counts, kind by kind, pruned
  by node capacity). It shares `build_problem` with the solver but none of its decomposition (no entities,
  classes, patterns or dominance rules).
- `brute_force_gpus`: every assignment of concrete GPU ids to every worker (no node-level reasoning at all),
  evaluated with `placement_cost`. It checks the claim that the node-level model loses no optimality.

Both return the optimal `PlacementCost`, or None when no placement exists.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from libra.planning.placement.problem import TRAIN_KIND, PlacementCost, PlacementProblem, placement_cost, plan_workers
from libra.spec import ClusterSpec, Placement, Plan, WorkerPlacement


def _pinned(problem: PlacementProblem, kept: tuple) -> dict[str, list[int]] | None:
    """Per-kind per-node units fixed by the kept workers, or None if two kept replicas of one EP block disagree
    on a stage's node."""
    num_nodes = problem.cluster.num_nodes
    pinned = {k.key: [0] * num_nodes for k in problem.kinds}
    block_nodes: dict[int, tuple[int, ...]] = {}
    for o in kept:
        w = problem.worker(o.name)
        if w.kind != TRAIN_KIND:
            pinned[w.kind][o.nodes[0]] += 1
        elif block_nodes.setdefault(w.block, o.nodes) != o.nodes:
            return None
    for nodes in block_nodes.values():
        for n in nodes:
            pinned[TRAIN_KIND][n] += 1
    return pinned


def _spread(count: int, room: list[int], size: int) -> Iterator[tuple[int, ...]]:
    """Every way to put `count` identical units of `size` GPUs on nodes with `room` free GPUs."""
    if not room:
        if count == 0:
            yield ()
        return
    for here in range(min(count, room[0] // size) + 1):
        for rest in _spread(count - here, room[1:], size):
            yield (here, *rest)


def _search(
    problem: PlacementProblem,
    i: int,
    pinned: dict[str, list[int]],
    room: list[int],
    totals: dict[str, list[int]],
    moves: int,
) -> PlacementCost | None:
    """Best cost over every spread of kinds `i..` onto the nodes' `room`."""
    kinds, num_nodes = problem.kinds, problem.cluster.num_nodes
    if i == len(kinds):
        train = totals.get(TRAIN_KIND, [0] * num_nodes)
        return PlacementCost(
            moves=moves,
            train_nodes=sum(1 for x in train if x),
            nodes=sum(1 for n in range(num_nodes) if any(t[n] for t in totals.values())),
        )
    kind = kinds[i]
    left = kind.count - sum(pinned[kind.key])
    if left < 0:
        return None
    best = None
    for spread in _spread(left, room, kind.size):
        totals[kind.key] = [a + b for a, b in zip(pinned[kind.key], spread)]
        cost = _search(problem, i + 1, pinned, [x - kind.size * s for x, s in zip(room, spread)], totals, moves)
        if cost is not None and (best is None or cost < best):
            best = cost
    totals.pop(kind.key, None)
    return best


def brute_force_nodes(problem: PlacementProblem) -> PlacementCost | None:
    g, num_nodes = problem.cluster.gpus_per_node, problem.cluster.num_nodes
    best: PlacementCost | None = None
    for r in range(len(problem.old) + 1):
        for kept in itertools.combinations(problem.old, r):
            pinned = _pinned(problem, kept)
            if pinned is None:
                continue
            room = [g - sum(k.size * pinned[k.key][n] for k in problem.kinds) for n in range(num_nodes)]
            if min(room, default=0) < 0:
                continue
            cost = _search(problem, 0, pinned, room, {}, problem.matched - r)
            if cost is not None and (best is None or cost < best):
                best = cost
    return best


def _groups(cluster: ClusterSpec, free: frozenset[int], sizes: list[int]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every ordered choice of disjoint GPU groups of the given sizes, each group inside one node."""
    if not sizes:
        yield ()
        return
    for n in range(cluster.num_nodes):
        here = sorted(g for g in cluster.gpus_of_node(n) if g in free)
        for group in itertools.combinations(here, sizes[0]):
            for rest in _groups(cluster, free - set(group), sizes[1:]):
                yield (group, *rest)


def brute_force_gpus(
    plan: Plan, cluster: ClusterSpec, problem: PlacementProblem, current: Placement | None
) -> PlacementCost | None:
    """Enumerate concrete GPU ids. Training is enumerated per EP block and stage: the block-stage's `k * tp` GPUs
    in one node, split in order among the block's `k` replicas."""
    workers, k = plan_workers(plan)
    replicas = [w for w in workers if w.kind == TRAIN_KIND]
    blocks = [replicas[i : i + k] for i in range(0, len(replicas), k)]
    instances = [w for w in workers if w.kind != TRAIN_KIND]
    best: PlacementCost | None = None

    def rec(bi: int, free: frozenset[int], chosen: dict[str, tuple[int, ...]]) -> None:
        nonlocal best
        if bi < len(blocks):
            block = blocks[bi]
            tp, pp = block[0].tp, block[0].num_stages
            stage_choices = _groups(cluster, free, [tp * len(block)] * pp)
            for stages in stage_choices:
                used = {g for s in stages for g in s}
                for splits in itertools.product(*(_orderings(s, tp, len(block)) for s in stages)):
                    nxt = dict(chosen)
                    for j, r in enumerate(block):
                        nxt[r.name] = tuple(g for split in splits for g in split[j])
                    rec(bi + 1, free - used, nxt)
            return
        for groups in _groups(cluster, free, [w.tp for w in instances]):
            final = dict(chosen)
            final.update({w.name: grp for w, grp in zip(instances, groups)})
            placement = Placement(
                workers=tuple(
                    WorkerPlacement(name=w.name, role=w.role, tp=w.tp, pool=w.pool, gpu_ids=final[w.name])
                    for w in workers
                )
            )
            cost = placement_cost(placement, problem, current)
            best = cost if best is None or cost < best else best

    rec(0, frozenset(range(cluster.num_gpus)), {})
    return best


def _orderings(stage: tuple[int, ...], tp: int, k: int) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every split of a block-stage's GPUs into `k` ordered TP groups of `tp` (one per replica)."""
    if k == 1:
        yield (stage,)
        return
    for first in itertools.combinations(stage, tp):
        rest = tuple(g for g in stage if g not in first)
        for tail in _orderings(rest, tp, k - 1):
            yield (first, *tail)
