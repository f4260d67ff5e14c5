"""Properties of the router's step-end learning that mutation testing of the arrays it now keeps (the prompt-length
bins, the budget's and the shrinkage's per-step sums, the size-class samples) found unchecked: a pickle round trip,
a checkpoint written before the arrays or the per-step sums, and a read of the grid that reuses those sums
(docs/testing.md, "Mutation testing", 2026-12-06)."""

from __future__ import annotations

import pickle
from collections import deque

import numpy as np
import pytest

from libra.scheduling import budget as budget_module
from libra.scheduling import shrinkage as shrinkage_module
from libra.scheduling.budget import PRICE_GRID, MigrationBudget
from libra.scheduling.experts import PromptLengthBins
from libra.scheduling.shrinkage import SHRINK_GRID, ShrinkFit


def _bins_after(steps: list[list[tuple[int, int]]], bins: PromptLengthBins) -> PromptLengthBins:
    for step in steps:
        for length, bucket in step:
            bins.observe(length, bucket)
        bins.end_step()
    return bins


_STEPS = [[(100 + 37 * i, i % 3) for i in range(8)], [(999, 2), (40, 0)], [(1500, 1)]]


def test_prompt_length_bins_survive_a_pickle_round_trip() -> None:
    """A router is copied and checkpointed by pickle: bins pickled with their arrays load and learn on as the
    original (unpickling one that never had the old deque must not look for it)."""
    bins = _bins_after(_STEPS[:1], PromptLengthBins(window=6))
    copy = pickle.loads(pickle.dumps(bins))
    for b in (bins, copy):
        _bins_after(_STEPS[1:], b)
    assert np.array_equal(copy._edges, bins._edges) and copy._majority == bins._majority
    assert copy.window == 6 and copy.guess(1000) == bins.guess(1000)


def test_bins_pickled_with_an_empty_deque_learn_on_as_new_ones() -> None:
    """A checkpoint taken before any request finished (an empty window deque) loads into arrays that learn as fresh
    ones do: the buckets stay integers, which the bin counts need."""
    loaded = PromptLengthBins.__new__(PromptLengthBins)
    loaded.__setstate__({"bins": 4, "_seen": deque(maxlen=6), "_edges": np.zeros(0), "_majority": []})
    assert loaded.guess(10) is None and loaded._buckets.dtype.kind == "i"
    fresh = _bins_after(_STEPS, PromptLengthBins(bins=4, window=6))
    _bins_after(_STEPS, loaded)
    assert np.array_equal(loaded._edges, fresh._edges) and loaded._majority == fresh._majority


def _shrink_fit(seed: int = 0, steps: int = 3) -> ShrinkFit:
    rng = np.random.default_rng(seed)
    fit = ShrinkFit(steps=steps)
    for size in (5, 0, 7, 3):
        for _ in range(size):
            own, prior = rng.dirichlet(np.ones(3)).tolist(), rng.dirichlet(np.ones(3)).tolist()
            fit.finish([(own, prior, float(rng.integers(1, 40)))], int(rng.integers(0, 3)))
        fit.end_step()
    return fit


def _budget(steps: int = 3) -> MigrationBudget:
    budget = MigrationBudget(0.1, steps=steps)
    for s in range(4):
        for r in range(3 + s):
            budget.finish([(0.1 * r, 2.0 + 5 * s, 100 + r), None, (1.0, 40.0, 7 * r + s)], 1_000 + 10 * r)
        budget.end_step()
    return budget


def _fail(*args, **kwargs):
    raise AssertionError("recomputed what the step end counted")


@pytest.mark.parametrize("grid", [SHRINK_GRID, list(SHRINK_GRID)])
def test_shrink_scores_at_the_grid_read_the_sums_counted_at_each_step_end(grid, monkeypatch) -> None:
    """The grid (as the tuple or any sequence of its values) is scored from each kept step's sums, without a pass
    over the step's records: what makes a step end cost the same however many steps are kept."""
    fit = _shrink_fit()
    expected = fit.scores()
    monkeypatch.setattr(shrinkage_module, "step_briers", _fail)
    assert fit.scores(grid) == expected


def test_shrink_scores_at_other_strengths_are_their_own() -> None:
    """A grid other than the fitted one is scored at its own strengths, not read from the grid's sums."""
    fit = _shrink_fit()
    full = fit.scores()
    assert fit.scores(SHRINK_GRID[::-1]) == full[::-1]
    assert fit.scores((SHRINK_GRID[2],)) == [full[2]]


def test_shrink_steps_kept_before_the_sums_score_as_new_ones() -> None:
    """A fit pickled when a step was (node shares, root shares, survivors, buckets), without its sums, scores and
    chooses as one that counted them."""
    fit = _shrink_fit()
    old = pickle.loads(pickle.dumps(fit))
    old._steps = deque((s[:4] for s in old._steps), maxlen=old._steps.maxlen)
    assert old.scores() == fit.scores() and old.choose(3.0) == fit.choose(3.0)


@pytest.mark.parametrize("prices", [PRICE_GRID, list(PRICE_GRID)])
def test_budget_shares_at_the_grid_read_what_each_step_end_counted(prices, monkeypatch) -> None:
    """The grid prices (the tuple or any sequence of them) read what each kept step carries at each grid price,
    counted at its end, without a pass over the step's points."""
    budget = _budget()
    expected = budget.shares()
    monkeypatch.setattr(budget_module, "carried_at", _fail)
    assert budget.shares(prices) == expected


def test_budget_shares_at_other_prices_are_their_own() -> None:
    budget = _budget()
    full = budget.shares()
    assert budget.shares(PRICE_GRID[::-1]) == full[::-1]
    assert budget.shares((PRICE_GRID[5], PRICE_GRID[30])) == [full[5], full[30]]


def test_budget_steps_kept_before_the_grid_counts_share_as_new_ones() -> None:
    """A budget pickled when a step was (requests, lows, highs, carried, tokens), without what it carries at each
    grid price, gives the same shares and price as one that counted it."""
    budget = _budget()
    old = pickle.loads(pickle.dumps(budget))
    old._steps = deque((s[:5] for s in old._steps), maxlen=old._steps.maxlen)
    assert old.shares() == budget.shares() and old.choose(1.0) == budget.choose(1.0)
