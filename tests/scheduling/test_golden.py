"""The router's decisions and the prefix tree's statistics are unchanged by speed work: digests of every decision
(all C-MLFQ presets, two workloads, one with evictions) and of `PrefixTree.to_dict` after each update (with
evictions), on seeded synthetic traces, against values computed with the code before the issue-16 speed changes
(commit 544da9f); the adaptive preset's changed in issue 14 (fitted shrinkage, the budget's price mix; then the
admission experts and the cold budget; then the run-level budget target `repay`, `hold_first` and the cold budget
booking what a move carries): its `-prev` cases check that without the experts, the cold budget, `repay` and
`hold_first` it decides exactly as before the experts, its `-fixed` cases that without the fitted mechanisms too it
decides exactly as at 544da9f.
tests/scheduling/golden_router.py computes them."""

from __future__ import annotations

import pytest

from tests.scheduling.golden_router import ROUTER_CASES, TREE_CASES, compute_router, compute_tree

GOLDEN_ROUTER = {
    "search-r1/published": "8903f8d3fe709e5e",
    "search-r1/accuracy": "c9d8c6c631a22e9f",
    "search-r1/budget": "7dbdf4ff4e021707",
    "search-r1/priced": "966ca8a99ca08d51",
    "search-r1/adaptive": "28ff6559fa99eb42",  # issue 14: + the run-level budget target, held first step (deliberate)
    "search-r1/adaptive-prev": "d8e7844e91a793b1",  # fitted shrinkage and the budget's price mix
    "search-r1/adaptive-fixed": "3b4ec524d530733c",  # the adaptive preset without them: unchanged since 544da9f
    "r2e-gym/published": "7a392c0539dcce7c",
    "r2e-gym/accuracy": "af279c2cc53d724d",
    "r2e-gym/budget": "10bac482ee6b7047",
    "r2e-gym/priced": "41621f1864e6923a",
    "r2e-gym/adaptive": "8f2b14c6d120a499",
    "r2e-gym/adaptive-prev": "82b0fc882cebf0c5",
    "r2e-gym/adaptive-fixed": "985e542f7a24920b",
    "r2e-gym/adaptive-small": "1b341965d3e9808c",
    "r2e-gym/adaptive-small-prev": "88f61b40d5604310",
    "r2e-gym/adaptive-small-fixed": "d715804ef3b1a288",
}
GOLDEN_TREE = {
    "search-r1-default": "c7418eae69f6cb81",
    "r2e-gym-breaks-evict": "ef6bd0ed506960af",
    "search-r1-quantile-evict": "68809bd3e54148a4",
}


@pytest.mark.parametrize("case", ROUTER_CASES, ids=lambda c: f"{c[0]}/{c[1]}")
def test_router_decisions_unchanged(case) -> None:
    assert compute_router(case) == GOLDEN_ROUTER[f"{case[0]}/{case[1]}"]


@pytest.mark.parametrize("name", list(TREE_CASES))
def test_tree_statistics_unchanged(name) -> None:
    assert compute_tree(name) == GOLDEN_TREE[name]
