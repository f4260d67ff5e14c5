"""How far C-MLFQ trusts a node's few survivors: the prior strength of its bucket shares, fitted online.

A node's bucket shares come from the trajectories of its window that ran at least as long as the request has; deep
in the tree, or late in a request, that may be a handful, and shares from a handful are overconfident. With
`shrink=k` the router blends them with the survival shares of all trajectories (the agnostic root), weight
`n / (n + k)` for `n` survivors at the node. `shrink="auto"` fits `k` to the workload: every tool return records
(node shares, root shares, n) for the first `per_request` returns of a request (at most `per_step` records a
step: a large step has plenty, and recording costs time on the hot path), the request's final bucket is
known when it finishes, and at each step end `k` is set to the value on a log grid with the least Brier score over
the records of the last `steps` steps (the older, the lighter: weight 1/2 per step). Nothing in it is tuned to a
workload: a workload whose nodes predict well keeps a small `k`, one whose nodes are noise gets a large one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

SHRINK_GRID = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)


class ShrinkFit:
    """Records of decision points and the choice of the prior strength (module docstring)."""

    def __init__(self, *, steps: int = 3, per_request: int = 8, per_step: int = 4096, decay: float = 0.5) -> None:
        self.per_request = per_request
        self.per_step = per_step
        self.taken = 0  # records taken this step (the router stops recording at `per_step`)
        self.decay = decay
        # per step ended: its records (node shares, root shares, survivors, final buckets) and their sums of squared
        # errors at each grid value (`step_briers`)
        self._steps: deque[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[float]]] = deque(maxlen=steps)
        self._own: list[list[float]] = []
        self._prior: list[list[float]] = []
        self._n: list[float] = []
        self._y: list[int] = []

    def finish(self, records: list[tuple[list[float], list[float], float]], truth: int) -> None:
        """A finished request's records (node shares, root shares, survivors) and the bucket it ended in."""
        for own, prior, n in records:
            self._own.append(own)
            self._prior.append(prior)
            self._n.append(n)
            self._y.append(truth)

    def end_step(self) -> None:
        self.taken = 0
        if self._y:
            own, prior, n = np.asarray(self._own), np.asarray(self._prior), np.asarray(self._n)
            y = np.asarray(self._y, np.int64)
            self._steps.append((own, prior, n, y, step_briers(own, prior, n, y, SHRINK_GRID)))
        self._own, self._prior, self._n, self._y = [], [], [], []

    def scores(self, grid=SHRINK_GRID) -> list[float]:
        """The weighted mean Brier score of the blended shares for each prior strength in `grid` (for the grid, from
        each step's sums of squares counted once at its end: a step end costs the same however many are kept)."""
        steps = list(self._steps)
        weights = [self.decay ** (len(steps) - 1 - i) for i in range(len(steps))]
        known = grid is SHRINK_GRID or tuple(grid) == SHRINK_GRID
        sums = [s[4] if known and len(s) > 4 else step_briers(*s[:4], grid) for s in steps]
        out = []
        for g in range(len(grid)):
            total = mass = 0.0
            for w, step, briers in zip(weights, steps, sums):  # (in order, the older first)
                total += w * briers[g]
                mass += w * len(step[3])
            out.append(total / mass if mass else 0.0)
        return out

    def choose(self, current: float) -> float:
        """The prior strength for the next step: the grid value of least Brier score (the smallest among equals);
        `current` when nothing is recorded yet."""
        if not self._steps:
            return current
        scores = self.scores()
        return SHRINK_GRID[int(np.argmin(scores))]


def step_briers(own: np.ndarray, prior: np.ndarray, n: np.ndarray, y: np.ndarray, grid) -> list[float]:
    """One step's sum of squared errors of the blended shares for each prior strength in `grid`: the blends for all
    of them in one pass of numpy, each strength's sum taken over its own contiguous block, as a sum of that block
    alone would be (the same order of additions, so the same bits)."""
    a = (n[None, :] / (n[None, :] + np.asarray(grid, float)[:, None]))[:, :, None]
    p = a * own + (1.0 - a) * prior
    p[:, np.arange(len(y)), y] -= 1.0
    square = p * p
    return [float(block.sum()) for block in square]
