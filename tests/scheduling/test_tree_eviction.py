"""Eviction picks exactly the nodes of its definition: the tree's update against the plain one it replaced.

The reference below is the definition written directly (the implementation before the eviction index and the
counted prompt trees): every update builds both trees' nodes, then evicts whole prompt trees and, if that is not
enough, every node of the agnostic tree but the root sorted by (last update, observations, -depth, order of a
depth-first walk that takes children last-inserted first); the first `excess` go. Small caps make the agnostic
tree overflow often, with many ties.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import trajectories

from libra.scheduling import PrefixTree
from libra.scheduling.tree import Node
from libra.workloads.trace import Trajectory, Turn


class ScanAndSortTree(PrefixTree):
    def _update(self, batch) -> None:
        step = self.steps
        paths = [self.codec.encode_turns(traj.turns, self.max_depth) for traj in batch]
        touched = {}  # every node observed in this update, by identity: each is refreshed once
        for traj, path in zip(batch, paths):
            total = traj.total_tokens
            if traj.prompt_id not in self.prompts:
                self.prompts[traj.prompt_id] = Node()
                self.prompt_sizes[traj.prompt_id] = 1
                self.num_nodes += 1
            nodes = [self.prompts[traj.prompt_id], self.agnostic]
            for depth in range(len(path) + 1):
                if depth:
                    for i, node in enumerate(nodes):
                        if path[depth - 1] not in node.children:
                            node.children[path[depth - 1]] = Node()
                            self.num_nodes += 1
                            if i == 0:
                                self.prompt_sizes[traj.prompt_id] += 1
                        nodes[i] = node.children[path[depth - 1]]
                for node in nodes:
                    node.last_step = step
                    touched[id(node)] = node
                    node.window.append(total - traj.context_after(depth))
                    node.total += 1
        for node in touched.values():
            node.refresh(self.window)
        self.steps += 1
        self._evict_if_full()

    def _evict_agnostic(self, excess: int) -> None:
        entries = []
        stack = [(self.agnostic.children, c, n, 1) for c, n in self.agnostic.children.items()]
        seq = 0
        while stack:
            owner, key, node, depth = stack.pop()
            seq += 1
            entries.append((node.last_step, node.total, -depth, seq, owner, key))
            stack.extend((node.children, c, ch, depth + 1) for c, ch in node.children.items())
        entries.sort(key=lambda e: e[:4])
        victims = entries[:excess]
        for *_, owner, key in victims:
            owner.pop(key, None)
        self.num_nodes -= len(victims)
        self.evicted += len(victims)


def snapshot(tree: PrefixTree) -> list:
    """Every node with its statistics, in walk order (which also pins the children's insertion order)."""
    return [
        (pid, path, list(node.window), node.total, node.last_step, node.count, node.mean, node.p50, node.p90)
        for pid, path, node in tree.iter_nodes()
    ] + [tree.num_nodes, tree.evicted, dict(tree.prompt_sizes)]


many_steps = st.lists(st.lists(trajectories(num_prompts=6), max_size=10), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(steps=many_steps, cap=st.integers(1, 40), window=st.integers(1, 4))
def test_same_nodes_evicted_as_scan_and_sort(steps, cap, window) -> None:
    tree, reference = PrefixTree(max_nodes=cap, window=window), ScanAndSortTree(max_nodes=cap, window=window)
    for step in steps:
        tree.update(step)
        reference.update(step)
        assert snapshot(tree) == snapshot(reference)


@settings(max_examples=40, deadline=None)
@given(
    before=many_steps,
    after=many_steps,
    other=st.lists(trajectories(num_prompts=6), max_size=10),
    cap=st.integers(1, 40),
)
def test_same_nodes_evicted_after_a_merge_and_a_reload(before, after, other, cap, tmp_path_factory) -> None:
    """A merge or a load brings in nodes the index has not seen; the eviction that follows still matches."""
    tree, reference = PrefixTree(max_nodes=cap), ScanAndSortTree(max_nodes=cap)
    extra = PrefixTree(max_nodes=cap)
    extra.update(other)
    for step in before:
        tree.update(step)
        reference.update(step)
    tree.merge(extra)
    reference.merge(extra)
    assert snapshot(tree) == snapshot(reference)
    path = tmp_path_factory.mktemp("tree") / "tree.json"
    tree.save(path)
    tree = PrefixTree.load(path)
    reference = ScanAndSortTree.from_dict(reference.to_dict())
    for step in after:
        tree.update(step)
        reference.update(step)
        assert snapshot(tree) == snapshot(reference)


@settings(max_examples=30, deadline=None)
@given(before=many_steps, after=many_steps, cap=st.integers(1, 40))
def test_same_nodes_evicted_after_loading_a_file_whose_step_count_is_behind(before, after, cap) -> None:
    """A hand-edited file may mark nodes with steps the tree has not counted yet; updates then reuse those steps."""
    source = PrefixTree(max_nodes=1000)
    for step in before:
        source.update(step)
    data = {**source.to_dict(), "max_nodes": cap, "steps": 0}
    tree, reference = PrefixTree.from_dict(data), ScanAndSortTree.from_dict(data)
    assert snapshot(tree) == snapshot(reference)
    for step in after:
        tree.update(step)
        reference.update(step)
        assert snapshot(tree) == snapshot(reference)


def _traj(prompt: str, returns: list[tuple[str, int]]) -> Trajectory:
    turns = [Turn(gen_tokens=7 * (i + 1), tool=t, tool_status="ok", tool_tokens=n) for i, (t, n) in enumerate(returns)]
    return Trajectory(prompt_id=prompt, prompt_tokens=5, turns=(*turns, Turn(gen_tokens=3)))


def test_prompt_trees_learnt_after_a_full_agnostic_tree_are_the_definitions(monkeypatch) -> None:
    """The update's second route: the agnostic tree alone at the eviction target, learnt first, and the prompt
    trees learnt after it because they still fit (`_learn_prompts`): a new prompt's tree, then observations along
    its existing nodes. The same nodes as the definition, update by update."""
    shared = [("search", 10), ("bash", 900), ("search", 9000)]
    sizes = (10, 900, 9000)
    first = [_traj("a", shared) for _ in range(5)] + [
        _traj("a", [("search", x), ("bash", y), ("bash", z)]) for x in sizes for y in sizes for z in sizes[:2]
    ]
    steps = [first, [_traj("b", shared)], [_traj("b", shared), _traj("b", shared[:2])]]
    learnt_after = []
    original = PrefixTree._learn_prompts

    def counted(self, *args):
        learnt_after.append(self.steps)
        return original(self, *args)

    monkeypatch.setattr(PrefixTree, "_learn_prompts", counted)
    tree, reference = PrefixTree(max_nodes=40, window=3), ScanAndSortTree(max_nodes=40, window=3)
    for step in steps:
        tree.update(step)
        reference.update(step)
        assert snapshot(tree) == snapshot(reference)
    assert learnt_after == [1, 2]
    assert tree.prompt_sizes == {"b": 4}
