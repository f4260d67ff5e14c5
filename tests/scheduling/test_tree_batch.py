"""The prefix tree's learning by groups of shared prefixes (tree_batch.py) builds the same trees as its walk
trajectory by trajectory (`PrefixTree._learn`, the reference kept for small batches): every node's window (in
order), counts, statistics, last update, sorted window, the children's insertion order, the node counts, the
evictions, the eviction index and the interned state codes, on random batches, with small windows, depth limits
and node caps (evictions, and updates that learn into a full tree), fixed and learnt size classes, merges, and a
batch with an unknown tool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tree_eviction import snapshot

from libra.scheduling import PrefixTree
from libra.scheduling.tree_batch import encode_batch
from libra.spec import SpecError
from libra.workloads.generators import WorkloadGenerator
from libra.workloads.trace import Trajectory, Turn

TOOLS = ("search", "bash", "python")


class Batched(PrefixTree):
    _batched_from = 1  # every non-empty batch learns by groups


class PerTrajectory(PrefixTree):
    _batched_from = 1 << 62  # every batch walks trajectory by trajectory


@st.composite
def turn(draw) -> Turn:
    if draw(st.integers(0, 4)) == 0:  # a turn without a tool, anywhere in the trajectory
        return Turn(gen_tokens=draw(st.integers(0, 3000)))
    return Turn(
        gen_tokens=draw(st.integers(0, 3000)),
        tool=draw(st.sampled_from(TOOLS)),
        tool_status=draw(st.sampled_from(("ok", "error", "timeout"))),
        tool_tokens=draw(st.sampled_from((0, 10, 499, 500, 800, 1000, 3999, 4000, 4999, 5000, 9000, 40_000))),
    )


@st.composite
def trajectory(draw, num_prompts: int = 5) -> Trajectory:
    return Trajectory(
        prompt_id=f"p{draw(st.integers(0, num_prompts - 1))}",
        prompt_tokens=draw(st.integers(0, 2000)),
        turns=tuple(draw(st.lists(turn(), min_size=1, max_size=7))),
    )


steps = st.lists(st.lists(trajectory(), max_size=24), min_size=1, max_size=6)
options = st.fixed_dictionaries(
    {
        "window": st.integers(1, 6),
        "max_depth": st.integers(1, 6),
        "max_nodes": st.integers(1, 80),
        "size_edges": st.sampled_from([(500, 5000), (1000, 4000), "quantile:3", "breaks:2"]),
    }
)


def _index(tree: PrefixTree) -> list:
    """The eviction index: (step, path) of every entry, stale ones included."""
    if tree._touched_at is None:
        return [None]
    return sorted((step, tuple(path[:depth])) for step, es in tree._touched_at.items() for _, _, depth, path in es)


def state(tree: PrefixTree) -> list:
    ordered = [list(node.ordered) for _, _, node in tree.iter_nodes()]
    return [snapshot(tree), ordered, _index(tree), tree.steps, tree._num_entries, list(tree.codec._states)]


@settings(max_examples=80, deadline=None)
@given(steps=steps, kw=options)
def test_grouped_learning_builds_the_same_trees(steps, kw) -> None:
    batched, reference = Batched(**kw), PerTrajectory(**kw)
    for step in steps:
        batched.update(step)
        reference.update(step)
        assert state(batched) == state(reference)


@settings(max_examples=25, deadline=None)
@given(before=steps, after=steps, other=st.lists(trajectory(), max_size=24), cap=st.integers(1, 80))
def test_grouped_learning_after_a_merge(before, after, other, cap) -> None:
    """A merge leaves nodes the index has not seen and nodes marked with later steps: still the same trees."""
    batched, reference, extra = Batched(max_nodes=cap), PerTrajectory(max_nodes=cap), PrefixTree(max_nodes=cap)
    for step in before:
        batched.update(step)
        reference.update(step)
    extra.update(other)
    extra.steps += 3  # its nodes are marked with steps the others have not counted yet
    batched.merge(extra)
    reference.merge(extra)
    for step in after:
        batched.update(step)
        reference.update(step)
        assert state(batched) == state(reference)


def test_an_unknown_tool_interns_the_same_states_and_leaves_the_tree_untouched() -> None:
    batch = [
        Trajectory(
            prompt_id="p",
            prompt_tokens=10,
            turns=(
                Turn(gen_tokens=5, tool="search", tool_status="ok", tool_tokens=700),
                Turn(gen_tokens=5, tool="sql", tool_status="ok", tool_tokens=7),
                Turn(gen_tokens=5),
            ),
        )
    ] * 3
    trees = [cls(tools=("search", "bash")) for cls in (Batched, PerTrajectory)]
    for tree in trees:
        with pytest.raises(SpecError, match="unknown tool 'sql'"):
            tree.update(batch)
    assert state(trees[0]) == state(trees[1])
    assert trees[0].num_nodes == 1 and trees[0].steps == 0


@pytest.mark.parametrize("workload", ["search-r1", "r2e-gym"])
def test_same_trees_on_generated_steps(workload) -> None:
    """Synthetic steps of both workloads (64 prompts x 16), learnt size classes, a cap that evicts from the third
    step and makes later updates learn into a full tree."""
    gen = WorkloadGenerator(workload, seed=3, num_prompts=64)
    kw = {"size_edges": "breaks:3", "max_nodes": 3000}
    batched, reference = Batched(**kw), PerTrajectory(**kw)
    for s in range(6):
        step = gen.step(s)
        batched.update(step)
        reference.update(step)
        assert state(batched) == state(reference)
    assert batched.evicted > 0


def test_a_codec_it_does_not_know_walks_per_trajectory() -> None:
    class Other(PrefixTree().codec.__class__):  # a subclass may classify otherwise
        pass

    assert encode_batch(Other(), [], 32) is None
