"""Tool-return states and their codes."""

from __future__ import annotations

import pytest

from libra.scheduling import StateCodec, ToolReturnState
from libra.spec import SpecError


def test_size_classes_follow_the_edges() -> None:
    codec = StateCodec()
    assert [codec.size_class(n) for n in (0, 499, 500, 4999, 5000, 10**6)] == [0, 0, 1, 1, 2, 2]
    custom = StateCodec(size_edges=(100, 1000, 4000))
    assert [custom.size_class(n) for n in (99, 100, 999, 3999, 4000)] == [0, 1, 1, 2, 3]


def test_codes_are_stable_and_decode() -> None:
    codec = StateCodec()
    a = codec.encode("search", 1800, "ok")
    assert codec.encode("search", 4000, "ok") == a  # same size class
    b = codec.encode("search", 1800, "error")
    assert a != b
    assert codec.decode(a) == ToolReturnState("search", 1, "ok")
    assert ToolReturnState.from_key(codec.decode(b).key()) == ToolReturnState("search", 1, "error")


@pytest.mark.parametrize("edges", [(), (500, 500), (5000, 500), (0, 10), (-1,)])
def test_bad_edges(edges) -> None:
    if edges == ():
        StateCodec(size_edges=edges)  # no edges: one size class, allowed
        return
    with pytest.raises(SpecError, match="edges"):
        StateCodec(size_edges=edges)


def test_unknown_tool_with_a_closed_tool_set() -> None:
    codec = StateCodec(tools=("bash", "python"))
    codec.encode("bash", 10, "ok")
    with pytest.raises(SpecError, match="unknown tool 'serach'.*bash, python"):
        codec.encode("serach", 10, "ok")


@pytest.mark.parametrize(
    "args", [("search", 10, "failed"), ("", 10, "ok"), ("search", -5, "ok"), ("search", 1.5, "ok")]
)
def test_bad_tool_returns(args) -> None:
    with pytest.raises(SpecError):
        StateCodec().encode(*args)


def test_bad_state_key() -> None:
    with pytest.raises(SpecError):
        ToolReturnState.from_key("search-ok")
    with pytest.raises(SpecError):
        ToolReturnState.from_key("search|big|ok")
