"""Number checks shared by every package: one message shape, "<owner>.<name> must be <what>, got <value!r>".

A bool is never a number (`True` would pass as 1); numpy's integers and floats are numbers like Python's. Each
check returns the value as a plain `int` or `float`, for callers that keep it. `type(value) is int` (or `float`)
comes first: the planner builds values in loops, and the `numbers` ABCs cost more than the exact type test.

A module with its own error class and wording (`RunConfigError`, the elastic side channel's ValueError) still takes
its numbers through `is_whole` and `as_float`, so that it accepts and refuses what these checks do.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NoReturn

from libra.spec.errors import SpecError


def fail(owner: str, name: str, what: str, value: Any) -> NoReturn:
    """Raise the one-line SpecError every check raises."""
    raise SpecError(f"{owner}.{name} must be {what}, got {value!r}")


def is_whole(value: Any) -> bool:
    """An integer, not a bool (numpy integers too)."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def is_real(value: Any) -> bool:
    """A real number, not a bool (numpy integers and floats too); NaN and inf included."""
    kind = type(value)
    return kind is float or kind is int or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def as_float(value: Any) -> float:
    """`value` as a float where it is a real number (not a bool), NaN otherwise: an integer too large for a float
    (`float(10**400)` raises OverflowError) or a string is no number a check accepts."""
    if not is_real(value):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def whole(owner: str, name: str, value: Any, low: int, high: int | None = None, *, none: bool = False) -> Any:
    """`value` is an integer in [`low`, `high`] (no upper bound without `high`), or None where `none`."""
    if none and value is None:
        return None
    if is_whole(value):
        n = int(value)
        if n >= low and (high is None or n <= high):
            return n
    what = f"an integer >= {low}" if high is None else f"an integer in [{low:,}, {high:,}]"
    fail(owner, name, what + (" or None" if none else ""), value)


def number(
    owner: str,
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    *,
    above: bool = False,
    below: bool = False,
    none: bool = False,
) -> Any:
    """`value` is a finite real number >= `low` (> with `above`) and <= `high` (< with `below`) where given, or None
    where `none`."""
    if none and value is None:
        return None
    x = as_float(value)
    if math.isfinite(x) and (x > low if above else x >= low) and (high is None or (x < high if below else x <= high)):
        return x
    fail(owner, name, f"a finite number {_range(low, high, above, below)}" + (" or None" if none else ""), value)


def limit(owner: str, name: str, value: Any, low: float, *, above: bool = True) -> float:
    """`value` is a real number > `low` (>= without `above`), or +inf: an open-ended limit such as a last bucket's
    length, or a price that nothing pays."""
    x = as_float(value)
    if x > low if above else x >= low:  # NaN fails
        return x
    fail(owner, name, f"a number {'>' if above else '>='} {low:g} (inf allowed)", value)


def fraction(owner: str, name: str, value: Any) -> float:
    """`value` is a finite number in [0, 1]."""
    x = as_float(value)
    if 0.0 <= x <= 1.0:  # NaN fails
        return x
    fail(owner, name, "a fraction in [0, 1]", value)


def seconds(owner: str, name: str, value: Any, *, none: bool = False) -> Any:
    """`value` is finite seconds >= 0, or None (unknown) where `none`."""
    if none and value is None:
        return None
    x = as_float(value)
    if 0.0 <= x < math.inf:  # NaN fails
        return x
    fail(owner, name, "finite seconds >= 0" + (" or None" if none else ""), value)


def flag(owner: str, name: str, value: Any) -> bool:
    """`value` is True or False (a string "false" or the number 1 is neither)."""
    if value is True or value is False:
        return value
    fail(owner, name, "True or False", value)


def instance(owner: str, name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    """`value` is an instance of `kind`; the message shows the type given, and at most 60 characters of it."""
    if not isinstance(value, kind):
        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise SpecError(f"{owner}.{name} must be a {want}, got {type(value).__name__} {shown}")


def text(owner: str, name: str, value: Any, longest: int = 200) -> str:
    """`value` is a non-empty string of at most `longest` characters."""
    if isinstance(value, str) and 0 < len(value) <= longest:
        return value
    fail(owner, name, "a non-empty string", value)


def _range(low: float, high: float | None, above: bool, below: bool) -> str:
    lower = f"{'>' if above else '>='} {low:g}"
    return lower if high is None else f"{lower} and {'<' if below else '<='} {high:g}"
