"""`trusted_turns`, the generators' fast path to `Turn` values, makes exactly what the constructor makes."""

from __future__ import annotations

import attrs

from libra.workloads.trace import _TURN_FIELDS, Turn, trusted_turns


def test_sets_every_field_of_turn() -> None:
    assert set(_TURN_FIELDS) == {a.name for a in attrs.fields(Turn)}


def test_same_values_as_the_constructor() -> None:
    rows = [(5, None, None, 0, {}), (12, "bash", "error", 700, {"tool_latency_s": 1.25})]
    made = trusted_turns(*zip(*rows))
    expected = [Turn(gen_tokens=g, tool=t, tool_status=s, tool_tokens=n, extra=e) for g, t, s, n, e in rows]
    assert made == expected
    assert [attrs.asdict(t) for t in made] == [attrs.asdict(t) for t in expected]
    assert [hash(t) for t in made] == [hash(t) for t in expected]
