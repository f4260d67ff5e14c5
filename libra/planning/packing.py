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
"""

from __future__ import annotations

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


def packs_into_nodes(units: Iterable[tuple[int, int]], num_nodes: int, gpus_per_node: int) -> bool:
    """Whether (size, count) units of sizes forming a divisibility chain pack into `num_nodes` nodes of
    `gpus_per_node` GPUs (the condition above at every size present)."""
    units = [(size, count) for size, count in units if count > 0]
    sizes = sorted({size for size, _ in units})
    if not is_chain(sizes):
        raise SpecError(f"unit sizes {sizes} must form a divisibility chain (each dividing the next)")
    return all(
        sum(size * count for size, count in units if size >= s) <= node_cap(num_nodes, gpus_per_node, s) for s in sizes
    )


# a cell of the packed rollout DP: (GPUs in units of at least each threshold's size, in units of that size; GPUs)
Cell = tuple[tuple[int, ...], float]


class PackedRollout:
    """The rollout DP (`RolloutTable.min_gpus`) with each threshold's load in its state, exact under `packing`.

    For a limit T, with cmin the fewest instances of a degree finishing a range within T (more are never needed:
    every load only grows with the count), let f_i[l] be the fewest GPUs serving the first i groups with exactly
    l_p * s_p GPUs in rollout units of size >= s_p for each threshold p:

        f_0[0] = 0,  f_i[l] = min over j < i and degree x of f_j[l - d(x, c)] + x c,  c = cmin(j, i, x, T),

    where d_p = x c / s_p if x >= s_p else 0 (x is a multiple of s_p in a chain). Degrees that reach the same
    thresholds add the same loads for the same GPUs, so per range only the cheapest of each class is kept. A plan
    whose training puts r_p GPUs in units of size >= s_p fits iff some l with l_p s_p + r_p <= cap_p has
    f_Q[l] GPUs within the rollout's share (`fewest`). `front` keeps only the reachable cells no other cell
    dominates: a few per step on real workloads, where the full grid would have prod_p (cap_p / s_p + 1) cells
    (4 M on 8,190 GPUs in nodes of 7)."""

    def __init__(self, table: RolloutTable, packing: NodePacking) -> None:
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
            for r in np.nonzero(np.isfinite(cost))[0].tolist():
                g, tp = int(cost[r]), int(chosen[r])
                shift = tuple(g // s if p < k else 0 for p, s in enumerate(steps))
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
        return min((spent for cell, spent in front if self._fits(cell, reserved)), default=math.inf)

    def buckets(
        self, limit: float, reserved: tuple[int, ...], bracket: CountBracket | None = None
    ) -> list[BucketChoice]:
        """The buckets of the fewest GPUs within `limit` whose loads fit beside `reserved` (empty if none)."""
        table = self.table
        front, steps = self.front(table.min_counts(limit, bracket), keep=True)
        fit = [k for k, (cell, _) in enumerate(front) if self._fits(cell, reserved)]
        if not fit:
            return []
        point = min(fit, key=lambda k: front[k][1])
        out, i = [], table.num_groups
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
        table, packing = self.rollout.table, self.rollout.packing
        options = sorted(o for o in self.options(limit) if o[0] < self.budget)
        if not options:
            return None
        counts = table.min_counts(limit, bracket)
        gpus, buckets = table.min_gpus(limit, counts=counts)
        if options[0][0] + gpus > self.budget:
            return None  # not even the GPU count allows it
        loads = packing.loads((b.tp, b.count) for b in buckets)
        for option in options:
            if self._fits(option, gpus, loads):
                return option, buckets
        front, _ = self.rollout.front(counts)
        for option in options:
            if option[0] + self.rollout.fewest(front, option[1]) <= self.budget:
                return option, self.rollout.buckets(limit, option[1])
        return None

    def feasible(self, limit: float, bracket: CountBracket | None = None) -> bool:
        return self.choose(limit, bracket) is not None
