"""Eviction of the causal prefix tree, a mixin of `PrefixTree` (tree.py): when an update or a merge goes above
`max_nodes`, the trees of the least recently seen prompts go first, then, if the prompt-agnostic tree alone is too
big, its least useful subtrees (oldest update, fewest observations, deepest first), down to 80 % of the cap. The
prompt-agnostic root stays. The attributes read here are set by `PrefixTree.__init__`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from libra.scheduling import node as node_module
from libra.scheduling.node import Node

Entry = tuple[Node, dict, int, Sequence[int]]
"""An eviction index entry: (node, the dict holding it, its depth, the path of codes from the root: its first
`depth` items)."""


def _split_in_eviction_order(entries: list, count: int, root: Node) -> tuple[list, list]:
    """One update's index entries split into the first `count` in eviction order and the rest. Eviction order:
    fewest observations, then deepest, then first met by the walk of `_evict_agnostic` (`_in_walk_order`). The
    rest comes in rank order, not in the order of the update's walk, which does not matter: a later eviction sorts
    it again, and among equal ranks its order only decides in which order victims are popped (a dict keeps its
    insertion order whatever the order of deletions). Only the entries that tie with the `count`-th are put in
    walk order, and only where their paths branch is a dict's order read."""
    span = max(e[2] for e in entries) + 1
    rank = [e[0].total * span - e[2] for e in entries]  # (observations, -depth) as one integer
    order = sorted(range(len(entries)), key=rank.__getitem__)
    cut = rank[order[count - 1]]
    lo = bisect.bisect_left(order, cut, hi=count, key=rank.__getitem__)  # order[lo:hi]: the ranks equal to the cut
    hi = bisect.bisect_right(order, cut, lo=count, key=rank.__getitem__)
    tied = _in_walk_order([entries[i] for i in order[lo:hi]], root.children)
    first = [entries[i] for i in order[:lo]]
    first += tied[: count - lo]
    rest = tied[count - lo :]
    rest += [entries[i] for i in order[hi:]]
    return first, rest


def _in_walk_order(entries: list, children: dict, level: int = 0) -> list:
    """Entries of distinct nodes of one depth whose paths agree on their first `level` codes, in the order the
    walk of `_evict_agnostic` meets them: by their paths written as positions among siblings (children in
    insertion order), the last first. `children`: the dict the paths' next code looks up."""
    while len(entries) > 1 and level < entries[0][2]:
        groups: dict[int, list] = {}
        for entry in entries:
            groups.setdefault(entry[3][level], []).append(entry)
        if len(groups) > 1:
            out: list = []
            for code in reversed(children):
                group = groups.get(code)
                if group is not None:
                    out += _in_walk_order(group, children[code].children, level + 1)
            return out
        code = entries[0][3][level]
        children = children[code].children
        level += 1
    return entries


def evict_from_index_py(index: dict[int, list[Entry]], excess: int, root: Node) -> int:
    """`_evict_agnostic`'s eviction through the index: at least `excess` victims, the live entries of the oldest
    updates whole and the update where the cut falls split in eviction order (`_split_in_eviction_order`), popped
    from their parents; the index loses them. Returns their number. The reference of the C extension's `evict`
    (ext/scheduling/evict_native.c: the same victims and index, tests/scheduling/test_tree_native.py), which runs
    where it is built."""
    victims: list[Entry] = []
    for step in sorted(index):
        live = [e for e in index[step] if e[0].last_step == step]
        need = excess - len(victims)
        if len(live) <= need:
            victims += live
            del index[step]
            if len(live) == need:
                break
            continue
        chosen, index[step] = _split_in_eviction_order(live, need, root)
        victims += chosen
        break
    for _, owner, depth, path in victims:
        owner.pop(path[depth - 1], None)
    return len(victims)


class Eviction:
    """`PrefixTree`'s eviction (module docstring)."""

    # set by PrefixTree.__init__ (tree.py)
    max_nodes: int
    num_nodes: int
    evicted: int
    agnostic: Node
    prompts: dict[str, Node]
    prompt_sizes: dict[str, int]
    _touched_at: dict[int, list[Entry]] | None
    _num_entries: int
    _scan_only: bool

    def _evict_if_full(self) -> None:
        """Above `max_nodes`, evict down to 80% of it, so that the scan runs every few steps rather than every
        step once the tree is full."""
        if self.num_nodes > self.max_nodes:
            self._evict(self.num_nodes - math.ceil(0.8 * self.max_nodes))

    def _evict(self, excess: int) -> None:
        """Drop at least `excess` nodes, least useful first. First whole prompt trees, least recently seen prompt
        first (then fewest observations): their statistics are the stalest, and the prompt-agnostic tree keeps
        what they taught in pooled form; this looks at prompt roots only. If the agnostic tree alone is still too
        big, its least useful nodes go (oldest update, fewest observations, deepest first)."""
        order = sorted(self.prompts.items(), key=lambda kv: (kv[1].last_step, kv[1].total, kv[0]))
        for pid, _ in order:
            if excess <= 0:
                return
            del self.prompts[pid]
            size = self.prompt_sizes.pop(pid)
            self.num_nodes -= size
            self.evicted += size
            excess -= size
        if excess > 0:
            self._evict_agnostic(excess)

    def _evict_agnostic(self, excess: int) -> None:
        """A node is never updated later or more often than its parent (every update of a node updates its
        ancestors too), so in (last update, observations, -depth) order each node sorts after its descendants
        and the first `excess` nodes are whole subtrees. Ties go to the node met first by a depth-first walk that
        takes children last-inserted first. The agnostic root stays.

        Rather than walking the whole tree for this order, the index lists the nodes by last update: older
        updates are evicted whole, and only the nodes of the update where the cut falls are sorted
        (`evict_from_index_py`, or the same in C where the extension is built)."""
        if self._scan_only:
            self._evict_agnostic_by_scan(excess)
            return
        index = self._touched_at if self._touched_at is not None else self._rebuild_index()
        native = node_module.native()
        evicted = NotImplemented if native is None else native.evict(index, excess, self.agnostic.children)
        if evicted is NotImplemented:
            evicted = evict_from_index_py(index, excess, self.agnostic)
        self._num_entries = sum(map(len, index.values()))
        self._touched_at = index
        self.num_nodes -= evicted
        self.evicted += evicted

    def _evict_agnostic_by_scan(self, excess: int) -> None:
        """`_evict_agnostic` by one walk and one sort, for a tree whose nodes may have been updated later than
        their parents (so a victim's subtree may hold nodes that are not victims)."""
        entries: list[tuple[int, int, int, int, dict, int]] = []
        stack: list[tuple[dict, int, Node, int]] = [
            (self.agnostic.children, c, n, 1) for c, n in self.agnostic.children.items()
        ]
        seq = 0
        while stack:
            owner, key, node, depth = stack.pop()
            seq += 1
            entries.append((node.last_step, node.total, -depth, seq, owner, key))
            stack.extend((node.children, c, ch, depth + 1) for c, ch in node.children.items())
        entries.sort()  # `seq` is unique, so tuples never compare their dicts
        victims = entries[:excess]
        for *_, owner, key in victims:
            owner.pop(key, None)
        self.num_nodes -= len(victims)
        self.evicted += len(victims)

    def _rebuild_index(self) -> dict[int, list[Entry]]:
        """The eviction index from a walk of the agnostic tree (after a merge or a load)."""
        index: dict[int, list[Entry]] = {}
        stack: list[tuple[Node, tuple[int, ...]]] = [(self.agnostic, ())]
        while stack:
            node, path = stack.pop()
            for code, child in node.children.items():
                child_path = (*path, code)
                index.setdefault(child.last_step, []).append((child, node.children, len(child_path), child_path))
                stack.append((child, child_path))
        return index

    def _compact_index(self) -> None:
        """Drop stale entries (amortised: runs when the entries outnumber twice the nodes)."""
        index = self._touched_at
        assert index is not None
        for step in list(index):
            live = [e for e in index[step] if e[0].last_step == step]
            if live:
                index[step] = live
            else:
                del index[step]
        self._num_entries = sum(map(len, index.values()))
