"""The prefix tree: statistics equal brute force, bounded memory, serialise/load/merge."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import steps_of_trajectories, trajectories

from libra.scheduling import PrefixTree, StateCodec
from libra.spec import SpecError
from libra.workloads.trace import Trajectory, Turn


def brute_force(steps, *, window: int, max_depth: int = 32) -> dict:
    """(prompt id or None, path of state keys) -> the last `window` remaining-token observations."""
    codec = StateCodec()
    seen: dict = {}
    for step in steps:
        for t in step:
            states = [
                codec.decode(codec.encode(x.tool, x.tool_tokens, x.tool_status)).key()
                for x in t.turns
                if x.tool is not None
            ][:max_depth]
            for depth in range(len(states) + 1):
                remaining = t.total_tokens - t.context_after(depth)
                for owner in (t.prompt_id, None):
                    seen.setdefault((owner, tuple(states[:depth])), []).append(remaining)
    return {k: v[-window:] for k, v in seen.items()}


def tree_contents(tree: PrefixTree) -> dict:
    return {
        (pid, tuple(tree.codec.decode(c).key() for c in path)): list(node.window)
        for pid, path, node in tree.iter_nodes()
    }


def nearest_rank(values: list[int], q: float) -> float:
    return float(sorted(values)[math.ceil(q * len(values)) - 1])


@settings(max_examples=60, deadline=None)
@given(steps=steps_of_trajectories(), window=st.integers(1, 5), max_depth=st.integers(1, 5))
def test_statistics_equal_brute_force(steps, window, max_depth) -> None:
    tree = PrefixTree(window=window, max_depth=max_depth)
    for step in steps:
        tree.update(step)
    expected = brute_force(steps, window=window, max_depth=max_depth)
    contents = tree_contents(tree)
    # the agnostic root exists even before any trajectory; every other node came from a trajectory
    assert {k for k, v in contents.items() if v or k != (None, ())} == set(expected)
    assert tree.num_nodes == len(contents)
    for (pid, path), node in ((k[:2], n) for k, n in (((p, q), n) for p, q, n in tree.iter_nodes())):
        key = (pid, tuple(tree.codec.decode(c).key() for c in path))
        values = expected.get(key, [])
        assert node.count == len(values)
        if values:
            assert node.mean == pytest.approx(sum(values) / len(values))
            assert node.p50 == nearest_rank(values, 0.5)
            assert node.p90 == nearest_rank(values, 0.9)


@settings(max_examples=40, deadline=None)
@given(steps=steps_of_trajectories(), elapsed=st.integers(-1, 6000))
def test_conditional_statistics_equal_brute_force(steps, elapsed) -> None:
    tree = PrefixTree(window=6)
    for step in steps:
        tree.update(step)
    for _, _, node in tree.iter_nodes():
        alive = sorted(v for v in node.window if v > elapsed)
        got = node.beyond(elapsed)
        if not alive:
            assert got is None
            continue
        assert got[0] == len(alive)
        assert got[1] == pytest.approx(sum(alive) / len(alive))
        assert got[2:] == (nearest_rank(alive, 0.5), nearest_rank(alive, 0.9))


def _traj(pid: str, tools: list[tuple[str, int]], final_gen: int = 100) -> Trajectory:
    turns = [Turn(gen_tokens=50, tool=name, tool_status="ok", tool_tokens=size) for name, size in tools]
    return Trajectory(prompt_id=pid, prompt_tokens=200, turns=(*turns, Turn(gen_tokens=final_gen)))


def test_lookup_and_fallback_structure() -> None:
    tree = PrefixTree()
    tree.update([_traj("a", [("search", 100)], 1000), _traj("a", [("search", 6000)], 3000)])
    small, big = tree.codec.encode("search", 100, "ok"), tree.codec.encode("search", 6000, "ok")
    assert tree.stats("a").count == 2
    assert tree.stats("a", [small]).mean == 1000
    assert tree.stats("a", [big]).mean == 3000
    assert tree.stats("a").mean == pytest.approx(((50 + 100 + 1000) + (50 + 6000 + 3000)) / 2)
    assert tree.stats(None, [big]).mean == 3000  # the prompt-agnostic tree sees the same
    assert tree.stats("b") is None
    assert tree.node("a", [small, small]) is None


@settings(max_examples=40, deadline=None)
@given(steps=steps_of_trajectories(max_steps=5, max_per_step=10), cap=st.integers(1, 12))
def test_memory_is_bounded(steps, cap) -> None:
    tree = PrefixTree(max_nodes=cap)
    for step in steps:
        tree.update(step)
        actual = sum(1 for _ in tree.iter_nodes())
        assert tree.num_nodes == actual
        assert actual <= max(cap, 1)


def test_eviction_drops_the_least_useful_first() -> None:
    tree = PrefixTree(max_nodes=4)
    tree.update([_traj("old", [])])  # nodes: agnostic root, old root
    tree.update([_traj("new", []), _traj("new", []), _traj("new2", [])])
    assert tree.num_nodes == 4  # agnostic root + three prompt roots: at the cap
    tree.update([_traj("new3", [])])
    assert "old" not in tree.prompts
    assert set(tree.prompts) == {"new", "new2", "new3"}
    assert tree.evicted == 1


def test_serialise_and_load(tmp_path) -> None:
    tree = PrefixTree(window=7, size_edges=(300, 3000))
    tree.update([_traj("a", [("search", 100), ("bash", 4000)]), _traj("b", [("search", 9000)])])
    tree.update([_traj("a", [("search", 120)])])
    path = tmp_path / "tree.json"
    tree.save(path)
    loaded = PrefixTree.load(path)
    assert tree_contents(loaded) == tree_contents(tree)
    assert loaded.codec.size_edges == (300, 3000)
    assert loaded.window == 7 and loaded.steps == 2 and loaded.num_nodes == tree.num_nodes


@pytest.mark.parametrize("text", ["not json", '{"version": 99}', '{"version": 1, "window": 3}'])
def test_load_rejects_bad_files(tmp_path, text) -> None:
    path = tmp_path / "tree.json"
    path.write_text(text)
    with pytest.raises(SpecError):
        PrefixTree.load(path)


@settings(max_examples=40, deadline=None)
@given(
    first=st.lists(trajectories(), max_size=8), second=st.lists(trajectories(), max_size=8), window=st.integers(1, 6)
)
def test_merge_equals_one_tree_that_saw_both(first, second, window) -> None:
    """Two ranks' trees merged at step end hold what one tree fed rank 0 then rank 1 would hold."""
    a, b, both = PrefixTree(window=window), PrefixTree(window=window), PrefixTree(window=window)
    a.update(first)
    b.update(second)
    both.update(first + second)
    a.merge(b)
    assert tree_contents(a) == tree_contents(both)
    assert a.num_nodes == both.num_nodes


def test_merge_rejects_different_configurations() -> None:
    with pytest.raises(SpecError, match="cannot merge"):
        PrefixTree(window=5).merge(PrefixTree(window=6))
    with pytest.raises(SpecError, match="cannot merge"):
        PrefixTree(size_edges=(10,)).merge(PrefixTree())


def test_unknown_tool_leaves_the_tree_untouched() -> None:
    tree = PrefixTree(tools=("search",))
    with pytest.raises(SpecError, match="unknown tool 'bash'"):
        tree.update([_traj("a", [("search", 10)]), _traj("a", [("bash", 10)])])
    assert tree.num_nodes == 1 and not tree.prompts


@pytest.mark.parametrize("kw", [{"window": 0}, {"max_nodes": -1}, {"max_depth": 0}])
def test_bad_configuration(kw) -> None:
    with pytest.raises(SpecError):
        PrefixTree(**kw)


def test_memory_estimate_grows_with_nodes() -> None:
    tree = PrefixTree()
    empty = tree.memory_bytes()
    tree.update([_traj(f"p{i}", [("search", 100 * i)]) for i in range(50)])
    assert tree.memory_bytes() > empty


def _returns(sizes: list[int], prompt: str) -> list[Trajectory]:
    return [
        Trajectory(
            prompt_id=prompt,
            prompt_tokens=10,
            turns=(Turn(gen_tokens=5, tool="search", tool_status="ok", tool_tokens=n), Turn(gen_tokens=5)),
        )
        for n in sizes
    ]


@pytest.mark.parametrize("spec", ["breaks:4", "quantile:3"])
def test_merge_takes_the_other_ranks_return_sizes_into_the_learnt_edges(spec) -> None:
    """Per-rank trees with size classes learnt from the data (the default preset's): after the merge, the edges are
    those of one tree that observed both ranks' returns, not of the rank that merged alone."""
    small = _returns([20 + i for i in range(40)], "p")  # rank 0 saw short returns
    large = _returns([4000 + 50 * i for i in range(40)], "q")  # rank 1 long ones
    a, b, both = PrefixTree(size_edges=spec), PrefixTree(size_edges=spec), PrefixTree(size_edges=spec)
    a.update(small)
    b.update(large)
    both.update(small + large)
    assert a.codec.state() != both.codec.state()
    a.merge(b)
    assert a.codec.state() == both.codec.state()
    assert a.codec.size_class(4500, "search") == both.codec.size_class(4500, "search")
    assert set(a.prompts) == {"p", "q"}


def test_merge_with_a_loaded_tree_keeps_its_learnt_edges(tmp_path) -> None:
    """A loaded tree carries its edges but not the samples behind them: merged into a fresh tree, the edges come too."""
    b = PrefixTree(size_edges="breaks:4")
    b.update(_returns([20 * (i + 1) for i in range(60)], "q"))
    b.save(tmp_path / "b.json")
    a = PrefixTree(size_edges="breaks:4")
    a.merge(PrefixTree.load(tmp_path / "b.json"))
    assert a.codec.state() == b.codec.state() != PrefixTree(size_edges="breaks:4").codec.state()
