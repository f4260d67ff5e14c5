"""One factor for every time limit in the tests.

CI machines are shared and often busy: a limit that holds on an idle machine fails on a loaded one. Every timeout a
test sets (process joins, engine starts, side-channel receives, health checks) goes through `scaled`, and
`LIBRA_TEST_TIMEOUT_FACTOR` (default 1; `scripts/test.sh` raises it) stretches them all at once. A limit only bounds
how long a test may wait for something that will happen; it never decides a pass.
"""

from __future__ import annotations

import os


def factor() -> float:
    """The stretch applied to every test timeout (`LIBRA_TEST_TIMEOUT_FACTOR`, at least 1)."""
    raw = os.environ.get("LIBRA_TEST_TIMEOUT_FACTOR", "1")
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"LIBRA_TEST_TIMEOUT_FACTOR must be a number >= 1, got {raw!r}") from exc
    if not value >= 1.0:
        raise ValueError(f"LIBRA_TEST_TIMEOUT_FACTOR must be a number >= 1, got {raw!r}")
    return value


def scaled(seconds: float) -> float:
    """`seconds` stretched by the test timeout factor."""
    return seconds * factor()
