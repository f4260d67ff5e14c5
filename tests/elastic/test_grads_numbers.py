"""The side channel's argument checks read numbers as `libra.spec.checks` does and still raise ValueError."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from libra.elastic.grads import check_seconds, check_whole


def test_seconds_too_large_for_a_float_are_a_value_error() -> None:
    # before: float(10**400) raised OverflowError, which a caller catching ValueError let through
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0, got 1000"):
        check_seconds("timeout_s", 10**400)


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "5", None])
def test_seconds_refused(value) -> None:
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0, got "):
        check_seconds("timeout_s", value)


def test_numpy_numbers_are_numbers() -> None:
    assert check_seconds("timeout_s", np.float32(2.5)) == 2.5 and check_seconds("t", Fraction(1, 2)) == 0.5
    out = check_whole("history", np.int64(3), least=1)
    assert out == 3 and type(out) is int
    for bad in (True, np.float64(3.0), np.int64(0)):
        with pytest.raises(ValueError, match=r"^history must be a whole number >= 1, got "):
            check_whole("history", bad, least=1)
