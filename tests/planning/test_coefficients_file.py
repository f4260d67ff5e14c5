"""`load_coefficients`: overrides from YAML/JSON, defaults for the rest, one-line errors naming the field."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning.cost import CostCoefficients, load_coefficients
from libra.spec import SpecError


def test_a_round_trip_of_every_field_gives_the_same_coefficients(tmp_path) -> None:
    fitted = CostCoefficients().replace(tp_step_overhead_s=0.0012, hbm_efficiency=0.85, max_num_seqs=256)
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(attrs.asdict(fitted)))
    assert load_coefficients(path) == fitted


def test_fields_left_out_keep_their_defaults(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("allreduce_latency_s: 2.0e-6\nmax_num_seqs: 128.0\n")
    loaded = load_coefficients(path)
    assert loaded == CostCoefficients().replace(allreduce_latency_s=2e-6, max_num_seqs=128)
    assert isinstance(loaded.max_num_seqs, int)


@pytest.mark.parametrize(
    "text,message",
    [
        ("tp_step_overhed_s: 0.001\n", "unknown field(s) tp_step_overhed_s"),
        ("hbm_efficiency: 1.5\n", "hbm_efficiency must be a number in (0, 1]"),
        ("decode_mfu: 0\n", "decode_mfu must be a number in (0, 1]"),
        ("max_num_seqs: 2.5\n", "max_num_seqs must be a whole number in [1, 1,000,000]"),
        ("step_overhead_s: -1\n", "step_overhead_s must be a finite number in [0, 1e+06]"),
        ("step_overhead_s: .nan\n", "step_overhead_s must be a finite number in [0, 1e+06]"),
        ("step_overhead_s: 1e30\n", "step_overhead_s must be a finite number in [0, 1e+06]"),
        ("per_request_overhead_s: true\n", "per_request_overhead_s must be a finite number in [0, 1e+06]"),
        ("logprob_forward_passes: 1.5\n", "logprob_forward_passes must be a whole number in [0, 100]"),
        ("dp_overlap: 1e12\n", "dp_overlap must be a number in [0, 1]"),
        ("dp_overlap: -0.5\n", "dp_overlap must be a number in [0, 1]"),
        ("- 1\n- 2\n", "expected a mapping"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, text, message) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_coefficients(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_exponents_without_a_dot_load_as_numbers(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("allreduce_latency_s: 3e-6\nstep_overhead_s: 4E-3\ndp_overlap: 0.5\n")
    loaded = load_coefficients(path)
    assert loaded.allreduce_latency_s == 3e-6 and loaded.step_overhead_s == 4e-3


_FIELDS = sorted(f.name for f in attrs.fields(CostCoefficients))
_NOT_A_NUMBER = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), None, True, False, "0.5", [0.5], {"v": 1}]),
    st.floats(max_value=-1e-9),
)


@settings(max_examples=150)
@given(st.sampled_from(_FIELDS), _NOT_A_NUMBER, st.sampled_from([".json", ".yaml"]))
def test_no_field_accepts_a_value_that_is_not_a_number_in_range(tmp_path_factory, field, value, suffix) -> None:
    """NaN, infinities, negatives, booleans, strings, null or containers in any field of a calibration file are a
    one-line error naming the file and the field, never a coefficient that poisons every prediction."""
    path = tmp_path_factory.mktemp("coeffs") / f"c{suffix}"
    path.write_text(json.dumps({field: value}))  # JSON is YAML too (NaN and Infinity aside: yaml reads them as text)
    with pytest.raises(SpecError) as err:
        load_coefficients(path)
    line = str(err.value)
    assert line.startswith(f"{path}: {field} must be") and "\n" not in line, line
