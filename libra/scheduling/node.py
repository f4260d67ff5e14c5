"""A prefix-tree node and its statistics: the remaining tokens of the last `window` trajectories that passed
through it, with count, mean, P50 and P90 (nearest rank) and the sorted window with its prefix sums, so that
quantiles, bucket probabilities and conditional means are bisections."""

from __future__ import annotations

import bisect
import itertools
import math

import attrs


class Node:
    """One prefix-tree node. `count`, `mean`, `p50`, `p90` (nearest rank) describe `window` as of the last update."""

    __slots__ = ("children", "window", "total", "last_step", "count", "mean", "p50", "p90", "ordered", "prefix")

    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.window: list[int] = []
        self.total = 0  # observations ever recorded (the window keeps the last few)
        self.last_step = -1
        self.count = 0
        self.mean = 0.0
        self.p50 = 0.0
        self.p90 = 0.0
        self.ordered: list[int] = []  # the window, sorted: quantiles and bucket probabilities by bisection
        self.prefix: list[int] = [0]  # prefix sums of `ordered`: conditional means by bisection

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
        return (
            k,
            (self.prefix[n] - self.prefix[i]) / k,
            float(ordered[i + math.ceil(0.5 * k) - 1]),
            float(ordered[i + math.ceil(0.9 * k) - 1]),
        )

    def refresh(self, limit: int) -> None:
        w = self.window
        if len(w) > limit:
            del w[: len(w) - limit]
        n = len(w)
        self.count = n
        if n:
            self.mean = sum(w) / n
            self.ordered = ordered = sorted(w)
            self.prefix = list(itertools.accumulate(ordered, initial=0))
            self.p50 = float(ordered[math.ceil(0.5 * n) - 1])
            self.p90 = float(ordered[math.ceil(0.9 * n) - 1])


def refresh_all(nodes: list[Node], limit: int) -> None:
    """`Node.refresh(limit)` of every node. Most nodes an update touches are new, with a window of one: for those
    the same values are set without the sort and prefix-sum calls."""
    for node in nodes:
        w = node.window
        if len(w) != 1:
            node.refresh(limit)
            continue
        x = w[0]
        node.count = 1
        node.mean = sum(w) / 1
        node.ordered = [x]
        node.prefix = [0, 0 + x]  # as itertools.accumulate(ordered, initial=0)
        node.p50 = node.p90 = float(x)


@attrs.frozen(kw_only=True)
class NodeStats:
    """Statistics of remaining tokens at one node (a value for callers outside the hot path)."""

    count: int
    mean: float
    p50: float
    p90: float
    total: int
    last_step: int
