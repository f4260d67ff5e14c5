"""Plans are identical to those the planner produced before its speed work (issue 16): every optimisation of the
planner must leave them bit for bit the same (floats compared exactly)."""

from __future__ import annotations

import json

import pytest

from tests.planning.golden_scenarios import GOLDEN, SCENARIOS, SLOW_SCENARIOS, plan_record, solve

_GOLDEN = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_matches_golden(name: str) -> None:
    assert plan_record(solve(SCENARIOS[name])) == _GOLDEN[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_SCENARIOS))
def test_large_plan_matches_golden(name: str) -> None:
    assert plan_record(solve(SLOW_SCENARIOS[name])) == _GOLDEN[name]
