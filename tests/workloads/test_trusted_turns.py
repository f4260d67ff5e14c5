"""`trusted_values`, the generators' fast path to `Turn` and `Trajectory` values, makes exactly what the constructors
make, in C (ext/workloads) and in Python. The extension is optional for users, not here: the C tests fail (they do
not skip) when it is not built."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from libra.workloads import trace
from libra.workloads.trace import _TURN_FIELDS, TRAJECTORY_FIELDS, Trajectory, Turn, trusted_turns, trusted_values

ROWS = [(12, "bash", "error", 700, {"tool_latency_s": 1.25}), (5, None, None, 0, {})]  # (only the last may lack a tool)


@pytest.fixture(params=["c", "python"])
def maker(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(trace, "_SLOTS_NATIVE", None)
    else:
        assert trace._load_slots_native() is not None, "libra.workloads._slots_native is not built: pip install -e ."
    return request.param


def test_the_fields_are_every_field_of_the_classes() -> None:
    assert set(_TURN_FIELDS) == {a.name for a in attrs.fields(Turn)}
    assert set(TRAJECTORY_FIELDS) == {a.name for a in attrs.fields(Trajectory)}


def test_same_turns_as_the_constructor(maker) -> None:
    made = trusted_turns(*zip(*ROWS))
    expected = [Turn(gen_tokens=g, tool=t, tool_status=s, tool_tokens=n, extra=e) for g, t, s, n, e in ROWS]
    assert made == expected
    assert [attrs.asdict(t) for t in made] == [attrs.asdict(t) for t in expected]
    assert [hash(t) for t in made] == [hash(t) for t in expected]
    assert all(type(t) is Turn and t.extra is e for t, (*_, e) in zip(made, ROWS))  # the values given, not copies


def test_same_trajectories_as_the_constructor(maker) -> None:
    turns = trusted_turns(*zip(*ROWS))
    rows: list[tuple[Any, ...]] = [
        ("p0", 100, tuple(turns), 3, 7, 0.5, {}),
        ("p1", 9, tuple(turns[1:]), None, None, None, {"k": 1}),
    ]
    made = trusted_values(Trajectory, TRAJECTORY_FIELDS, tuple(zip(*rows)))
    expected = [Trajectory(**dict(zip(TRAJECTORY_FIELDS, row))) for row in rows]
    assert made == expected and [hash(t) for t in made] == [hash(t) for t in expected]
    assert [t.extra for t in made] == [{}, {"k": 1}] and made[0].total_tokens == expected[0].total_tokens
    with pytest.raises(attrs.exceptions.FrozenInstanceError):  # still frozen
        made[0].step = 8
    assert trusted_values(Turn, _TURN_FIELDS, ((), (), (), (), ())) == []


def test_the_c_maker_refuses_what_it_cannot_make() -> None:
    native = trace._load_slots_native()
    assert native is not None
    with pytest.raises(TypeError, match="is not a slot"):
        native.make(Turn, ("gen_tokens", "nope"), ([1], [2]))
    with pytest.raises(TypeError, match="is not a slot"):
        native.make(Turn, ("total_tokens",), ([1],))  # (a property)
    with pytest.raises(ValueError, match="differ in length"):
        native.make(Turn, ("gen_tokens", "tool"), ([1, 2], [None]))
    with pytest.raises(ValueError, match="one column per field"):
        native.make(Turn, ("gen_tokens",), ())
    with pytest.raises(TypeError, match="keep object's allocation"):
        native.make(int, (), ())

    class Plain:  # a dict, no slots
        x = 0

    with pytest.raises(TypeError, match="is not a slot"):
        native.make(Plain, ("x",), ([1],))
