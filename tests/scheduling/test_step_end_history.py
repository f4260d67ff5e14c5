"""The router's step-end learning on many small steps: each step end costs the same however much history is kept,
and its results are bit for bit those of the plain algorithms it replaced (written out here as references: a deque
and Counters for the prompt-length bins, a loop over prices for the budget, over prior strengths for the shrinkage,
deques of sizes for the size classes)."""

from __future__ import annotations

import math
import random
import sys
from collections import Counter, deque
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling.budget import PRICE_GRID, PRICE_GRID_ARRAY, MigrationBudget, carried_at
from libra.scheduling.experts import PromptLengthBins
from libra.scheduling.shrinkage import SHRINK_GRID, ShrinkFit
from libra.scheduling.size_classes import QuantileStateCodec
from libra.workloads import Trajectory, Turn


# -- the references ----------------------------------------------------------------------------------------------
class _CounterBins:
    """PromptLengthBins as it was: a deque of (length, bucket) pairs, one Counter per bin."""

    def __init__(self, bins: int, window: int) -> None:
        self.bins = bins
        self.seen: deque[tuple[int, int]] = deque(maxlen=window)
        self.edges = np.zeros(0)
        self.majority: list[int] = []

    def end_step(self) -> None:
        if not self.seen:
            return
        lengths = np.fromiter((p for p, _ in self.seen), float, len(self.seen))
        self.edges = np.unique(np.quantile(lengths, np.linspace(0, 1, self.bins + 1)[1:-1]))
        counts: list[Counter[int]] = [Counter() for _ in range(len(self.edges) + 1)]
        for length, b in self.seen:
            counts[int(np.searchsorted(self.edges, length, side="right"))][b] += 1
        every = sum(counts, Counter())
        self.majority = [min((c or every).items(), key=lambda kv: (-kv[1], kv[0]))[0] for c in counts]


def _loop_shares(steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]], prices) -> list[float]:
    """MigrationBudget.shares as it was: per price, per kept step, the first hit of each request by np.unique."""
    weights = [0.5 ** (len(steps) - 1 - i) for i in range(len(steps))]
    total = sum(w * s[4] for w, s in zip(weights, steps))
    if total <= 0:
        return [0.0 for _ in prices]
    out = []
    for price in prices:
        carried = 0.0
        for w, (req, lo, hi, car, _) in zip(weights, steps):
            hit = np.flatnonzero((lo <= price) & (price <= hi))
            if len(hit):
                _, first = np.unique(req[hit], return_index=True)
                carried += w * float(car[hit[first]].sum())
        out.append(carried / total)
    return out


def _loop_scores(steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], decay: float) -> list[float]:
    """ShrinkFit.scores as it was: per prior strength, per kept step, the blend and its squared errors."""
    weights = [decay ** (len(steps) - 1 - i) for i in range(len(steps))]
    out = []
    for k in SHRINK_GRID:
        total = mass = 0.0
        for w, (own, prior, n, y) in zip(weights, steps):
            a = (n / (n + k))[:, None]
            p = a * own + (1.0 - a) * prior
            p[np.arange(len(y)), y] -= 1.0
            total += w * float((p * p).sum())
            mass += w * len(y)
        out.append(total / mass if mass else 0.0)
    return out


class _DequeCodec(QuantileStateCodec):
    """QuantileStateCodec's learning as it was: deques of sizes, converted and log1p'd whole at every step end."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.old_recent: dict[str, deque[int]] = {}
        self.old_pooled: deque[int] = deque(maxlen=4 * self.sample)

    def observe(self, trajectories) -> None:
        by_tool: dict[str, list[int]] = {}
        flat: list[int] = []
        for traj in trajectories:
            for t in traj.turns:
                if t.tool is not None:
                    by_tool.setdefault(t.tool, []).append(t.tool_tokens)
                    flat.append(t.tool_tokens)
        if not by_tool:
            return
        for tool, sizes in by_tool.items():
            self.old_recent.setdefault(tool, deque(maxlen=self.sample)).extend(sizes)
        self.old_pooled.extend(flat)
        self._pooled_edges = self._old_quantiles(self.old_pooled)
        for tool, q in self.old_recent.items():
            if len(q) >= self.min_samples:
                if tool in by_tool or tool not in self._edges:
                    self._edges[tool] = self._old_quantiles(q)
            else:
                self._edges.pop(tool, None)

    def _old_quantiles(self, values: deque[int]) -> tuple[float, ...]:
        if self.classes == 1 or not values:
            return ()
        x = np.fromiter(values, float, len(values))
        qs = np.quantile(x, np.arange(1, self.classes) / self.classes)
        if self.method == "breaks":
            distinct, inverse = np.unique(x, return_inverse=True)
            logs = np.array([math.log1p(v) for v in distinct.tolist()])[inverse]
            qs = _old_breaks(logs, qs)
        return tuple(float(e) for e in np.unique(qs))


def _old_breaks(logs: np.ndarray, start: np.ndarray) -> np.ndarray:
    """size_classes._natural_breaks, written out (its own `_log1p` of the tokens edges included)."""
    edges = np.array([math.log1p(v) for v in np.sort(start).tolist()])
    for _ in range(30):
        groups = np.searchsorted(edges, logs, side="right")
        counts = np.bincount(groups, minlength=len(edges) + 1)
        if (counts == 0).any():
            return start
        centers = np.bincount(groups, weights=logs, minlength=len(edges) + 1) / counts
        new = (centers[:-1] + centers[1:]) / 2
        if np.allclose(new, edges):
            break
        edges = new
    return np.array([math.expm1(e) for e in edges.tolist()])


def _calls(fn: Callable[[], object]) -> int:
    """Python and C function calls made by `fn()` (a count of work, not a time)."""
    count = 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


# -- the same results as the references ---------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 4)), max_size=25), min_size=1, max_size=8),
    st.integers(1, 40),
    st.integers(1, 12),
)
def test_prompt_length_bins_match_the_counter_algorithm(steps, window, bins) -> None:
    new, old = PromptLengthBins(bins=bins, window=window), _CounterBins(bins, window)
    for step in steps:
        for length, bucket in step:
            new.observe(length, bucket)
            old.seen.append((length, bucket))
        new.end_step()
        old.end_step()
        assert np.array_equal(new._edges, old.edges) and new._majority == old.majority
        assert all(type(b) is int for b in new._majority)
        for probe in (0, 1500, 3001):
            assert new.guess(probe) == (
                old.majority[int(np.searchsorted(old.edges, probe, "right"))] if old.majority else None
            )


_POINT = st.tuples(st.floats(0, 60), st.floats(0, 60), st.integers(1, 5000)).map(
    lambda p: (min(p[0], p[1]), max(p[0], p[1]), p[2])
)
_PRICE = st.one_of(st.sampled_from(PRICE_GRID), st.floats(0, 60))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.lists(st.one_of(_POINT, st.none()), max_size=6), max_size=10), min_size=1, max_size=6),
    st.integers(1, 3),
    st.lists(_PRICE, max_size=5),
    st.integers(1, 200),
)
def test_budget_shares_match_the_per_price_loop(steps, kept, prices, cells) -> None:
    """Bit for bit, at the grid prices (counted once per step end) and at any others, over more steps than kept;
    a step's counterfactuals in slices of prices too (`cells`), as a large step's are. (None: the router's marker
    between points, cmlfq.py, which is not a point.)"""
    budget = MigrationBudget(0.1, steps=kept)
    old: deque = deque(maxlen=kept)
    for step in steps:
        req, lo, hi, car = [], [], [], []
        for n, points in enumerate(step):
            budget.finish(list(points), 10_000 + n)
            for point in points:
                if point is None:
                    continue
                req.append(n)
                lo.append(point[0])
                hi.append(point[1])
                car.append(point[2])
        budget.end_step()
        if step:
            arrays = np.asarray(req, np.int64), np.asarray(lo, float), np.asarray(hi, float), np.asarray(car, float)
            old.append((*arrays, float(sum(10_000 + n for n in range(len(step))))))
        assert budget.shares() == _loop_shares(list(old), PRICE_GRID)
        assert budget.shares(prices) == _loop_shares(list(old), prices)
        if old:
            last = old[-1][:4]
            sliced = carried_at(last[0], last[1], last[2], last[3], PRICE_GRID_ARRAY, cells=cells)
            assert sliced.tolist() == [_loop_shares([(*last, 1.0)], [p])[0] for p in PRICE_GRID]


def _record(rng: np.random.Generator, k: int) -> tuple[list[float], list[float], float]:
    return rng.dirichlet(np.ones(k)).tolist(), rng.dirichlet(np.ones(k)).tolist(), float(rng.integers(1, 60))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 300), min_size=1, max_size=6), st.integers(1, 3))
def test_shrink_scores_match_the_per_value_loop(seed, sizes, kept) -> None:
    """Bit for bit over more steps than kept, each strength's sum taken over the same records in the same order."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    fit = ShrinkFit(steps=kept)
    old: deque = deque(maxlen=kept)
    for size in sizes:
        records = [(_record(rng, k), int(rng.integers(0, k))) for _ in range(size)]
        for rec, truth in records:
            fit.finish([rec], truth)
        fit.end_step()
        if records:
            own, prior, n = (np.asarray([r[0][i] for r in records]) for i in range(3))
            old.append((own, prior, n, np.asarray([t for _, t in records], np.int64)))
        assert fit.scores() == _loop_scores(list(old), fit.decay)


def _traj(sizes: list[tuple[str, int]]) -> Trajectory:
    turns = [Turn(gen_tokens=10, tool=tool, tool_status="ok", tool_tokens=n) for tool, n in sizes]
    return Trajectory(prompt_id="p", prompt_tokens=10, turns=(*turns, Turn(gen_tokens=10)))


_RETURN = st.tuples(st.sampled_from(["search", "code", "user"]), st.integers(0, 40_000))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.lists(_RETURN, max_size=5), max_size=4), min_size=1, max_size=6),
    st.sampled_from(["quantile", "breaks"]),
    st.integers(1, 4),
    st.integers(2, 30),
)
def test_size_class_edges_match_the_deque_algorithm(steps, method, classes, sample) -> None:
    """Bit for bit, with samples short enough that the oldest sizes drop out, and after a merge of two codecs."""
    options = {
        "method": method,
        "classes": classes,
        "sample": sample,
        "min_samples": 3,
        "tools": ("search", "code", "user"),
    }
    new, old = QuantileStateCodec(**options), _DequeCodec(**options)
    for step in steps:
        trajs = [_traj(returns) for returns in step]
        new.observe(trajs)
        old.observe(trajs)
        assert new.state() == old.state()
    other = QuantileStateCodec(**options)
    other.observe([_traj(returns) for step in steps[::-1] for returns in step])
    new.absorb(other)
    for tool, sizes in other._recent.items():  # the reference's absorb: the other's samples as newer than ours
        old.old_recent.setdefault(tool, deque(maxlen=sample)).extend(sizes)
    old.old_pooled.extend(other._pooled)
    assert [len(q) for q in new._recent.values()] == [len(q) for q in old.old_recent.values()]
    assert list(new._pooled) == list(old.old_pooled)
    if other._pooled:
        assert new._pooled_edges == old._old_quantiles(old.old_pooled)
    for tool, q in new._recent.items():
        if len(q) >= 3:
            assert new.edges_for(tool) == old._old_quantiles(old.old_recent[tool])


# -- a step end's work does not grow with the history kept --------------------------------------------------------
def test_prompt_length_bins_step_end_does_not_loop_over_the_window() -> None:
    """One request's step end makes as many calls after 5,000 requests as after 50 (it used to look each request of
    the window up in the bins one call at a time: 4 ms a step end on one-request steps)."""
    rng = random.Random(0)
    counts = []
    for history in (50, 5000):
        bins = PromptLengthBins()
        for _ in range(history):
            bins.observe(rng.randint(50, 2000), rng.randint(0, 3))
        bins.end_step()
        bins.observe(100, 1)
        counts.append(_calls(bins.end_step))
    assert counts[1] == counts[0]


def test_size_classes_take_log1p_of_new_sizes_only(monkeypatch) -> None:
    """A step end takes the log1p of the step's new sizes only (and of the edges), not of every size kept: as many
    after 1,000 distinct sizes as after 30 (the whole sample's used to be taken at every step end)."""
    taken: list[float] = []

    def log1p(x: float) -> float:
        taken.append(x)
        return _LOG1P(x)

    monkeypatch.setattr(math, "log1p", log1p)
    counts = []
    for history in (30, 1000):
        codec = QuantileStateCodec.from_spec("breaks:4")
        codec.observe([_traj([("search", 100 + 7 * i)]) for i in range(history)])
        taken.clear()
        codec.observe([_traj([("search", 55)])])
        counts.append(len(taken))
    assert counts[1] == counts[0] <= 2 + 2 * 3  # the new size (tool and pooled samples), 3 edges of each


_LOG1P = math.log1p


def test_a_router_pickled_with_deques_learns_on_as_one_that_kept_arrays() -> None:
    """A checkpoint written before the arrays (prompt-length bins and size-class samples kept in deques) loads into
    the arrays and learns on exactly as the codec and bins that kept them."""
    bins = PromptLengthBins(window=5)
    for i in range(8):
        bins.observe(100 + 37 * i, i % 3)
    bins.end_step()
    loaded = PromptLengthBins.__new__(PromptLengthBins)
    old_pairs = deque(zip(bins._lengths.astype(int).tolist(), bins._buckets.tolist()), maxlen=5)
    loaded.__setstate__({"bins": 10, "_seen": old_pairs, "_edges": bins._edges, "_majority": bins._majority})
    codec = QuantileStateCodec(sample=6, min_samples=3)
    codec.observe([_traj([("search", 10 * i), ("code", 3 * i)]) for i in range(1, 9)])
    fields, own = codec.__getstate__()
    own = {
        **own,
        "_pooled": deque(codec._pooled, maxlen=24),
        "_recent": {tool: deque(q, maxlen=6) for tool, q in codec._recent.items()},
    }
    restored = QuantileStateCodec.__new__(QuantileStateCodec)
    restored.__setstate__((fields, own))
    for b in (bins, loaded):
        b.observe(999, 2)
        b.end_step()
    for c in (codec, restored):
        c.observe([_traj([("search", 5), ("code", 400)])])
    assert np.array_equal(loaded._edges, bins._edges) and loaded._majority == bins._majority
    assert restored.state() == codec.state() and list(restored._pooled) == list(codec._pooled)
