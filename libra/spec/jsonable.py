"""Plain JSON values for reports and `--json` output."""

from __future__ import annotations

import math
from typing import Any


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays become Python numbers and lists, tuples and sets become lists, and inf/nan become
    null (JSON has neither)."""
    if hasattr(value, "tolist") and not isinstance(value, list | tuple | dict | str):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return value
