"""The step-end update's C code (ext/scheduling) against its Python references: the refresh (`refresh_all_py`: every
slot of every node equal, floats bit for bit, after random windows, observations and window limits, the drop paths
included), the learners (whole trees equal after updates with evictions), the eviction (`evict_from_index_py`: the
same victims and index after small updates full of ties) and the count of new prompt nodes (`_distinct_prefixes_py`).
The extension must be built here: `pip install -e .` builds it, and CI installs that way, so a missing build fails
rather than skips."""

from __future__ import annotations

import copy
import os
import struct

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import libra.scheduling.node as node_module
from libra.scheduling import PrefixTree
from libra.scheduling.node import _INCREMENTAL, Node, _rank_positions, refresh_all_py
from libra.scheduling.tree import _distinct_prefixes_py
from libra.workloads.generators import WorkloadGenerator
from libra.workloads.trace import Trajectory, Turn, trusted_values

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


class _Counting:
    """The extension with its calls counted (to show a test ran the C code, not only the fallback)."""

    def __init__(self, module) -> None:
        self.module = module
        self.calls = {"learn": 0, "learnt": 0, "learn_agnostic": 0, "refresh_all": 0, "evict": 0}

    def refresh_all(self, *args):
        self.calls["refresh_all"] += 1
        return self.module.refresh_all(*args)

    def learn(self, *args):
        self.calls["learn"] += 1
        created = self.module.learn(*args)
        self.calls["learnt"] += created is not NotImplemented
        return created

    def learn_agnostic(self, *args):
        self.calls["learn_agnostic"] += 1
        return self.module.learn_agnostic(*args)

    def distinct_prefixes(self, paths):
        self.calls["distinct_prefixes"] = self.calls.get("distinct_prefixes", 0) + 1
        return self.module.distinct_prefixes(paths)

    def evict(self, *args):
        evicted = self.module.evict(*args)
        self.calls["evict"] += evicted is not NotImplemented
        return evicted


def _tree_after(steps: list, native: _Counting | None, monkeypatch, max_nodes: int) -> PrefixTree:
    monkeypatch.setattr(node_module, "_native", native)
    tree = PrefixTree(window=20, max_nodes=max_nodes)
    for batch in steps:
        tree.update(batch)
    return tree


def _index(tree: PrefixTree) -> list:
    """Eviction's index (`_touched_at`), entry by entry in order: each node's depth, path and state."""
    assert tree._touched_at is not None
    return [
        (step, [(depth, tuple(path[:depth]), _state(node)) for node, _, depth, path in entries])
        for step, entries in tree._touched_at.items()
    ]


def _same_trees(a: PrefixTree, b: PrefixTree) -> None:
    assert (a.num_nodes, a.evicted, a.prompt_sizes) == (b.num_nodes, b.evicted, b.prompt_sizes)
    assert (a._num_entries, _index(a)) == (b._num_entries, _index(b))
    assert a.to_dict() == b.to_dict()
    assert [(p, path, _state(n)) for p, path, n in a.iter_nodes()] == [
        (p, path, _state(n)) for p, path, n in b.iter_nodes()
    ]


@pytest.mark.parametrize("max_nodes", [300, 3_000, 200_000])
def test_trees_updated_in_c_equal_the_reference(monkeypatch, max_nodes) -> None:
    """Updates of r2e-gym-like steps, with evictions (3,000 nodes is far below the steps' nodes; at 300 the agnostic
    tree's own nodes go, chosen by the index entries the learners record) and without: the same nodes with the same
    statistics and the same eviction books."""
    gen = WorkloadGenerator("r2e-gym", seed=3, num_prompts=48)
    steps = [gen.step(s) for s in range(6)]
    counting = _Counting(_native())
    fast = _tree_after(steps, counting, monkeypatch, max_nodes)
    plain = _tree_after(steps, None, monkeypatch, max_nodes)
    assert counting.calls["learnt"] > 0 and counting.calls["refresh_all"] == len(steps)
    assert (fast.evicted > 0) == (max_nodes <= 3_000)
    assert (counting.calls["learn_agnostic"] > 0) == (max_nodes <= 3_000)  # (the agnostic tree alone full)
    assert (counting.calls["evict"] > 0) == (max_nodes <= 3_000)  # (the agnostic tree's own nodes evicted)
    assert (counting.calls.get("distinct_prefixes", 0) > 0) == (max_nodes <= 3_000)  # (prompt trees only counted)
    _same_trees(fast, plain)


def _evicting_steps() -> list:
    gen = WorkloadGenerator("r2e-gym", seed=5, num_prompts=48)
    return [gen.step(s) for s in range(8)]


def _agnostic_nodes(tree: PrefixTree) -> list[Node]:
    return [node for prompt, _, node in tree.iter_nodes() if prompt is None]


def test_evicted_nodes_are_built_again_as_the_next_updates_leaves(monkeypatch) -> None:
    """The C eviction keeps the agnostic nodes nothing else holds (`spare`) and later updates build new leaves in
    them: new nodes are nodes an earlier update evicted (held in `spare` until then, so their ids name no other
    object), and the tree still equals the reference."""
    native = _native()
    native.drop_spare()
    monkeypatch.setattr(node_module, "_native", native)
    steps = _evicting_steps()
    tree = PrefixTree(window=20, max_nodes=300)
    evicted: set[int] = set()
    reused = 0
    for batch in steps:
        before = {id(n) for n in _agnostic_nodes(tree)}
        tree.update(batch)
        after = {id(n) for n in _agnostic_nodes(tree)}
        reused += len((after - before) & evicted)
        evicted = (evicted - after) | (before - after)
    assert reused > 0 and native.spare() > 0
    _same_trees(tree, _tree_after(steps, None, monkeypatch, 300))
    native.drop_spare()
    assert native.spare() == 0


def test_an_evicted_node_or_its_parts_held_elsewhere_are_not_built_again(monkeypatch) -> None:
    """A node that something else still holds when it is evicted is not kept as a spare (its values stay as they
    were), nor are the window or children dict of a spare node that something else holds (the leaf built in the
    node gets new ones): here every other agnostic node is held, and the others' windows and children dicts."""
    native = _native()
    native.drop_spare()
    monkeypatch.setattr(node_module, "_native", native)
    steps = _evicting_steps()
    tree = PrefixTree(window=20, max_nodes=300)
    tree.update(steps[0])
    held_nodes, held_parts = [], []
    for k, node in enumerate(_agnostic_nodes(tree)[1:]):  # (not the root)
        if k % 2:
            held_nodes.append(node)
        else:
            held_parts.append((node.window, node.children))
    gone: dict[int, tuple] = {}  # a held node's state when it was evicted
    left: dict[int, list] = {}  # a held window's values when its node was evicted
    for batch in steps[1:]:
        tree.update(batch)
        live = _agnostic_nodes(tree)
        live_ids = {id(n) for n in live}
        windows = {id(n.window) for n in live} | {id(n.ordered) for n in live}
        children = {id(n.children) for n in live}
        for node in held_nodes:
            if id(node) not in live_ids:
                assert _state(node) == gone.setdefault(id(node), _state(node))
        for window, owner in held_parts:
            if id(window) in left or id(window) not in windows:
                assert id(window) not in windows and id(owner) not in children and not owner
                assert window == left.setdefault(id(window), list(window))
    assert gone and left and tree.evicted > 0
    native.drop_spare()


def test_a_batch_with_a_count_c_does_not_take_goes_to_python_whole(monkeypatch) -> None:
    """A token count past 2**40 (or not an int): the C code finds it before writing anything and answers
    NotImplemented; the update then runs in Python and gives the reference tree."""
    gen = WorkloadGenerator("search-r1", seed=1, num_prompts=8)
    steps = [gen.step(s) for s in range(2)]
    last = steps[-1][-1]
    # past the trace schema's bounds, so only a value built without its checks (`trusted_values`) can hold it
    first = last.turns[0]
    fields = tuple(f.name for f in attrs.fields(Turn))
    big = trusted_values(Turn, fields, tuple([2**41 if f == "gen_tokens" else getattr(first, f)] for f in fields))[0]
    names = tuple(f.name for f in attrs.fields(Trajectory))
    turns = (big, *last.turns[1:])
    odd = trusted_values(Trajectory, names, tuple([turns if n == "turns" else getattr(last, n)] for n in names))[0]
    steps[-1] = [*steps[-1][:-1], odd]
    counting = _Counting(_native())
    fast = _tree_after(steps, counting, monkeypatch, 200_000)
    plain = _tree_after(steps, None, monkeypatch, 200_000)
    assert counting.calls == {"learn": 2, "learnt": 1, "learn_agnostic": 0, "refresh_all": 2, "evict": 0}
    _same_trees(fast, plain)


@st.composite
def small_runs(draw):
    """A few updates of trajectories over two tools and few sizes (many nodes with equal ranks, so eviction's ties
    and its walk order decide), into a tree small enough that most updates evict."""
    steps = []
    for s in range(draw(st.integers(2, 6))):
        batch = []
        for _ in range(draw(st.integers(1, 24))):
            turns = tuple(
                Turn(
                    gen_tokens=draw(st.integers(0, 40)),
                    tool=draw(st.sampled_from(("a", "b"))),
                    tool_status="ok",
                    tool_tokens=draw(st.sampled_from((10, 900, 9000))),
                )
                for _ in range(draw(st.integers(1, 7)))
            )
            batch.append(Trajectory(prompt_id=f"p{draw(st.integers(0, 5))}", prompt_tokens=1, turns=turns, step=s))
        steps.append(batch)
    return steps, draw(st.integers(2, 60))


@given(small_runs())
@settings(max_examples=200, deadline=None)
def test_eviction_in_c_gives_the_reference_victims_and_index(run) -> None:
    """The C eviction (`evict`, ext/scheduling/evict_native.c) against `evict_from_index_py`: after every update
    the same nodes, eviction books and index, entry by entry; the C code ran whenever the agnostic tree's own nodes
    went."""
    steps, max_nodes = run
    counting = _Counting(_native())
    trees = []
    for native in (counting, None):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(node_module, "_native", native)
            tree = PrefixTree(window=3, max_nodes=max_nodes, max_depth=5)
            states = []
            for batch in steps:
                tree.update(batch)
                states.append((tree.to_dict(), tree.evicted, tree._num_entries, _index(tree)))
            trees.append(states)
    assert trees[0] == trees[1]


@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=12))
def test_distinct_prefixes_in_c_count_what_the_reference_counts(paths) -> None:
    """`distinct_prefixes` (the nodes of prompt trees an update would make from nothing, counted rather than made)
    against `_distinct_prefixes_py`, on paths over few codes (long shared prefixes, repeats, empty paths)."""
    assert _native().distinct_prefixes(paths) == _distinct_prefixes_py(paths)
    with pytest.raises(IndexError):
        _native().distinct_prefixes([])
