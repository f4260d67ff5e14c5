"""The cost model's defaults against the published measurements in anchors.yaml (docs/cost-model.md)."""

from __future__ import annotations

import math

import attrs
import pytest

from libra.planning.cost import CostCoefficients
from libra.planning.cost.anchors import ANCHOR_FIT, ANCHORS_FILE, family_errors, load_anchors
from libra.planning.cost.coefficients import _FRACTIONS
from libra.spec import SpecError

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


# (what to replace in anchors.yaml, what to put there, what the one-line error must say)
_BAD_ANCHORS = [
    ("published: 104.9", "published: .nan", "anchor 'gptfast-7b-tp1': published must be a finite number > 0, got nan"),
    ("published: 104.9", "published: -104.9", "anchor 'gptfast-7b-tp1': published must be a finite number > 0"),
    ("published: 104.9", "published: 0", "anchor 'gptfast-7b-tp1': published must be a finite number > 0, got 0"),
    ("published: 104.9", 'published: "fast"', "anchor 'gptfast-7b-tp1': published must be a finite number > 0"),
    ("tp: 1, context: 5,", "tp: 1, context: .inf,", "anchor 'gptfast-7b-tp1': context must be a finite number > 0"),
    ("tp: 1, context: 5,", "context: 5,", "anchor 'gptfast-7b-tp1': missing field(s) tp for kind decode_batch1"),
    ("tp: 1, context: 5,", "tp: 1.5, context: 5,", "anchor 'gptfast-7b-tp1': tp must be a whole number >= 1"),
    ("unit: tokens/s, split: fit}", "unit: tokens/s, split: train}", "split must be fit or check, got 'train'"),
    ("unit: tokens/s/GPU, note", "unit: tok/s, note", "unit must be one of s, tokens/s, tokens/s/GPU"),
    ("input: 128, published: 16, unit: ms", "input: 128, published: 16, unit: s", "unit must be one of ms"),
    (
        "source: gpt-fast, gpu: A100-80GB, model: Llama-2-7B,\n     tp: 1",
        "source: gptfast, gpu: A100-80GB, model: Llama-2-7B,\n     tp: 1",
        "anchor 'gptfast-7b-tp1': source 'gptfast' is not one of the sources",
    ),
    ("micro_batch: 64, recompute: true", "micro_batchs: 64, recompute: true", "missing field(s) micro_batch"),
    ("micro_batch: 64, recompute: true", "micro_batch: 64, recompute: 1", "recompute must be true or false"),
    (
        "gpus: 64, pp: 4, ep: 8, seq_len: 4096, global_batch: 1280",
        "gpus: 60, pp: 4, ep: 8, seq_len: 4096, global_batch: 1280",
        "gpus(60) must be a multiple of tp(1) * pp(4) * ep(8)",
    ),
    ("id: gptfast-7b-tp2", "id: gptfast-7b-tp1", "anchor 'gptfast-7b-tp1': the id is used twice"),
    (
        "num_layers: 32, hidden_size: 4096, num_heads: 32",
        "num_layers: 0, hidden_size: 4096, num_heads: 32",
        "model 'Llama-2-7B': ModelSpec.num_layers must be",
    ),
    # an integer too large for a float: a traceback from math.isfinite before
    (
        "published: 104.9",
        "published: 1" + "0" * 400,
        "anchor 'gptfast-7b-tp1': published must be a finite number > 0, got 1000",
    ),
    (
        "tp: 1, context: 5,",
        "tp: 1, context: 1" + "0" * 400 + ",",
        "anchor 'gptfast-7b-tp1': context must be a finite number > 0, got 1000",
    ),
    (
        "tp: 1, context: 5,",
        "tp: 1" + "0" * 400 + ", context: 5,",
        "anchor 'gptfast-7b-tp1': tp must be a whole number >= 1, got 1000",
    ),
]


@pytest.mark.parametrize(("old", "new", "message"), _BAD_ANCHORS)
def test_a_bad_anchors_file_is_a_one_line_error_naming_the_file_and_field(tmp_path, old, new, message) -> None:
    """A table of measurements the defaults are fitted to must not load NaN, a negative or a mistyped number, an
    unknown unit or split, or a missing field as if it were data (before: NaN errors, silent unit mix-ups, a
    `split` outside fit/check in neither set, KeyError tracebacks)."""
    text = ANCHORS_FILE.read_text()
    assert old in text
    path = tmp_path / "anchors.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as err:
        load_anchors(path)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and message in line and "\n" not in line, line
