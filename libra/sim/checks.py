"""Checks of the simulator's settings at construction: an error names the field, the value and what is valid (a NaN
slice length looped forever, a zero slice count divided by zero, a negative latency ran time backwards)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from libra.spec import SpecError


def check_int(owner: str, name: str, value: Any, low: int) -> None:
    """`value` is an integer (not a bool; numpy integers too) >= `low`."""
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= low):
        raise SpecError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


def check_number(
    owner: str, name: str, value: Any, low: float, *, above: bool = False, high: float | None = None
) -> None:
    """`value` is a finite real number >= `low` (> `low` with `above`) and <= `high` where given."""
    x = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    ok = math.isfinite(x) and (x > low if above else x >= low) and (high is None or x <= high)
    if not ok:
        valid = f"{'>' if above else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")
        raise SpecError(f"{owner}.{name} must be a finite number {valid}, got {value!r}")


def check_type(owner: str, name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind):
        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise SpecError(f"{owner}.{name} must be a {want}, got {type(value).__name__} {shown}")
