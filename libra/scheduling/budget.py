"""The price of a migrated token, set from the observed costs of moving so that a migration budget is spent.

C-MLFQ's `priced` rule moves a request at a decision point (a tool return, or its context outgrowing its bucket)
only when the gain in the probability of ending in the right bucket pays for the context carried: `gain >= price *
carried / T` (T: mean trajectory length), and, at a tool return, when it is sure enough or waiting is dear:
`P(best) >= confidence - price * tool_tokens / T`. So a decision point moves its request exactly when the price
lies in an interval `[p_lo, p_hi]` of its own. Before its first move a request sits in its admission bucket
whatever the price, so its decision points until then do not depend on the price: recording `(p_lo, p_hi,
carried)` at each of them (relative to the admission bucket) tells, for any price, where the request would have
moved and what that would have carried.

`MigrationBudget` keeps those records for the requests finished in the last `steps` steps (the older, the
lighter: weight 1/2 per step) and, at each step end, picks the price on a log grid whose counterfactual
migrated-token share comes closest to the budget from below (the lowest price among equals, the highest price if
none fits). The price therefore follows what moving costs on this workload, not a constant tuned to one. The
router may ask for another share than the budget for the next step (`choose(current, share)`: its run-level target,
cmlfq.py `repay`, which spends a shortfall of earlier steps or pays back an excess).
"""

from __future__ import annotations

from collections import deque

import numpy as np

PRICE_GRID = tuple(float(p) for p in np.geomspace(0.05, 50.0, 43))
PRICE_GRID_ARRAY = np.array(PRICE_GRID)


class MigrationBudget:
    """Per-step records of decision points and the price choice (module docstring)."""

    def __init__(self, share: float, *, steps: int = 3) -> None:
        self.share = float(share)
        # per step ended: its records (request, low, high, carried), its tokens and what it carries at each grid price
        self._steps: deque[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]] = deque(
            maxlen=steps
        )
        self._req: list[int] = []
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._carried: list[int] = []
        self._total = 0
        self._n = 0

    def finish(self, points: list[tuple[float, float, int] | None] | None, total_tokens: int) -> None:
        """A finished request's decision points (in order) and its final length."""
        if points:
            n = self._n
            for point in points:
                if point is None:  # a marker (cmlfq.py), not a point
                    continue
                lo, hi, carried = point
                self._req.append(n)
                self._lo.append(lo)
                self._hi.append(hi)
                self._carried.append(carried)
        self._n += 1
        self._total += total_tokens

    def end_step(self) -> None:
        if self._n:
            arrays = (
                np.asarray(self._req, np.int64),
                np.asarray(self._lo, float),
                np.asarray(self._hi, float),
                np.asarray(self._carried, float),
            )
            self._steps.append((*arrays, float(self._total), carried_at(*arrays, PRICE_GRID_ARRAY)))
        self._req, self._lo, self._hi, self._carried = [], [], [], []
        self._total = self._n = 0

    @property
    def recorded(self) -> bool:
        """Whether any step's records are kept."""
        return bool(self._steps)

    def forget(self) -> None:
        """Drop the records of the steps ended so far."""
        self._steps.clear()

    def shares(self, prices=PRICE_GRID) -> list[float]:
        """The counterfactual migrated-token share of the recorded requests at each price (for the grid, from what
        each step carries at each grid price, counted once at its end: a step end costs the same however many steps
        are kept)."""
        steps = list(self._steps)
        weights = [0.5 ** (len(steps) - 1 - i) for i in range(len(steps))]
        total = sum(w * s[4] for w, s in zip(weights, steps))
        if total <= 0:
            return [0.0 for _ in prices]
        grid = prices is PRICE_GRID or tuple(prices) == PRICE_GRID
        carried = np.zeros(len(prices))
        for w, s in zip(weights, steps):  # (in order, the older first, as the total)
            carried = carried + w * (s[5] if grid and len(s) > 5 else carried_at(*s[:4], np.asarray(prices, float)))
        return (carried / total).tolist()

    def choose(self, current: float, share: float | None = None) -> float:
        """The price for the next step (module docstring); `current` when nothing is recorded yet. `share`: the
        target for the next step instead of the budget (the router's run-level target, cmlfq.py `repay`)."""
        return self.choose_mix(current, share)[0]

    def choose_mix(self, current: float, share: float | None = None) -> tuple[float, float, float]:
        """`(price, lower, q)`: the price `choose` picks and, for requests drawn with probability `q`, the next lower
        grid price, so that the expected share meets the budget. Moves come in lumps (many requests reach the same
        decision at about the same context), so the share can jump from well under the budget at one grid price to
        well over it at the next; mixing the two prices over requests spends the budget in expectation (the
        relaxation of the knapsack the price solves). `q` = 0 when nothing lower fits or nothing is recorded."""
        if not self._steps:
            return current, current, 0.0
        target = self.share if share is None else share
        shares = self.shares()
        fitting = [(s, -i) for i, s in enumerate(shares) if s <= target]
        if not fitting:
            return PRICE_GRID[-1], PRICE_GRID[-1], 0.0
        s_hi, neg_i = max(fitting)
        i = -neg_i
        # the highest grid price below `i` whose share exceeds the budget (shares need not be monotone in price)
        below = [j for j in range(i - 1, -1, -1) if shares[j] > target]
        if not below:
            return PRICE_GRID[i], PRICE_GRID[i], 0.0
        j = below[0]
        q = (target - s_hi) / (shares[j] - s_hi)
        return PRICE_GRID[i], PRICE_GRID[j], q


def carried_at(
    req: np.ndarray, lo: np.ndarray, hi: np.ndarray, car: np.ndarray, prices: np.ndarray, *, cells: int = 1 << 20
) -> np.ndarray:
    """The tokens one step's requests would carry at each of `prices`: each request moves at its first decision
    point (in order) whose interval `[lo, hi]` holds the price. In numpy over prices x points (in slices of prices
    that keep the matrices to about `cells` cells): a point is its request's first hit at a price when it holds the
    price and none of the request's earlier points does (a request's points are consecutive, `req` runs in order).
    Carried tokens are whole numbers, so the sums are exact in any order."""
    out = np.zeros(len(prices))
    if not len(req):
        return out
    start = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
    first = np.repeat(start, np.diff(np.r_[start, len(req)]))  # each point's request's first point
    rows = max(1, cells // len(req))
    for i in range(0, len(prices), rows):
        price = prices[i : i + rows, None]
        hit = (lo <= price) & (price <= hi)
        upto = np.cumsum(hit, axis=1, dtype=np.int32)  # hits up to each point, that point's included
        earlier = (upto - hit) - (upto[:, first] - hit[:, first])  # hits among its request's earlier points
        out[i : i + rows] = np.where(hit & (earlier == 0), car, 0.0).sum(axis=1)
    return out
