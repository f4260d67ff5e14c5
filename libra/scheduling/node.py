"""A prefix-tree node and its statistics: the remaining tokens of the last `window` trajectories that passed
through it, with count, mean, P50 and P90 (nearest rank) and the sorted window with its prefix sums, so that
quantiles, bucket probabilities and conditional means are bisections. The prefix sums are made when a conditional
mean first needs them after an update (`beyond`): most nodes an update touches are never asked for one."""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from types import ModuleType

import attrs

from libra._native import optional_extension


class Node:
    """One prefix-tree node. `count`, `mean`, `p50`, `p90` (nearest rank) describe `window` as of the last update."""

    __slots__ = ("children", "window", "total", "last_step", "count", "mean", "p50", "p90", "ordered", "prefix")

    def __init__(self, first: int | None = None, step: int = -1) -> None:
        """An empty node; or, with `first`, a node that recorded one observation at update `step` and is refreshed
        (the same values as `refresh` gives a window of one: an update's new node is built this way at once)."""
        self.children: dict[int, Node] = {}
        self.last_step = step
        if first is None:
            self.window: list[int] = []
            self.total = 0  # observations ever recorded (the window keeps the last few; `refresh_all` counts them)
            self.count = 0
            self.mean = 0.0
            self.p50 = 0.0
            self.p90 = 0.0
            self.ordered: list[int] = []  # the window, sorted: quantiles and bucket probabilities by bisection
            # prefix sums of `ordered`, for conditional means by bisection; None until `beyond` first needs them
            self.prefix: list[int] | None = [0]
        else:
            self.window = [first]
            self.total = self.count = 1
            self.mean = self.p50 = self.p90 = float(first)  # (the mean as sum(window) / 1)
            self.ordered = self.window  # (sorted, as long as it holds one observation: `refresh_all` parts them)
            self.prefix = None

    def fraction_at_most(self, tokens: float) -> float:
        """Share of the window whose remaining tokens are <= `tokens` (0 for an empty window)."""
        n = len(self.ordered)
        return bisect.bisect_right(self.ordered, tokens) / n if n else 0.0

    def beyond(self, elapsed: float) -> tuple[int, float, float, float] | None:
        """(count, mean, P50, P90) of the remaining tokens of the window's trajectories that went on for more
        than `elapsed` tokens past this node: the distribution conditioned on the request still running after
        growing by `elapsed`. None when none did."""
        ordered = self.ordered
        n = len(ordered)
        i = bisect.bisect_right(ordered, math.floor(elapsed))  # (the same position: the window holds integers)
        k = n - i
        if k <= 0:
            return None
        prefix = self.prefix
        if prefix is None:  # (as of the last refresh: made once, on first need)
            prefix = self.prefix = list(itertools.accumulate(ordered, initial=0))
        return (
            k,
            (prefix[n] - prefix[i]) / k,
            float(ordered[i + math.ceil(0.5 * k) - 1]),
            float(ordered[i + math.ceil(0.9 * k) - 1]),
        )

    def refresh(self, limit: int) -> None:
        """The statistics of the window's last `limit` observations (the window is cut to them). Unlike
        `refresh_all`, it leaves `total` to the caller (`PrefixTree._absorb` adds a saved node's count itself)."""
        w = self.window
        if len(w) > limit:
            del w[: len(w) - limit]
        n = len(w)
        self.count = n
        if n:
            self.mean = sum(w) / n
            self.ordered = ordered = sorted(w)
            self.prefix = None
            self.p50 = float(ordered[math.ceil(0.5 * n) - 1])
            self.p90 = float(ordered[math.ceil(0.9 * n) - 1])


_new = object.__new__


def leaf(first: int, step: int) -> Node:
    """`Node(first, step)`, built by a plain function: calling the class goes through the C type call and runs
    `__init__` in a frame of its own, about a tenth of the cost of a node, and an update makes thousands."""
    node = _new(Node)
    node.children = {}
    node.last_step = step
    node.window = node.ordered = [first]
    node.total = node.count = 1
    node.mean = node.p50 = node.p90 = float(first)
    node.prefix = None
    return node


def refresh_all(nodes: list[Node], limit: int) -> None:
    """`refresh_all_py` (the reference, below) in C when the optional extension `libra.scheduling._tree_native`
    (ext/scheduling/tree_native.c) is built, as `pip install -e .` does where a C compiler is: the same values,
    slot by slot (tests/scheduling/test_tree_native.py); with the update's learners (tree.py) in C as well, an
    update takes 0.5-0.8 of its time (docs/routing-log.md, "The update's hot loops in C"). `LIBRA_PURE_PYTHON=1` in the
    environment at import keeps the reference."""
    if _native is None:
        refresh_all_py(nodes, limit)
    else:
        at50, at90 = _rank_positions(limit)
        _native.refresh_all(nodes, limit, at50, at90, _INCREMENTAL)


def refresh_all_py(nodes: list[Node], limit: int) -> None:
    """`Node.refresh(limit)` of every node, after a step's observations were appended to their windows (`count` is
    still the window's length as of the last refresh, and `ordered` that window sorted), and the new observations
    added to `total`: an update appends only, and counts here, once per node (`total += 1` per observation cost
    3-6 % of an update's instructions: past 256, every increment makes a new int object). Same values as `refresh`,
    found with less work: a node built refreshed with its one observation (`Node(first, step)`) and not observed
    again is skipped; otherwise the new observations are put into the sorted window (one bisection for a single
    one, else appended and sorted again, which Python's sort does as one merge of the sorted run with the sorted new
    ones), after the few observations that left the window were taken out of it by bisection (a sort of the window
    when many left it). The quantiles' positions come from a table (`_rank_positions`)."""
    at50, at90 = _rank_positions(limit)
    insort = bisect.insort
    for node in nodes:
        w = node.window
        n = len(w)
        old = node.count
        if n == old:  # built refreshed (`Node(first, step)`) and not observed again
            continue
        node.total += n - old
        if n > limit:
            drop = n - limit
            if drop < old and drop <= _INCREMENTAL:
                ordered = node.ordered
                for x in w[:drop]:
                    del ordered[bisect.bisect_left(ordered, x)]
                ordered += w[old:]
                ordered.sort()
                del w[:drop]
            else:  # (most or all of the old window left)
                del w[:drop]
                ordered = node.ordered = sorted(w)
            n = limit
        elif old > 1:  # (a window of one is its own sorted copy)
            ordered = node.ordered
            if n - old == 1:  # (the commonest case: one bisection, no slice to make and sort)
                insort(ordered, w[old])
            else:
                ordered += w[old:]
                ordered.sort()
        else:
            ordered = node.ordered = sorted(w)
        node.count = n
        node.prefix = None
        node.mean = sum(ordered) / n  # (integers: the same sum as sum(w))
        node.p50 = float(ordered[at50[n]])
        node.p90 = float(ordered[at90[n]])


@functools.cache
def _rank_positions(limit: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For each window length n up to `limit`, the positions of the P50 and the P90 (nearest rank) in the sorted
    window, as `refresh` computes them (`math.ceil(q * n) - 1`, the same float products): a table lookup instead
    of two multiplications and two calls per refreshed node."""
    lengths = range(limit + 1)
    return tuple(math.ceil(0.5 * n) - 1 for n in lengths), tuple(math.ceil(0.9 * n) - 1 for n in lengths)


# at most this many observations leaving a window are taken out of its sorted copy one by one (more: a sort)
_INCREMENTAL = 24


def _load_native() -> ModuleType | None:
    """The C extension (`refresh_all` here, the learners and `_distinct_prefixes` of tree.py, the eviction of
    eviction.py), bound to `Node`; None where it is not built or `LIBRA_PURE_PYTHON` is set."""
    ext = optional_extension("libra.scheduling._tree_native")
    if ext is not None:
        ext.bind(Node)
    return ext


_native = _load_native()


def native() -> ModuleType | None:
    """The C extension in use (`_load_native`), or None: read at each call, so a test can switch it off."""
    return _native


@attrs.frozen(kw_only=True)
class NodeStats:
    """Statistics of remaining tokens at one node (a value for callers outside the hot path)."""

    count: int
    mean: float
    p50: float
    p90: float
    total: int
    last_step: int
