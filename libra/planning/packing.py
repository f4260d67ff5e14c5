"""Whether a plan's units pack into the cluster's nodes, as constraints the planner's search can carry.

A **unit** is a set of GPUs that must share one node (`placement/problem.py`): a rollout instance of degree `x` is a
unit of `x` GPUs, a training EP block stage one of `ep * tp` (the plan has `(dp / ep) * pp` of them). On `N` nodes of
`G` GPUs, when the unit sizes form a divisibility chain (each divides the next larger: powers of two), a multiset of
units packs iff for every size `s` present

    L(s) := GPUs in units of size >= s  <=  cap(s) := N * floor(G / s) * s.

Necessary: on one node the units of size >= s are multiples of s and fit in G GPUs, so they hold at most
floor(G / s) * s. Sufficient: place units largest first, each on any node with room; when the units of size s are
placed, every node holds a multiple of s (all earlier units are multiples of s), so a node has room for one more
iff it holds less than floor(G / s) * s, and the units fit while L(s) <= cap(s). Checked against an exhaustive
packer on every small multiset, and `place` (CP-SAT) places every plan of the planner's brute-force tests
(`tests/planning/test_packing.py`).

For a size not present the condition follows from the next larger size present (same L, and cap(s) >= cap(s')
where s divides s'), so it may be checked at any size of the chain. Where s divides G, cap(s) = N G, which the
GPU total already bounds; so only sizes that do not divide G constrain a plan, and only those whose cap is below
the GPU budget and below the caps of the smaller such sizes (L never grows with s) are kept (`thresholds`). On
8-GPU nodes with TP 1/2/4/8 none is, and the planner's search is the plain GPU count.

When the sizes form no chain (TP 3 or 6 beside powers of two, an EP x TP block of 6 beside TP 4) no per-size cap
decides: two units of 6 and one of 3 do not go into two nodes of 8 (15 GPUs of 16), two of 6 and one of 2 do.
Then `NodeFill` keeps the GPUs in units of each size above 1 in the state (one class per size) and asks an exact
packer (`packs_into_nodes`: exact reductions, best fit, then a DP over node patterns or a small integer program),
so the same packed search stays exact: a plan with no more units of any size than another packs whenever the
other does, so dropping dominated states loses no plan. Checked against the exhaustive packer and the planner's
brute force on such size sets (`tests/planning/test_packing.py`). Where every multiset within the budget packs
anyway (2/3/6 on nodes of 6, 1/2/3/4/6/12 on nodes of 12), `count_decides` proves it and nothing is tracked.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable

import attrs
import numpy as np

from libra.planning.rollout_dp import BucketChoice, CountBracket, RolloutTable
from libra.spec import ClusterSpec, SpecError


def is_chain(sizes: Iterable[int]) -> bool:
    """Each size divides the next larger one."""
    ordered = sorted(set(sizes))
    return all(b % a == 0 for a, b in zip(ordered, ordered[1:]))


def node_cap(num_nodes: int, gpus_per_node: int, size: int) -> int:
    """GPUs that units of size >= `size` (multiples of it) can hold at most: `N * floor(G / size) * size`."""
    return num_nodes * (gpus_per_node // size) * size


@attrs.frozen(kw_only=True)
class NodePacking:
    """The constraints a plan on `budget` GPUs must meet to pack: for each threshold size `s_p` (ascending), the
    GPUs in units of size >= `s_p` at most `caps[p]`. Built by `for_sizes`, which returns None where the GPU count
    alone decides (no size binds, or the sizes are no chain: then nothing here is exact)."""

    thresholds: tuple[int, ...]
    caps: tuple[int, ...]

    @classmethod
    def for_sizes(cls, cluster: ClusterSpec, sizes: Iterable[int], budget: int) -> NodePacking | None:
        ordered = sorted(set(sizes))
        if not ordered or not is_chain(ordered):
            return None
        thresholds, caps, bound = [], [], budget
        for s in ordered:
            cap = node_cap(cluster.num_nodes, cluster.gpus_per_node, s)
            if cap < bound:
                thresholds.append(s)
                caps.append(cap)
                bound = cap
        return cls(thresholds=tuple(thresholds), caps=tuple(caps)) if thresholds else None

    def unit_class(self, size: int) -> int:
        """How many thresholds `size` reaches: its units count in `loads` of thresholds 0 .. class - 1."""
        return sum(1 for s in self.thresholds if size >= s)

    def class_loads(self, k: int, gpus: int) -> tuple[int, ...]:
        """The loads `gpus` GPUs in units of class `k` add (they count at every threshold they reach)."""
        return tuple(gpus if p < k else 0 for p in range(len(self.thresholds)))

    def loads(self, units: Iterable[tuple[int, int]]) -> tuple[int, ...]:
        """Per threshold, the GPUs in units of at least that size; `units` as (size, count) pairs."""
        units = list(units)
        return tuple(sum(size * count for size, count in units if size >= s) for s in self.thresholds)

    def packs(self, units: Iterable[tuple[int, int]], reserved: tuple[int, ...] | None = None) -> bool:
        """The units, beside loads already `reserved` per threshold (a training side's), meet every threshold's cap
        (the GPU total is the caller's to check)."""
        return self.within(self.loads(units), reserved)

    def within(self, loads: tuple[int, ...], reserved: tuple[int, ...] | None = None) -> bool:
        """Per-threshold `loads`, plus `reserved` where given, stay within the caps."""
        held = reserved if reserved is not None else (0,) * len(self.caps)
        return all(a + r <= cap for a, r, cap in zip(loads, held, self.caps, strict=True))


@attrs.frozen(kw_only=True)
class NodeFill:
    """The node-packing constraints where the unit sizes form no chain (a TP degree of 3 or 6, an EP x TP block of
    6 beside TP 4): no per-size cap decides, so the state is the GPUs in units of each size above 1 (`thresholds`:
    a unit of 1 GPU fits any free GPU, so only the GPU total, the caller's, bounds those) and `within` asks the
    exact packer (`packs_into_nodes`). The same interface as `NodePacking`, with one class per size; `caps` bound
    each size on its own (N * floor(G / s) * s), to prune the packed DP's cells, not to decide."""

    thresholds: tuple[int, ...]
    caps: tuple[int, ...]
    num_nodes: int
    gpus_per_node: int

    @classmethod
    def for_sizes(cls, cluster: ClusterSpec, sizes: Iterable[int], budget: int) -> NodeFill | None:
        """None where the sizes form a chain (`NodePacking` decides those), all are 1, or the GPU count already
        decides on `budget` GPUs (`count_decides`)."""
        ordered = sorted(set(sizes))
        tracked = tuple(s for s in ordered if s > 1)
        n, g = cluster.num_nodes, cluster.gpus_per_node
        if is_chain(ordered) or not tracked or count_decides(tracked, n, g, budget):
            return None
        caps = tuple(node_cap(n, g, s) for s in tracked)
        return cls(thresholds=tracked, caps=caps, num_nodes=n, gpus_per_node=g)

    def unit_class(self, size: int) -> int:
        """1 + the index of `size` among the tracked sizes; 0 for 1-GPU units."""
        return self.thresholds.index(size) + 1 if size > 1 else 0

    def class_loads(self, k: int, gpus: int) -> tuple[int, ...]:
        return tuple(gpus if p == k - 1 else 0 for p in range(len(self.thresholds)))

    def loads(self, units: Iterable[tuple[int, int]]) -> tuple[int, ...]:
        """Per tracked size, the GPUs in units of exactly that size; `units` as (size, count) pairs."""
        units = list(units)
        return tuple(sum(size * count for size, count in units if size == s) for s in self.thresholds)

    def packs(self, units: Iterable[tuple[int, int]], reserved: tuple[int, ...] | None = None) -> bool:
        return self.within(self.loads(units), reserved)

    def within(self, loads: tuple[int, ...], reserved: tuple[int, ...] | None = None) -> bool:
        """The units of `loads`, plus `reserved` where given, pack into the nodes (1-GPU units aside)."""
        held = reserved if reserved is not None else (0,) * len(self.thresholds)
        counts = [(s, (a + r) // s) for a, r, s in zip(loads, held, self.thresholds, strict=True)]
        return packs_into_nodes(counts, self.num_nodes, self.gpus_per_node)


Packing = NodePacking | NodeFill


def node_packing(cluster: ClusterSpec, sizes: Iterable[int], budget: int) -> Packing | None:
    """The constraints a plan with units of `sizes` on `budget` GPUs must meet to pack, or None where the GPU
    count alone decides: per-size caps on a chain (`NodePacking`), the exact packer otherwise (`NodeFill`)."""
    sizes = tuple(sizes)
    return NodePacking.for_sizes(cluster, sizes, budget) or NodeFill.for_sizes(cluster, sizes, budget)


# leftover multisets `count_decides` tests at most; beyond, it answers False (the packed search then decides)
LEFTOVER_BOX = 20_000


@functools.lru_cache(maxsize=256)
def count_decides(sizes: tuple[int, ...], num_nodes: int, gpus_per_node: int, budget: int) -> bool:
    """Whether every multiset of units of `sizes` (each at most a node) of at most `budget` GPUs packs into
    `num_nodes` nodes of `gpus_per_node` GPUs: then the GPU count alone decides and no packing need be tracked.

    With N nodes of G GPUs and B the budget (at most N G), call a multiset a *leftover* when it has fewer than
    G / s units of each size s. The rule: True iff B < the smallest size above 1, or B <= G, or every size above 1
    divides G and every leftover L of |L| <= B GPUs packs into N - floor((B - |L|) / G) nodes. True only where the
    count decides; False exactly where it does not wherever every size divides G (below), and, where one does not,
    wherever a single size already shows it (last point).

    - 1-GPU units fit any free GPU, so a multiset packs iff its larger units do and its total is at most N G; so
      only the sizes above 1 count, and nothing of fewer GPUs than the smallest of them can fail. With B <= G one
      node holds any multiset of at most B GPUs.
    - Sufficient (every size divides G): take any multiset M of |M| <= B. While some size s has G / s units, set
      them aside as one full node. After k such nodes what is left is a leftover L with |L| = |M| - k G, so
      k <= floor((B - |L|) / G), and L packs into N - floor((B - |L|) / G) <= N - k nodes: M packs into N.
    - Necessary: L itself is a multiset of at most B GPUs, so where floor((B - |L|) / G) = 0 a leftover that does
      not pack is a counterexample; where G is itself a size, L beside k units of G GPUs (each a node alone) is one
      for any k. For the other cases the equality is checked, not proved: on every size set of
      tests/planning/test_packing.py on 1-4 nodes of 1-12 GPUs, and 6/10/15 on nodes of 30, 4/6/10 and 10/12/15 on
      nodes of 60 (where 15 + 10 + 10 + 6 x 4 = 59 GPUs do not go into two nodes of 30), at every budget, the rule
      equals trying every multiset with the exhaustive packer.
    - A size s that does not divide G: N floor(G / s) + 1 units of s never pack (a node holds floor(G / s)), so
      where s (N floor(G / s) + 1) <= B the count does not decide (the planner's usual case: 3 or 6 on 8-GPU
      nodes, 4 on 6-GPU nodes, from N >= s nodes at a full budget). Where that multiset exceeds B (a few small
      nodes, or a small budget) the rule answers False although the count may decide: the packed search then
      runs, exact either way, only without the shortcut.

    `sizes` as given (sizes above 1 are kept); memoised (the planner asks once per plan). Beyond `LEFTOVER_BOX`
    leftovers to try it answers False (the packed search decides)."""
    n, g = num_nodes, gpus_per_node
    tracked = sorted({s for s in sizes if s > 1})
    if not tracked or budget < tracked[0] or budget <= g:
        return True
    if any(g % s for s in tracked) or math.prod(g // s for s in tracked) > LEFTOVER_BOX:
        return False
    for counts in itertools.product(*(range(g // s) for s in tracked)):
        used = sum(c * s for c, s in zip(counts, tracked, strict=True))
        if used <= budget and not packs_into_nodes(zip(tracked, counts), n - (budget - used) // g, g):
            return False
    return True


def packs_into_nodes(units: Iterable[tuple[int, int]], num_nodes: int, gpus_per_node: int) -> bool:
    """Whether (size, count) units of any sizes pack into `num_nodes` nodes of `gpus_per_node` GPUs, exactly.

    The planner's test where the sizes form no chain (`NodeFill.within`). On a chain the reductions below are the
    rule above, which the planner carries as caps instead (`NodePacking`: linear in the loads, so the DP can prune
    by them); there this function is the tests' oracle for that rule. Exact reductions first, each an iff: a
    common factor d of the sizes leaves floor(G / d) * d usable GPUs a node; a size with no room for even the
    smallest beside it takes a node alone; the smallest size, where it divides every other, fills any room the
    others leave (the chain step: the others pack and all units stay within N * floor(G / s) * s). What is left is
    a few sizes on a node of a few GPUs: best fit, largest first, places many such multisets (a packing found is a
    proof), and `_covers` decides the rest (a DP over node patterns, or the configuration integer program)."""
    merged: dict[int, int] = {}
    for size, count in units:
        if count > 0:
            merged[size] = merged.get(size, 0) + count
    return _packs(tuple(sorted(merged.items())), num_nodes, gpus_per_node)


@functools.lru_cache(maxsize=1 << 15)
def _packs(units: tuple[tuple[int, int], ...], n: int, g: int) -> bool:
    """`packs_into_nodes` of merged units, ascending by size, each count > 0 (memoised: the planner's front asks
    again for the same multisets)."""
    if not units:
        return True
    if units[-1][0] > g or sum(s * c for s, c in units) > n * g:
        return False
    sizes = [s for s, _ in units]
    d = math.gcd(*sizes)
    if d > 1:  # every node's load is a multiple of d
        return _packs(tuple((s // d, c) for s, c in units), n, g // d)
    (small, _), (big, num_big) = units[0], units[-1]
    if small + big > g:  # nothing fits beside a unit of the largest size
        return num_big <= n and _packs(units[:-1], n - num_big, g)
    if all(s % small == 0 for s in sizes):
        held = sum(s * c for s, c in units) <= n * (g // small) * small
        return held and _packs(units[1:], n, g)
    if any(sum(c for s, c in units if s >= t) > n * (g // t) for t in sizes):
        return False  # more units of size >= t than nodes have slots for
    return _best_fit(units, n, g) or _covers(units, n, g)


def _best_fit(units: tuple[tuple[int, int], ...], n: int, g: int) -> bool:
    """Largest units first, each on a node with the least room that holds it: True if all are placed (a
    sufficient test only). Nodes are counted by their free GPUs, so the work is per size, not per unit."""
    rooms = [0] * g + [n]  # rooms[r]: nodes with r free GPUs
    for size, count in reversed(units):
        while count:
            r = next((r for r in range(size, g + 1) if rooms[r]), None)
            if r is None:
                return False
            if 2 * size <= r:  # a node with room for several: as many as fit, one node at a time
                k = min(count, r // size)
                rooms[r] -= 1
                rooms[r - k * size] += 1
            else:
                k = min(count, rooms[r])
                rooms[r] -= k
                rooms[r - size] += k
            count -= k
    return True


# cell-rounds (box of counts x nodes x patterns) up to which `_covers` runs its DP; beyond it the ILP decides
DP_WORK = 2_000_000


def _patterns(sizes: list[int], g: int) -> list[tuple[int, ...]]:
    """Every node pattern: how many units of each size one node of `g` GPUs holds."""
    return [
        q
        for q in itertools.product(*(range(g // s + 1) for s in sizes))
        if sum(k * s for k, s in zip(q, sizes, strict=True)) <= g
    ]


def _covers(units: tuple[tuple[int, int], ...], n: int, g: int) -> bool:
    """Exact: some node pattern per node places every unit. The DP below where its box is small, else the
    configuration integer program (`_covers_ilp`); both exact, checked against each other and an exhaustive packer."""
    sizes = [s for s, _ in units[1:]]
    work = n * len(_patterns(sizes, g)) * math.prod(c + 1 for _, c in units[1:])
    return _covers_dp(units, n, g) if work <= DP_WORK else _covers_ilp(units, n, g)


def _covers_dp(units: tuple[tuple[int, int], ...], n: int, g: int) -> bool:
    """DP over nodes: best[v] is the most units of the smallest size the nodes so far have room for, with at least
    v (clipped at the counts) of the larger sizes placed; N rounds over the box of counts."""
    (small, wanted), rest = units[0], units[1:]
    sizes = [s for s, _ in rest]
    target = tuple(c for _, c in rest)
    axes = [np.arange(c + 1) for c in target]
    lifts = []
    for q in _patterns(sizes, g):
        room = (g - sum(k * s for k, s in zip(q, sizes, strict=True))) // small
        lifts.append((np.ix_(*(np.maximum(a - k, 0) for a, k in zip(axes, q, strict=True))), room))
    best = np.full(tuple(c + 1 for c in target), -1, dtype=np.int64)
    best[(0,) * len(target)] = 0
    for _ in range(n):
        grown = np.full_like(best, -1)
        for index, room in lifts:
            prior = best[index]
            np.maximum(grown, np.where(prior >= 0, prior + room, -1), out=grown)
        if grown[target] >= wanted:
            return True
        best = grown
    return False


def _covers_ilp(units: tuple[tuple[int, int], ...], n: int, g: int) -> bool:
    """The configuration integer program, solved exactly by CP-SAT: x_p nodes of each maximal pattern p (no unit
    fits beside it; a packing's patterns can be filled up to maximal ones), at most N nodes, each size's units
    covered. A few dozen variables and one constraint per size: milliseconds. (OR-Tools is imported here: a second
    to import, and only large clusters of sizes that form no chain get this far.)"""
    from ortools.sat.python import cp_model

    sizes = [s for s, _ in units]
    maximal = [
        q for q in _patterns(sizes, g) if all(sum(k * s for k, s in zip(q, sizes, strict=True)) + t > g for t in sizes)
    ]
    model = cp_model.CpModel()
    x = [model.new_int_var(0, n, f"pattern_{p}") for p in range(len(maximal))]
    model.add(sum(x) <= n)
    for i, (_, count) in enumerate(units):
        model.add(sum(q[i] * v for q, v in zip(maximal, x, strict=True)) >= count)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE):
        raise SpecError(
            f"the packing program for units {list(units)} on {n} nodes x {g} GPUs ended {solver.status_name(status)}"
        )
    return status != cp_model.INFEASIBLE


# a cell of the packed rollout DP: (GPUs in units of at least each threshold's size, in units of that size; GPUs)
Cell = tuple[tuple[int, ...], float]


class PackedRollout:
    """The rollout DP (`RolloutTable.min_gpus`) with each threshold's load in its state, exact under `packing`.

    For a limit T, with cmin the fewest instances of a degree finishing a range within T (more are never needed:
    every load only grows with the count), let f_i[l] be the fewest GPUs serving the first i groups with exactly
    l_p * s_p GPUs in rollout units of size >= s_p for each threshold p:

        f_0[0] = 0,  f_i[l] = min over j < i and degree x of f_j[l - d(x, c)] + x c,  c = cmin(j, i, x, T),

    where d_p = x c / s_p if x >= s_p else 0 (x is a multiple of s_p in a chain); under a `NodeFill` d counts the
    c units at x's own size (d_p = c if x = s_p else 0) and a cell fits if the exact packer places it. Degrees
    that reach the same thresholds add the same loads for the same GPUs, so per range only the cheapest of each
    class is kept. A plan whose training puts r_p GPUs in units of size >= s_p fits iff some l with
    l_p s_p + r_p <= cap_p has f_Q[l] GPUs within the rollout's share (`fewest`). `front` keeps only the reachable
    cells no other cell dominates: a few per step on real workloads, where the full grid would have
    prod_p (cap_p / s_p + 1) cells (4 M on 8,190 GPUs in nodes of 7)."""

    def __init__(self, table: RolloutTable, packing: Packing) -> None:
        self.table, self.packing = table, packing
        self.dims = tuple(cap // s + 1 for s, cap in zip(packing.thresholds, packing.caps, strict=True))

    def _cheapest(self, counts: dict[int, np.ndarray]) -> list[list[tuple[int, int, int, tuple[int, ...]]]]:
        """Per range, per degree class: (GPUs, degree, count, load shift) of its cheapest degree (ties: smaller)."""
        table, steps = self.table, self.packing.thresholds
        best: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for tp in table.tp_degrees:  # ascending: ties keep the smaller degree
            k = self.packing.unit_class(tp)
            gpus = np.where(counts[tp] > 0, counts[tp] * tp, np.inf)
            cost, chosen = best.setdefault(k, (np.full(len(gpus), np.inf), np.zeros(len(gpus), dtype=int)))
            better = gpus < cost
            cost[better], chosen[better] = gpus[better], tp
        out: list[list[tuple[int, int, int, tuple[int, ...]]]] = [[] for _ in range(len(table.starts))]
        for k, (cost, chosen) in sorted(best.items()):
            counted = [bool(a) for a in self.packing.class_loads(k, 1)]  # the thresholds class k counts at
            for r in np.nonzero(np.isfinite(cost))[0].tolist():
                g, tp = int(cost[r]), int(chosen[r])
                shift = tuple(g // s if c else 0 for c, s in zip(counted, steps, strict=True))
                out[r].append((g, tp, g // tp, shift))
        return out

    def front(self, counts: dict[int, np.ndarray], *, keep: bool = False) -> tuple[list[Cell], list]:
        """f_Q as its reachable cells (loads in units of each threshold's size, fewest GPUs), without the cells
        another cell dominates (loads no higher and GPUs no more: every box holding one holds the other, and so do
        their extensions), so the work follows the plans, not the cluster's size. With `keep`, each step's
        (parent, option) per cell and its options, for `buckets`."""
        table = self.table
        cheapest = self._cheapest(counts)
        top = tuple(n - 1 for n in self.dims)
        fronts: list[list[Cell]] = [[((0,) * len(top), 0.0)]] + [[] for _ in range(table.num_groups)]
        steps: list = []
        for i in range(1, table.num_groups + 1):
            found: list[tuple[float, tuple[int, ...], int, int]] = []  # (GPUs, loads, parent, option)
            options: list[tuple[int, int, int, tuple[int, ...]]] = []
            for j in range(i):
                for g, tp, c, shift in cheapest[table._range_index(j, i)] if fronts[j] else ():
                    for k, (cell, spent) in enumerate(fronts[j]):
                        moved = tuple(a + d for a, d in zip(cell, shift, strict=True))
                        if all(a <= t for a, t in zip(moved, top, strict=True)):
                            found.append((spent + g, moved, k, len(options)))
                    options.append((j, tp, c, shift))
            kept: list[tuple[float, tuple[int, ...], int, int]] = []
            for point in sorted(found):  # fewest GPUs first: a later point is dominated if its loads are no lower
                if not any(all(a <= b for a, b in zip(k[1], point[1], strict=True)) for k in kept):
                    kept.append(point)
            fronts[i] = [(point[1], point[0]) for point in kept]
            steps.append(([(point[2], point[3]) for point in kept], options) if keep else None)
        return fronts[-1], steps

    def _fits(self, cell: tuple[int, ...], reserved: tuple[int, ...]) -> bool:
        """The cell's loads plus `reserved` (training's, per threshold) stay within the caps."""
        p = self.packing
        return p.within(tuple(a * s for a, s in zip(cell, p.thresholds, strict=True)), reserved)

    def fewest(self, front: list[Cell], reserved: tuple[int, ...]) -> float:
        """Fewest rollout GPUs whose loads fit beside `reserved` (inf if none)."""
        point = self.first_fit(front, reserved)
        return math.inf if point is None else front[point][1]

    def first_fit(self, front: list[Cell], reserved: tuple[int, ...], most: float = math.inf) -> int | None:
        """The index of the front's cell of the fewest GPUs (at most `most`) whose loads fit beside `reserved`:
        `front` holds its cells by GPUs ascending, so the first that fits (None if none). Cells above `most` are
        not tested (each test may be an exact packing)."""
        for k, (cell, spent) in enumerate(front):
            if spent > most:
                return None
            if self._fits(cell, reserved):
                return k
        return None

    def buckets(
        self, limit: float, reserved: tuple[int, ...], bracket: CountBracket | None = None
    ) -> list[BucketChoice]:
        """The buckets of the fewest GPUs within `limit` whose loads fit beside `reserved` (empty if none)."""
        front, steps = self.front(self.table.min_counts(limit, bracket), keep=True)
        point = self.first_fit(front, reserved)
        return [] if point is None else self.read_back(steps, point)

    def read_back(self, steps: list, point: int) -> list[BucketChoice]:
        """The buckets of the last front's cell `point`, from the steps `front(..., keep=True)` kept."""
        table, out, i = self.table, [], self.table.num_groups
        while i > 0:
            parents, options = steps[i - 1]
            parent, option = parents[point]
            j, tp, c, _ = options[option]
            out.append(BucketChoice(start=j, stop=i, tp=tp, count=c, time_s=table.time(j, i, tp, c)))
            point, i = parent, j
        return out[::-1]


# a training side the rollout may join, for one limit: (its GPUs, its loads per threshold, the caller's key)
TrainOption = tuple[int, tuple[int, ...], int]


class PackedSearch:
    """`feasible(limit)` of the planner's bisection with the node-packing constraints: some training option
    (`options(limit)`: the fewest GPUs of each class of layouts finishing within `limit`, with their loads) and a
    rollout within `limit` together use at most `budget` GPUs and pack. Monotone in the limit like the plain one (a
    larger limit only adds plans), so the bisection stays exact. The plain DP's plan is tried first: where it
    packs, no grid is needed."""

    def __init__(self, rollout: PackedRollout, budget: int, options: Callable[[float], list[TrainOption]]) -> None:
        self.rollout, self.budget, self.options = rollout, budget, options

    def _fits(self, option: TrainOption, gpus: float, loads: tuple[int, ...]) -> bool:
        t, reserved, _ = option
        return t + gpus <= self.budget and self.rollout.packing.within(loads, reserved)

    def choose(
        self, limit: float, bracket: CountBracket | None = None
    ) -> tuple[TrainOption, list[BucketChoice]] | None:
        """A training option and rollout buckets within `limit` that fit the budget and pack (None if none): the
        plain DP's buckets beside the fewest training GPUs that take them, else the grid's."""
        options = sorted(o for o in self.options(limit) if o[0] < self.budget)
        if not options:
            return None
        counts, gpus, buckets, loads = self._plain(limit, bracket)
        if options[0][0] + gpus > self.budget:
            return None  # not even the GPU count allows it
        for option in options:
            if self._fits(option, gpus, loads):
                return option, buckets
        front = self.rollout.front(counts, keep=True)
        for option in options:
            if (packed := self._packed_beside(option, front)) is not None:
                return option, packed
        return None

    def feasible(self, limit: float, bracket: CountBracket | None = None) -> bool:
        return self.choose(limit, bracket) is not None

    def preferred(
        self, limit: float, rank: Callable[[TrainOption], tuple], bracket: CountBracket | None = None
    ) -> tuple[TrainOption, list[BucketChoice]] | None:
        """The plan the planner returns at `limit` (its optimum): the first training option in `rank` order that
        some rollout within `limit` packs beside on the GPUs left, with the plain DP's buckets where they pack
        beside it, else the packed DP's of the fewest GPUs (None if no option has one). `choose` takes the first
        option the plain DP's buckets fit, which is enough to decide feasibility but makes the chosen layout
        depend on which DP found the rollout; here it depends only on `rank` (the planner's tie rule)."""
        options = sorted((o for o in self.options(limit) if o[0] < self.budget), key=rank)
        counts, gpus, buckets, loads = self._plain(limit, bracket)
        front = None
        for option in options:
            if self._fits(option, gpus, loads):
                return option, buckets
            if option[0] + gpus > self.budget:
                continue  # no rollout within `limit` has fewer GPUs than the plain DP's
            front = front or self.rollout.front(counts, keep=True)
            if (packed := self._packed_beside(option, front)) is not None:
                return option, packed
        return None

    def _plain(
        self, limit: float, bracket: CountBracket | None
    ) -> tuple[dict[int, np.ndarray], float, list[BucketChoice], tuple[int, ...]]:
        """The plain DP at `limit`: its counts, its fewest GPUs, their buckets and those buckets' loads."""
        table = self.rollout.table
        counts = table.min_counts(limit, bracket)
        gpus, buckets = table.min_gpus(limit, counts=counts)
        return counts, gpus, buckets, self.rollout.packing.loads((b.tp, b.count) for b in buckets)

    def _packed_beside(self, option: TrainOption, front: tuple[list[Cell], list]) -> list[BucketChoice] | None:
        """The packed DP's buckets of the fewest GPUs that pack beside `option` on the GPUs it leaves (None if none);
        `front` as `PackedRollout.front(..., keep=True)` gives it."""
        cells, steps = front
        point = self.rollout.first_fit(cells, option[1], most=self.budget - option[0])
        return None if point is None else self.rollout.read_back(steps, point)
