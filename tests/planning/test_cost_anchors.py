"""The cost model's defaults against the published measurements in anchors.yaml (docs/cost-model.md)."""

from __future__ import annotations

import math

import attrs
import pytest

from libra.planning.cost import CostCoefficients
from libra.planning.cost.anchors import ANCHOR_FIT, family_errors, load_anchors
from libra.planning.cost.coefficients import _FRACTIONS

ANCHORS = load_anchors()
FAMILIES = sorted({a.family for a in ANCHORS})


def test_every_anchor_names_its_source_and_a_number_as_published() -> None:
    assert len(ANCHORS) >= 25 and len({a.id for a in ANCHORS}) == len(ANCHORS)
    for a in ANCHORS:
        assert a.url.startswith("https://github.com/") and a.where
        assert a.published > 0 and a.unit and a.split in ("fit", "check")
        assert math.isfinite(a.time_s) and a.time_s > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_has_held_out_anchors(family: str) -> None:
    members = [a for a in ANCHORS if a.family == family]
    assert any(a.split == "check" for a in members) and any(a.split == "fit" for a in members)


@pytest.mark.parametrize("family", FAMILIES)
def test_defaults_meet_the_anchors_of_each_family(family: str) -> None:
    """MAPE <= 20 % per family, on all its anchors and on the held-out ones the fit never saw."""
    (err,) = [e for e in family_errors(ANCHORS) if e.family == family]
    assert err.mape_all <= 20.0, err
    assert err.mape_held_out <= 20.0, err


def test_the_anchors_discriminate_the_coefficients_they_fit() -> None:
    """Moving any fitted coefficient by 2x (or an efficiency halfway to 0) raises the MAPE of some family by at
    least 2 points: each one is pinned by data, not free (step_overhead_s is the weakest, +2.3 points)."""
    base = CostCoefficients()
    before = {e.family: e.mape_all for e in family_errors(ANCHORS, base)}
    for name in ANCHOR_FIT:
        value = getattr(base, name)
        if name in _FRACTIONS:
            moved = value / 2.0
        else:
            moved = value * 2.0 if value > 0 else 5e-3
        after = family_errors(ANCHORS, attrs.evolve(base, **{name: moved}))
        rise = max(e.mape_all - before[e.family] for e in after)
        assert rise >= 2.0, (name, rise)
