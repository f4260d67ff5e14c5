"""The shared number checks (`libra.spec.checks`): a bool is never a number, numpy's numbers are numbers, NaN and
inf fail a finite check, and every message is "<owner>.<name> must be <what>, got <value!r>" on one line."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from libra.spec import SpecError, checks


@pytest.mark.parametrize("value", [True, False, 2.0, "2", None, np.float64(2.0), Fraction(2, 1)])
def test_whole_refuses_what_is_not_an_integer(value) -> None:
    with pytest.raises(SpecError, match=rf"^Owner\.count must be an integer >= 0, got {re.escape(repr(value))}$"):
        checks.whole("Owner", "count", value, 0)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.int32(3)])
def test_whole_takes_numpy_integers_and_returns_an_int(value) -> None:
    out = checks.whole("Owner", "count", value, 1, 3)
    assert out == 3 and type(out) is int


def test_whole_bounds_and_none() -> None:
    with pytest.raises(SpecError, match=r"^Owner\.n must be an integer in \[1, 10,000\], got 10001$"):
        checks.whole("Owner", "n", 10_001, 1, 10_000)
    with pytest.raises(SpecError, match=r"^Owner\.n must be an integer >= 1 or None, got 0$"):
        checks.whole("Owner", "n", 0, 1, none=True)
    assert checks.whole("Owner", "n", None, 1, none=True) is None
    with pytest.raises(SpecError, match=r"got None$"):
        checks.whole("Owner", "n", None, 1)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1.0", None, np.float64("nan"), 10**400])
def test_number_refuses_non_finite_and_non_numbers(value) -> None:
    with pytest.raises(SpecError, match=r"^Owner\.x must be a finite number >= 0, got "):
        checks.number("Owner", "x", value, 0.0)


def test_number_bounds_read_as_they_are_checked() -> None:
    assert checks.number("O", "x", np.float32(0.5), 0.0, 1.0, above=True, below=True) == 0.5
    for value, above, below, what in (
        (0.0, True, False, "> 0 and <= 1"),
        (1.0, False, True, ">= 0 and < 1"),
        (1.5, False, False, ">= 0 and <= 1"),
    ):
        with pytest.raises(SpecError, match=rf"^O\.x must be a finite number {what}, got {value!r}$"):
            checks.number("O", "x", value, 0.0, 1.0, above=above, below=below)
    assert checks.number("O", "x", None, 0.0, none=True) is None


def test_limit_takes_inf_but_not_nan() -> None:
    assert checks.limit("O", "max_tokens", math.inf, 0.0) == math.inf
    assert checks.limit("O", "price", 0, 0.0, above=False) == 0.0
    for value in (math.nan, 0.0, -math.inf, "inf", False):
        with pytest.raises(SpecError, match=r"^O\.max_tokens must be a number > 0 \(inf allowed\), got "):
            checks.limit("O", "max_tokens", value, 0.0)


def test_fraction_seconds_flag_and_text() -> None:
    assert checks.fraction("O", "f", 1) == 1.0 and checks.seconds("O", "s", np.float64(2.5)) == 2.5
    assert checks.seconds("O", "s", None, none=True) is None and checks.flag("O", "b", False) is False
    cases = (
        (lambda: checks.fraction("O", "f", 1.01), r"^O\.f must be a fraction in \[0, 1\], got 1\.01$"),
        (lambda: checks.fraction("O", "f", math.nan), r"^O\.f must be a fraction in \[0, 1\], got nan$"),
        (lambda: checks.seconds("O", "s", math.inf), r"^O\.s must be finite seconds >= 0, got inf$"),
        (lambda: checks.seconds("O", "s", -0.5, none=True), r"^O\.s must be finite seconds >= 0 or None, got -0\.5$"),
        (lambda: checks.flag("O", "b", "false"), r"^O\.b must be True or False, got 'false'$"),
        (lambda: checks.flag("O", "b", 1), r"^O\.b must be True or False, got 1$"),
        (lambda: checks.text("O", "name", ""), r"^O\.name must be a non-empty string, got ''$"),
        (lambda: checks.instance("O", "gpu", "x" * 100, int), r"^O\.gpu must be a int, got str 'x{56}\.\.\.$"),
    )
    for call, message in cases:
        with pytest.raises(SpecError, match=message):
            call()
