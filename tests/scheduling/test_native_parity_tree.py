"""The step-end refresh and the prefix count in C (ext/scheduling/tree_native.c, evict_native.c) against their
Python references (`refresh_all_py`, `_distinct_prefixes_py`) at the edges of what a window may hold: NaN, infinities,
floats, negative and huge integers, ties. Where the reference raises, the C code raises the same error: a window
value that leaves it and is not found in the sorted copy (NaN unsorts it) made the C code drop nothing, silently, where
`del ordered[i]` raises."""

from __future__ import annotations

import copy
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling.node import _INCREMENTAL, Node, _rank_positions, refresh_all_py
from libra.scheduling.tree import _distinct_prefixes_py

SLOTS = ("window", "ordered", "count", "total", "mean", "p50", "p90", "prefix", "last_step")


def _native():
    from libra.scheduling import _tree_native

    _tree_native.bind(Node)
    return _tree_native


def _state(node: Node) -> tuple:
    def bits(x: object) -> object:
        return struct.pack("<d", x) if isinstance(x, float) else x

    return tuple((bits(getattr(node, s)), type(getattr(node, s)).__name__) for s in SLOTS)


def _outcome(refresh, nodes: list[Node], limit: int) -> object:
    try:
        refresh(nodes, limit)
    except Exception as exc:  # the verdict to compare: the type of the error
        return type(exc).__name__
    return [_state(n) for n in nodes]


def _c_refresh(nodes: list[Node], limit: int) -> None:
    at50, at90 = _rank_positions(limit)
    _native().refresh_all(nodes, limit, at50, at90, _INCREMENTAL)


edge_values = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, 1, 2**53, 2**53 + 1, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -0.0, 0.5]),
)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 12),
    windows=st.lists(
        st.tuples(st.lists(edge_values, max_size=14), st.lists(edge_values, max_size=40)), min_size=1, max_size=3
    ),
)
def test_the_c_refresh_matches_the_reference_on_any_window(limit, windows) -> None:
    nodes = []
    for before, after in windows:
        node = Node()
        node.window.extend(before)
        try:
            node.refresh(limit)
        except (ValueError, IndexError, OverflowError):
            continue
        node.window.extend(after)
        nodes.append(node)
    reference = copy.deepcopy(nodes)
    assert _outcome(_c_refresh, nodes, limit) == _outcome(refresh_all_py, reference, limit)


def test_a_nan_leaving_the_window_raises_as_the_reference_does() -> None:
    """With a NaN the sorted copy is not sorted (`sorted([2, nan, 1, 1])` leaves it as it is), so the 2 that
    leaves the window is not found by bisection: `del ordered[len(ordered)]` raises IndexError in the reference."""
    for refresh in (refresh_all_py, _c_refresh):
        node = Node()
        node.window.extend([2, float("nan"), 1, 1])  # type: ignore[list-item]
        node.refresh(4)
        assert node.ordered == node.window
        node.window.append(3)
        with pytest.raises(IndexError):
            refresh([node], 4)


def test_wrong_arguments_are_refused_with_one_line() -> None:
    native = _native()
    at50, at90 = _rank_positions(4)
    with pytest.raises(TypeError):
        native.refresh_all((Node(),), 4, at50, at90, _INCREMENTAL)  # a tuple, not a list
    with pytest.raises(ValueError, match="rank tables shorter than the window"):
        native.refresh_all([Node()], 9, at50, at90, _INCREMENTAL)
    with pytest.raises(TypeError, match="refresh_all takes Node objects, got int"):
        native.refresh_all([1], 4, at50, at90, _INCREMENTAL)


codes = st.one_of(st.integers(-3, 3), st.sampled_from([2**64, -(2**64), 2**63 - 1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(codes, max_size=5), max_size=10))
def test_distinct_prefixes_count_what_the_reference_counts(paths) -> None:
    def outcome(count) -> object:
        try:
            return count(copy.deepcopy(paths))
        except Exception as exc:  # (no paths: IndexError in both)
            return type(exc).__name__

    assert outcome(_native().distinct_prefixes) == outcome(_distinct_prefixes_py)
