"""The causal prefix tree: remaining-token statistics keyed by prompt id and the ordered tool-return states so far.

A node stands for a point in a trajectory: the root of prompt `p` is "admitted, no tool return yet"; its child for
state `s1` is "after the first tool return, which was `s1`"; and so on. Each node keeps the remaining tokens (total
length minus the context at that point) of the last `window` trajectories that passed through it, and from them
the count, the mean and the P90 (nearest rank). A second, prompt-agnostic tree (all prompts pooled) answers for
prompts never seen.

Why a bounded window and not a streaming quantile sketch: lengths drift as the policy learns, so old observations
mislead; the last 200 (the published choice) track the drift, keep memory bounded per node, make merging exact and
make the statistics reproducible by brute force. docs/routing.md measures window sizes against accuracy.

Memory is bounded by `max_nodes`: when an update or a merge goes above it, the trees of the least recently seen
prompts are evicted (then, if the agnostic tree alone is too big, its least useful subtrees) down to 80% of the
cap. The prompt-agnostic root is never evicted (eviction.py).

Statistics change only in `update` (called at step end with finished trajectories), never during a step.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import cast

from libra.scheduling import node as node_module
from libra.scheduling.eviction import Entry, Eviction
from libra.scheduling.node import Node, NodeStats, leaf, refresh_all
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.states import DEFAULT_SIZE_EDGES, StateCodec, ToolReturnState
from libra.spec import SpecError, checks
from libra.workloads.trace import Trajectory

FORMAT_VERSION = 1


def _positive_int(name: str, value: object) -> int:
    return checks.whole("PrefixTree", name, value, 1)


def _distinct_prefixes(paths: list[list[int]]) -> int:
    """Nodes of a tree made from nothing by these paths, its root included: in sorted order, each path adds the
    codes beyond its common prefix with the one before it (a late update counts 512 new prompt trees this way,
    which is cheaper than building tries of dicts). In C where the extension is built (`distinct_prefixes`)."""
    native = node_module.native()
    if native is not None:
        return native.distinct_prefixes(paths)
    return _distinct_prefixes_py(paths)


def _distinct_prefixes_py(paths: list[list[int]]) -> int:
    """`_distinct_prefixes` in Python: the reference of the C code, and the fallback."""
    paths = sorted(paths)
    count = 1 + len(paths[0])
    for before, path in itertools.pairwise(paths):
        shared = 0
        for a, b in zip(before, path):
            if a != b:
                break
            shared += 1
        count += len(path) - shared
    return count


class PrefixTree(Eviction):
    """Prefix trees of remaining tokens, one per prompt plus one prompt-agnostic tree.

    `window`: observations kept per node. `max_nodes`: cap on nodes (both trees together). `max_depth`: tool
    returns beyond this depth extend no path (the deepest node answers). `codec` classifies tool returns
    (size-class edges, optional closed tool set).
    """

    def __init__(
        self,
        *,
        window: int = 200,
        max_nodes: int = 200_000,
        max_depth: int = 32,
        codec: StateCodec | None = None,
        size_edges: Sequence[int] | str = DEFAULT_SIZE_EDGES,
        tools: Iterable[str] | None = None,
    ) -> None:
        self.window = _positive_int("window", window)
        self.max_nodes = _positive_int("max_nodes", max_nodes)
        self.max_depth = _positive_int("max_depth", max_depth)
        if codec is None and isinstance(size_edges, str):
            codec = QuantileStateCodec.from_spec(size_edges, tools=tools)
        self.codec = (
            codec if codec is not None else StateCodec(size_edges=tuple(cast(Sequence[int], size_edges)), tools=tools)
        )
        self.agnostic = Node()
        self.prompts: dict[str, Node] = {}
        self.num_nodes = 1
        self.prompt_sizes: dict[str, int] = {}  # nodes in each prompt's tree, its root included
        self.steps = 0  # updates applied so far
        self.evicted = 0
        # eviction's index of the agnostic tree (see `_evict_agnostic`): last update -> the entries of the nodes it
        # touched, (node, dict holding it, depth, path of codes from the root: its first `depth` items). An entry is
        # stale once its node is touched again; None after a merge or a load, until the next eviction rebuilds it.
        self._touched_at: dict[int, list[Entry]] | None = {}
        self._num_entries = 0
        # True once nodes came from a file that marks them with steps this tree has not counted yet: an update then
        # moves a node's last update back, below its children's, and eviction falls back to the full scan
        self._scan_only = False
        # the latest step a loaded file or a merge marked a node with (a root's is the latest of its tree's when it
        # comes in; updates only mark with their own step): an update of this step or an earlier one lists the nodes
        # marked with its step up front (`_marked`)
        self._marks_until = -1

    # -- reading -------------------------------------------------------------------------------------------------
    def root(self, prompt_id: str | None) -> Node | None:
        """The root of a prompt's tree (None if unseen); `None` as prompt id means the prompt-agnostic tree."""
        return self.agnostic if prompt_id is None else self.prompts.get(prompt_id)

    def node(self, prompt_id: str | None, path: Sequence[int]) -> Node | None:
        """The exact node for a path of state codes, or None."""
        node = self.root(prompt_id)
        for code in path[: self.max_depth]:
            if node is None:
                return None
            node = node.children.get(code)
        return node

    def stats(self, prompt_id: str | None, path: Sequence[int] = ()) -> NodeStats | None:
        node = self.node(prompt_id, path)
        if node is None or not node.count:
            return None
        return NodeStats(
            count=node.count, mean=node.mean, p50=node.p50, p90=node.p90, total=node.total, last_step=node.last_step
        )

    def iter_nodes(self) -> Iterator[tuple[str | None, tuple[int, ...], Node]]:
        """Every node as (prompt id or None for the agnostic tree, path of codes, node), depth first."""
        roots: list[tuple[str | None, Node]] = [(None, self.agnostic), *self.prompts.items()]
        for prompt_id, root in roots:
            stack: list[tuple[tuple[int, ...], Node]] = [((), root)]
            while stack:
                path, node = stack.pop()
                yield prompt_id, path, node
                stack.extend((path + (c,), child) for c, child in node.children.items())

    # -- writing -------------------------------------------------------------------------------------------------
    def update(self, trajectories: Iterable[Trajectory]) -> None:
        """Record finished trajectories (one step's worth), refresh the statistics they touched, then evict."""
        # Nodes form no reference cycles; the cyclic collector would only rescan the whole tree while the update
        # allocates (measured: it made one update in three 3-4x slower), so it is paused for the update.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._update(list(trajectories))
        finally:
            if gc_was_enabled:
                gc.enable()

    def _update(self, batch: list[Trajectory]) -> None:
        step = self.steps
        limit = self.max_depth
        codec = self.codec
        observe = getattr(codec, "observe", None)
        if observe is not None:  # size classes learnt from the data (size_classes.py): edges move at step ends only
            observe(batch)
        # classify every tool return first, so that a bad one (unknown tool) leaves the tree untouched
        paths = codec.encode_trajectories(batch, limit)
        # the nodes to refresh: each is listed when the update first marks it with this step, and nodes that a loaded
        # file or a merge marked with this step already are listed up front (`_marked`)
        touched: list[Node] = self._marked(step) if step <= self._marks_until else []
        entries: list[tuple[Node, dict, int, Sequence[int]]] = []
        held = sum(self.prompt_sizes.values())
        target = math.ceil(0.8 * self.max_nodes)
        if self.num_nodes - held < target:
            created = self._learn(batch, paths, step, touched, entries)
            self.num_nodes += created
            self._finish_update(step, touched, entries)
            self._evict_if_full()
            return
        # The agnostic tree alone is at the eviction target (a long run's tree is full), so the update may well
        # evict every prompt tree: learn the agnostic tree first, and if that is so, only count the prompt trees'
        # nodes rather than make and free tens of thousands of them. Same outcome either way.
        created = self._learn_agnostic(batch, paths, step, touched, entries)
        num_agnostic = self.num_nodes - held + created
        if num_agnostic > target:
            new = self._count_new_prompt_nodes(batch, paths)
            if num_agnostic + held + new > self.max_nodes:
                self.num_nodes = num_agnostic
                self.evicted += held + new
                self.prompts.clear()
                self.prompt_sizes.clear()
                self._finish_update(step, touched, entries)
                self._evict_agnostic(num_agnostic - target)
                return
        self.num_nodes += created + self._learn_prompts(batch, paths, step, touched)
        self._finish_update(step, touched, entries)
        self._evict_if_full()

    def _marked(self, step: int) -> list[Node]:
        """The nodes already marked with `step` when an update with that step starts (a loaded file or a merge may
        mark nodes with steps this tree has not counted yet): the update's own marks cannot tell them from the ones
        it touches, so they are listed for `refresh_all` up front (it skips those the update does not observe). A
        walk of every node: an update that moves a marked node's step back leaves its children marked later than it,
        so no subtree can be skipped. Only while some node may be marked with a step not yet counted."""
        out = []
        stack = [self.agnostic, *self.prompts.values()]
        while stack:
            node = stack.pop()
            if node.last_step == step:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def _learn(
        self, batch: list[Trajectory], paths: list[list[int]], step: int, touched: list[Node], entries: list
    ) -> int:
        """Record the observations in both trees; returns the nodes created. In C where the optional extension is
        built (`_tree_native.learn`, the same trees: tests/scheduling/test_tree_native.py), else `_learn_py`; a
        batch whose token counts are not plain ints goes to `_learn_py` whole (the C code checks them all first)."""
        native = node_module.native()
        if native is not None:
            created = native.learn(batch, paths, step, touched, entries, self.agnostic, self.prompts, self.prompt_sizes)
            if created is not NotImplemented:
                return created
        return self._learn_py(batch, paths, step, touched, entries)

    def _learn_py(
        self, batch: list[Trajectory], paths: list[list[int]], step: int, touched: list[Node], entries: list
    ) -> int:
        """`_learn` in Python, the reference. This and the two `_learn_*`
        are the hot loops of an update: the walks are inline, since a call costs as much as the work it would do.
        A node an update creates is built with its first observation (`leaf(first, step)`); the others get their
        observations appended to their windows, and `refresh_all` counts them into `total` once per node."""
        agnostic = self.agnostic
        prompts = self.prompts
        sizes = self.prompt_sizes
        touch = touched.append
        record = entries.append
        created = 0
        for traj, path in zip(batch, paths):
            pid = traj.prompt_id
            turns = traj.turns
            remaining = 0
            for turn in turns:  # (a loop, not `sum` of a list comprehension: no function and list per trajectory)
                remaining += turn.gen_tokens + turn.tool_tokens
            p_node = prompts.get(pid)
            if p_node is None:
                p_node = prompts[pid] = leaf(remaining, step)
                touch(p_node)
                sizes[pid] = 1
                created += 1
            else:
                if p_node.last_step != step:
                    p_node.last_step = step
                    touch(p_node)
                p_node.window.append(remaining)
            a_node = agnostic
            if a_node.last_step != step:
                a_node.last_step = step
                touch(a_node)
            a_node.window.append(remaining)
            grown = 0
            depth = 0
            for code in path:  # (turns by index, not `enumerate(zip(...))`: two iterators fewer per trajectory)
                turn = turns[depth]  # (a path holds at most one code per turn)
                depth += 1  # noqa: SIM113 (a counter: no iterator to make and free per trajectory)
                remaining -= turn.gen_tokens + turn.tool_tokens
                owner = p_node.children
                node = owner.get(code)
                if node is None:
                    p_node = owner[code] = leaf(remaining, step)
                    touch(p_node)
                    grown += 1
                else:
                    p_node = node
                    if node.last_step != step:
                        node.last_step = step
                        touch(node)
                    node.window.append(remaining)
                owner = a_node.children
                node = owner.get(code)
                if node is None:
                    a_node = owner[code] = leaf(remaining, step)
                    touch(a_node)
                    record((a_node, owner, depth, path))
                    created += 1
                else:
                    a_node = node
                    if node.last_step != step:
                        node.last_step = step
                        touch(node)
                        record((node, owner, depth, path))
                    node.window.append(remaining)
            if grown:
                sizes[pid] += grown
                created += grown
        return created

    def _learn_agnostic(
        self, batch: list[Trajectory], paths: list[list[int]], step: int, touched: list[Node], entries: list
    ) -> int:
        """Record the observations in the agnostic tree; returns the nodes created. In C as `_learn`, else
        `_learn_agnostic_py`."""
        native = node_module.native()
        if native is not None:
            done = native.learn_agnostic(batch, paths, step, touched, entries, self.agnostic)
            if done is not NotImplemented:
                return done
        return self._learn_agnostic_py(batch, paths, step, touched, entries)

    def _learn_agnostic_py(
        self, batch: list[Trajectory], paths: list[list[int]], step: int, touched: list[Node], entries: list
    ) -> int:
        """`_learn_agnostic` in Python, the reference."""
        agnostic = self.agnostic
        touch = touched.append
        record = entries.append
        created = 0
        for traj, path in zip(batch, paths):
            turns = traj.turns
            remaining = 0
            for turn in turns:  # (as in `_learn`)
                remaining += turn.gen_tokens + turn.tool_tokens
            node = agnostic
            if node.last_step != step:
                node.last_step = step
                touch(node)
            node.window.append(remaining)
            depth = 0
            for code in path:
                turn = turns[depth]
                depth += 1  # noqa: SIM113 (as in `_learn`)
                remaining -= turn.gen_tokens + turn.tool_tokens
                owner = node.children
                child = owner.get(code)
                if child is None:
                    node = owner[code] = leaf(remaining, step)
                    touch(node)
                    record((node, owner, depth, path))
                    created += 1
                else:
                    node = child
                    if node.last_step != step:
                        node.last_step = step
                        touch(node)
                        record((node, owner, depth, path))
                    node.window.append(remaining)
        return created

    def _learn_prompts(
        self,
        batch: list[Trajectory],
        paths: list[list[int]],
        step: int,
        touched: list[Node],
    ) -> int:
        """Record the observations in the prompts' trees; returns the nodes created. (After `_learn_agnostic`, when
        the prompt trees are kept: the remaining tokens are summed again here rather than kept by it for every
        trajectory, since a full tree's update mostly drops the prompt trees.)"""
        prompts = self.prompts
        sizes = self.prompt_sizes
        touch = touched.append
        created = 0
        for traj, path in zip(batch, paths):
            pid = traj.prompt_id
            turns = traj.turns
            remaining = 0
            for turn in turns:  # (as in `_learn`)
                remaining += turn.gen_tokens + turn.tool_tokens
            node = prompts.get(pid)
            if node is None:
                node = prompts[pid] = leaf(remaining, step)
                touch(node)
                sizes[pid] = 1
                created += 1
            else:
                if node.last_step != step:
                    node.last_step = step
                    touch(node)
                node.window.append(remaining)
            grown = 0
            depth = 0
            for code in path:
                turn = turns[depth]
                depth += 1  # noqa: SIM113 (as in `_learn`)
                remaining -= turn.gen_tokens + turn.tool_tokens
                owner = node.children
                child = owner.get(code)
                if child is None:
                    node = owner[code] = leaf(remaining, step)
                    touch(node)
                    grown += 1
                else:
                    node = child
                    if node.last_step != step:
                        node.last_step = step
                        touch(node)
                    node.window.append(remaining)
            if grown:
                sizes[pid] += grown
                created += grown
        return created

    def _count_new_prompt_nodes(self, batch: list[Trajectory], paths: list[list[int]]) -> int:
        """How many nodes `_learn_prompts` would create: for a prompt without a tree, its paths' distinct prefixes
        (`_distinct_prefixes`); below the deepest existing node of a path, from scratch tries of plain dicts."""
        prompts = self.prompts
        new_trees: dict[str, list[list[int]]] = {}
        below: dict[int, dict] = {}  # under the deepest existing node of a path, by the node's id
        count = 0
        for traj, path in zip(batch, paths):
            node = prompts.get(traj.prompt_id)
            if node is None:
                new_trees.setdefault(traj.prompt_id, []).append(path)
                continue
            depth = 0
            for code in path:
                child = node.children.get(code)
                if child is None:
                    break
                node = child
                depth += 1
            if depth == len(path):
                continue
            trie = below.setdefault(id(node), {})
            for code in path[depth:]:
                nxt = trie.get(code)
                if nxt is None:
                    nxt = trie[code] = {}
                    count += 1
                trie = nxt
        return count + sum(map(_distinct_prefixes, new_trees.values()))

    def _finish_update(self, step: int, touched: list[Node], entries: list) -> None:
        refresh_all(touched, self.window)
        self.steps += 1
        if self._touched_at is not None:
            # (extends, not replaces: a loaded file may already have nodes marked with this step)
            self._touched_at.setdefault(step, []).extend(entries)
            self._num_entries += len(entries)
            if self._num_entries > 2 * self.num_nodes + 1024:
                self._compact_index()

    # -- serialise, load, merge ----------------------------------------------------------------------------------
    def _node_to_dict(self, node: Node) -> dict:
        out: dict = {"w": list(node.window), "n": node.total, "s": node.last_step}
        if node.children:
            out["c"] = {self.codec.decode(c).key(): self._node_to_dict(ch) for c, ch in node.children.items()}
        return out

    def to_dict(self) -> dict:
        """A JSON-able copy: configuration, both trees, with state codes written as `tool|size_class|status`."""
        return {
            "version": FORMAT_VERSION,
            "window": self.window,
            "max_nodes": self.max_nodes,
            "max_depth": self.max_depth,
            "steps": self.steps,
            **self.codec.config(),
            **({"size_class_state": self.codec.state()} if hasattr(self.codec, "state") else {}),
            "agnostic": self._node_to_dict(self.agnostic),
            "prompts": {pid: self._node_to_dict(n) for pid, n in self.prompts.items()},
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def from_dict(cls, data: dict) -> PrefixTree:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise SpecError(f"not a prefix tree of format version {FORMAT_VERSION}")
        try:
            tree = cls(
                window=data["window"],
                max_nodes=data["max_nodes"],
                max_depth=data["max_depth"],
                size_edges=data["size_edges"] if isinstance(data["size_edges"], str) else tuple(data["size_edges"]),
                tools=data["tools"],
            )
            if "size_class_state" in data and isinstance(tree.codec, QuantileStateCodec):
                tree.codec.load_state(data["size_class_state"])
            tree.steps = int(data["steps"])
            tree._touched_at = None
            tree._absorb(tree.agnostic, data["agnostic"])
            for pid, raw in data["prompts"].items():
                tree._absorb_prompt(pid, raw)
            tree._marks_until = tree._latest_mark()
            tree._scan_only = tree._marks_until >= tree.steps
        except (KeyError, TypeError, AttributeError) as exc:
            raise SpecError(f"malformed prefix tree: {type(exc).__name__}: {exc}") from None
        return tree

    @classmethod
    def load(cls, path: str | Path) -> PrefixTree:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError(f"cannot read prefix tree {path}: {exc}") from None
        return cls.from_dict(data)

    def _absorb_prompt(self, prompt_id: str, raw: dict) -> None:
        before = self.num_nodes
        root = self.prompts.get(prompt_id)
        if root is None:
            root = self.prompts[prompt_id] = Node()
            self.num_nodes += 1
        self._absorb(root, raw)
        self.prompt_sizes[prompt_id] = self.prompt_sizes.get(prompt_id, 0) + self.num_nodes - before

    def _absorb(self, node: Node, raw: dict) -> None:
        """Add a serialised subtree's observations to `node` as newer than its own."""
        node.window.extend(int(x) for x in raw["w"])
        node.total += int(raw["n"])
        node.last_step = max(node.last_step, int(raw["s"]))
        node.refresh(self.window)
        for key, child_raw in raw.get("c", {}).items():
            code = self.codec.encode_state(ToolReturnState.from_key(key))
            child = node.children.get(code)
            if child is None:
                child = node.children[code] = Node()
                self.num_nodes += 1
            self._absorb(child, child_raw)
            # keep "a node is never updated later or more often than its parent", which eviction relies on,
            # even for a hand-edited file
            node.last_step = max(node.last_step, child.last_step)
            node.total = max(node.total, child.total)

    def merge(self, other: PrefixTree) -> None:
        """Fold another tree in (e.g. one per rollout rank, merged at step end). Its observations count as newer
        than ours; windows keep the last `window`. Both trees must classify tool returns the same way: the same
        window, size-class edges or size-class method, and tool set. With size classes learnt from the data
        (`size_edges="breaks:4"`, the default preset's) the other tree's samples of return sizes are taken in too, so
        the edges after the merge are those of one tree that observed both; the merged nodes keep the class each
        rank gave its returns (a class is a band by rank order, as it is in one tree across a step's edge move)."""
        if not isinstance(other, PrefixTree):
            raise SpecError(f"merge needs another PrefixTree, got {type(other).__name__}")
        if other is self:  # folding a tree into itself would count every observation twice
            raise SpecError("cannot merge a prefix tree into itself")
        if other.window != self.window or other.codec.config() != self.codec.config():
            raise SpecError(
                "cannot merge prefix trees with different window or size-class edges or tool sets: "
                f"{self.window}/{self.codec.config()} vs {other.window}/{other.codec.config()}"
            )
        absorb = getattr(self.codec, "absorb", None)
        if absorb is not None:  # learnt size classes: their samples merge too (each rank's nodes keep its classes)
            absorb(other.codec)
        data = other.to_dict()
        self._touched_at = None  # the absorbed nodes are not indexed
        self._absorb(self.agnostic, data["agnostic"])
        for pid, raw in data["prompts"].items():
            self._absorb_prompt(pid, raw)
        self.steps = max(self.steps, other.steps)
        self._marks_until = max(self._marks_until, self._latest_mark())
        self._scan_only = self._scan_only or other._scan_only or self._marks_until >= self.steps
        self._evict_if_full()

    def _latest_mark(self) -> int:
        """The latest step any node is marked with (a root's is the latest of its tree's)."""
        return max([self.agnostic.last_step, *(root.last_step for root in self.prompts.values())])

    def memory_bytes(self) -> int:
        """Approximate bytes held by the nodes (objects, child dicts, windows and their ints)."""
        total = 0
        for _, _, node in self.iter_nodes():
            total += sys.getsizeof(node) + sys.getsizeof(node.children) + sys.getsizeof(node.window)
            total += sum(sys.getsizeof(x) for x in node.window if x > 256)  # small ints are shared
        return total
