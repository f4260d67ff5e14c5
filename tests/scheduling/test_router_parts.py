"""The default router's learnt parts, checked where mutation testing found them unchecked (`scripts/mutation.sh
router_parts`, docs/testing.md): the migration budget's step records, and the per-tool size classes on the
router's own encoding paths."""

from __future__ import annotations

import itertools

import pytest

from libra.scheduling.budget import MigrationBudget
from libra.scheduling.size_classes import QuantileStateCodec
from libra.spec import SpecError
from libra.workloads.trace import Trajectory, Turn


def _traj(pid: str, sizes: list[tuple[str, int]]) -> Trajectory:
    turns = [Turn(gen_tokens=50, tool=t, tool_status="ok", tool_tokens=n) for t, n in sizes]
    return Trajectory(prompt_id=pid, prompt_tokens=100, turns=(*turns, Turn(gen_tokens=50)))


def test_the_budget_weighs_recorded_steps_by_half_a_step_and_skips_empty_ones() -> None:
    """Each recorded step counts half as much as the one after it; a step in which nothing finished leaves no
    record (and no weight); each step's tokens are its own."""
    budget = MigrationBudget(0.08, steps=3)
    budget.end_step()
    assert not budget.recorded
    budget.finish([(0.0, 100.0, 30)], 100)  # moves at any price of the grid, carrying 30 of its 100 tokens
    budget.end_step()
    budget.end_step()  # nothing finished in this step
    budget.finish([(0.0, 100.0, 10)], 200)
    budget.end_step()
    expected = (0.5 * 30 + 10) / (0.5 * 100 + 200)
    assert all(share == pytest.approx(expected, rel=1e-12) for share in budget.shares())


def _learnt_codec(**options) -> QuantileStateCodec:
    codec = QuantileStateCodec(classes=3, method="quantile", min_samples=5, **options)
    returns = [("search", n) for n in range(100, 1100, 10)] + [("user", n) for n in range(5, 55)]
    # (tools keyed by name: each in every trajectory, and told apart by what follows their first returns)
    codec.observe([_traj(f"p{i}", returns) for i in range(8)])
    return codec


def test_returns_share_a_code_exactly_when_they_share_their_tools_class() -> None:
    """`encode` (a return at a time) and `encode_trajectories` (a step's finished runs) use each tool's own
    classes, as `size_class` does: a user's 50-token reply is large for a user, a 50-token search result small."""
    codec = _learnt_codec()
    sizes = [5, 20, 50, 100, 500, 1000]
    for tool in ("search", "user"):
        codes = [codec.encode(tool, n, "ok") for n in sizes]
        classes = [codec.size_class(n, tool) for n in sizes]
        for i, j in itertools.combinations(range(len(sizes)), 2):
            assert (codes[i] == codes[j]) == (classes[i] == classes[j]), (tool, sizes[i], sizes[j])
        assert codec.encode_trajectories([_traj("q", [(tool, n) for n in sizes])], limit=100) == [codes]
    assert codec.size_class(10, "user") != codec.size_class(50, "user")  # the per-tool classes differ here


def test_the_size_classes_keep_the_routers_closed_set_of_tools() -> None:
    codec = _learnt_codec(tools=["search", "user"])
    with pytest.raises(SpecError, match="unknown tool 'bash'"):
        codec.encode("bash", 10, "ok")


@pytest.mark.parametrize("classes", [True, 0, 2.0, "3"])
def test_a_class_count_that_is_not_a_positive_integer_is_refused(classes) -> None:
    with pytest.raises(SpecError, match="size classes must be an integer >= 1"):
        QuantileStateCodec(classes=classes)
