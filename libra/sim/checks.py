"""Checks of the simulator's settings at construction: an error names the field, the value and what is valid (a NaN
slice length looped forever, a zero slice count divided by zero, a negative latency ran time backwards). The
checks themselves are `libra.spec.checks`, shared by every package; these keep the simulator's call shape."""

from __future__ import annotations

from typing import Any

from libra.spec import checks


def check_int(owner: str, name: str, value: Any, low: int) -> None:
    """`value` is an integer (not a bool; numpy integers too) >= `low`."""
    checks.whole(owner, name, value, low)


def check_number(
    owner: str, name: str, value: Any, low: float, *, above: bool = False, high: float | None = None
) -> None:
    """`value` is a finite real number >= `low` (> `low` with `above`) and <= `high` where given."""
    checks.number(owner, name, value, low, high, above=above)


def check_type(owner: str, name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    checks.instance(owner, name, value, kind)
