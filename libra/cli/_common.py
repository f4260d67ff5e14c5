"""Shared CLI plumbing: one-line errors, JSON on stdout, logs on stderr, readable tables."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from libra.spec.jsonable import jsonable


class CLIError(Exception):
    """An error to print as one line (no traceback) with a non-zero exit."""


def log(message: str) -> None:
    print(message, file=sys.stderr)


def emit_json(obj: dict[str, Any]) -> None:
    print(json.dumps(jsonable(obj), indent=2))


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if "." in f"{value:.{digits}f}" else f"{value:,}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> str:
    """A plain-text table with right-aligned numbers."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) if rows else False for i in range(len(headers))]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if num else s.ljust(w) for s, w, num in zip(items, widths, numeric)).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(headers))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, Any]], *, title: str | None = None) -> str:
    width = max(len(k) for k, _ in pairs)
    out = [title] if title else []
    out.extend(f"{k.ljust(width)}  {fmt(v)}" for k, v in pairs)
    return "\n".join(out)
