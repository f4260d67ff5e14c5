"""The step-end refresh in C (ext/scheduling/tree_native.c) against its Python reference (`refresh_all_py`): every
slot of every node equal, floats bit for bit, after random windows, observations and window limits (the drop paths
included), and whole trees equal after updates with evictions. The extension must be built here: `pip install -e .`
builds it, and CI installs that way, so a missing build fails rather than skips."""

from __future__ import annotations

import copy
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import libra.scheduling.node as node_module
from libra.scheduling import PrefixTree
from libra.scheduling.node import _INCREMENTAL, Node, _rank_positions, refresh_all_py
from libra.workloads.generators import WorkloadGenerator

SLOTS = ("window", "ordered", "count", "total", "mean", "p50", "p90", "prefix", "last_step")


def _native():
    try:
        from libra.scheduling import _tree_native
    except ImportError as exc:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"libra.scheduling._tree_native is not built ({exc}): run `pip install -e .` with a C compiler")
    _tree_native.bind(Node)
    return _tree_native


def _bits(x: object) -> object:
    """A float by its bits (so 0.0 and -0.0, or two roundings, differ); anything else as it is."""
    return struct.pack("<d", x) if isinstance(x, float) else x


def _state(node: Node) -> tuple:
    values = tuple(_bits(getattr(node, s)) for s in SLOTS)
    types = tuple(type(getattr(node, s)).__name__ for s in SLOTS)
    return values, types, node.ordered is node.window


def _c_refresh(nodes: list[Node], limit: int) -> None:
    at50, at90 = _rank_positions(limit)
    _native().refresh_all(nodes, limit, at50, at90, _INCREMENTAL)


def test_the_extension_is_built_and_used() -> None:
    native = _native()
    if os.environ.get("LIBRA_PURE_PYTHON", "") in ("", "0"):
        assert node_module._native is native


small = st.integers(0, 60_000)
huge = st.integers(0, 2**62)  # past 2**53: the mean's sum is no longer an exact double (the slow path)


@st.composite
def nodes_and_observations(draw):
    """Nodes as an update finds them (a refreshed window, or a leaf built with its first observation, or an empty
    node), then the observations the update appended to each."""
    limit = draw(st.integers(1, 40))
    values = draw(st.sampled_from([small, huge]))
    nodes = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["refreshed", "leaf", "empty"]))
        if kind == "leaf":
            node = Node(draw(values), step=draw(st.integers(0, 9)))
        else:
            node = Node()
            if kind == "refreshed":
                node.window.extend(draw(st.lists(values, max_size=limit + 5)))
                node.total = len(node.window) + draw(st.integers(0, 300))
                node.refresh(limit)
        node.window.extend(draw(st.lists(values, max_size=2 * limit + _INCREMENTAL)))
        nodes.append(node)
    return nodes, limit


@settings(max_examples=400, deadline=None)
@given(case=nodes_and_observations())
def test_the_c_refresh_gives_every_slot_the_python_reference_gives(case) -> None:
    nodes, limit = case
    reference = copy.deepcopy(nodes)
    refresh_all_py(reference, limit)
    _c_refresh(nodes, limit)
    assert [_state(n) for n in nodes] == [_state(n) for n in reference]


def test_the_mean_past_two_to_the_53_is_the_correctly_rounded_one() -> None:
    """Where the window's sum is not an exact double the mean is Python's `int / int` (correctly rounded), which a
    double division of the rounded sum would miss: here by one unit in the last place."""
    big = 2**53 + 1
    node = Node()
    node.window.extend([big, big, big])
    _c_refresh([node], 10)
    assert node.mean == (3 * big) / 3 == 2.0**53
    assert float(3 * big) / 3 != node.mean  # (what a double division would give)


def test_a_node_of_another_class_is_refused() -> None:
    class Other:
        pass

    with pytest.raises(TypeError, match="Node objects"):
        _c_refresh([Other()], 5)  # type: ignore[list-item]


def _tree_after(steps: list, *, native: bool, monkeypatch) -> PrefixTree:
    monkeypatch.setattr(node_module, "_native", _native() if native else None)
    tree = PrefixTree(window=20, max_nodes=3_000)
    for batch in steps:
        tree.update(batch)
    return tree


def test_trees_updated_with_the_c_refresh_equal_the_reference(monkeypatch) -> None:
    """Updates of r2e-gym-like steps, with evictions (the cap is far below the steps' nodes): the same nodes with
    the same statistics, every step."""
    gen = WorkloadGenerator("r2e-gym", seed=3, num_prompts=48)
    steps = [gen.step(s) for s in range(6)]
    fast = _tree_after(steps, native=True, monkeypatch=monkeypatch)
    plain = _tree_after(steps, native=False, monkeypatch=monkeypatch)
    assert fast.evicted > 0
    assert fast.to_dict() == plain.to_dict()
    assert [(p, path, _state(n)) for p, path, n in fast.iter_nodes()] == [
        (p, path, _state(n)) for p, path, n in plain.iter_nodes()
    ]
