"""The simulator's speed changes move no number: full reports of small scenarios (`tests/sim/golden_reports.py`)
equal the committed ones exactly (every float of every stage record and decision, every policy)."""

import json

import pytest

from tests.sim.golden_reports import GOLDEN, cases, report_of


@pytest.mark.parametrize(
    "name", ["r2e-gym", "r2e-gym-queued", "search-r1-interleaved-new", "dapo-math-off", "many-turn"]
)
def test_report_equals_the_golden_one(name, tmp_path):
    scenario, steps = cases(tmp_path)[name]
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = report_of(scenario, steps)
    assert got["policies"] == want["policies"]
    assert got == want
