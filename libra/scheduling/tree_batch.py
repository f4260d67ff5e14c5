"""A prefix tree's step-end learning by groups: the trajectories of one update that share a prefix visit its node
once, with all their observations at once, instead of once per trajectory.

One step of 512 prompts x 16 samples walks about 31 K (trajectory, depth) pairs in each tree, but those pairs hold
about 0.9-7 K distinct prefixes in the prompt-agnostic tree and 8.5-14 K in the prompts' trees (search-r1,
r2e-gym). The pairs are grouped with numpy, one depth at a time: a stable sort by (group at the previous depth,
state code) makes each group's members contiguous and in batch order, so a node's window gets its observations in
the order the per-trajectory walk appends them; visiting the groups in the order of their first member creates a
node's new children in the order that walk does. Only the per-group work (find or make the node, extend its window)
is Python. `PrefixTree` checks this path against its per-trajectory one (tests/scheduling/test_tree_batch.py).

The tool returns are classified the same way, in bulk: each turn's fields are read once (`map` with attribute
getters), the size classes are bisections per tool (`np.searchsorted`), and the distinct states are interned in the
order of their first return, as `encode_turns` trajectory by trajectory interns them.
"""

from __future__ import annotations

import operator
from collections import Counter, deque
from collections.abc import Sequence
from itertools import chain, compress, repeat

import numpy as np

from libra.scheduling.node import Node
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.states import StateCodec
from libra.workloads.trace import Trajectory

_TURNS = operator.attrgetter("turns")
_PROMPT = operator.attrgetter("prompt_id")
_GEN = operator.attrgetter("gen_tokens")
_TOOL = operator.attrgetter("tool")
_STATUS = operator.attrgetter("tool_status")
_CHILDREN = operator.attrgetter("children")
_TOOL_TOKENS = operator.attrgetter("tool_tokens")


class Level:
    """One depth's groups, in the order of their first member (a group's index in this order is its rank): the
    parent's rank (at the depth above), the state code, the group's slice `[start, end)` of `values`, its first
    member (a trajectory index) and that member's value. `values`: the remaining tokens of every member at this
    depth, group by group, each group's in batch order."""

    __slots__ = ("parents", "codes", "starts", "ends", "firsts", "heads", "values", "multi")

    def __init__(self, parents, codes, starts, ends, firsts, heads, values, multi) -> None:
        self.parents, self.codes, self.starts, self.ends = parents, codes, starts, ends
        self.firsts, self.heads, self.values, self.multi = firsts, heads, values, multi


class Batch:
    """One update's trajectories as arrays: state codes of each path (concatenated), path lengths, remaining tokens
    by depth, and the groups of both trees made on first need."""

    def __init__(
        self,
        batch: list[Trajectory],
        codes: np.ndarray,
        lengths: np.ndarray,
        cum: np.ndarray,
        first_turn: np.ndarray,
        last_turn: np.ndarray,
    ) -> None:
        self.prompt_ids: list[str] = list(map(_PROMPT, batch))
        self.codes = codes  # every path's codes, concatenated
        self.lengths = lengths  # codes per path
        self.offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths
        # remaining tokens of trajectory i at depth d: cum[ends[i]] - cum[first_turn[i] + d], with `cum` the running
        # sum of all turns' tokens (one leading 0) and `first_turn[i]` where its turns start in it
        self.cum = cum
        self.first_turn = first_turn
        self.end = cum[last_turn]
        self._paths: list[int] | None = None
        self._offsets: list[int] | None = None
        self._agnostic: list[Level] | None = None
        self._prompts: list[Level] | None = None

    def paths(self) -> list[int]:
        """`codes` as a list (a path is a slice of it from its offset)."""
        if self._paths is None:
            self._paths = self.codes.tolist()
        return self._paths

    def offsets_list(self) -> list[int]:
        if self._offsets is None:
            self._offsets = self.offsets.tolist()
        return self._offsets

    def agnostic_levels(self) -> list[Level]:
        if self._agnostic is None:
            self._agnostic = self._levels(np.zeros(len(self.prompt_ids), dtype=np.int64))
        return self._agnostic

    def prompt_levels(self) -> list[Level]:
        if self._prompts is None:
            ids = {pid: i for i, pid in enumerate(dict.fromkeys(self.prompt_ids))}
            keys = np.fromiter(map(ids.__getitem__, self.prompt_ids), np.int64, len(self.prompt_ids))
            self._prompts = self._levels(keys)
        return self._prompts

    def _levels(self, roots: np.ndarray) -> list[Level]:
        """The groups of every depth: at depth 0 by `roots` (one key per trajectory), below by (group above,
        code)."""
        cum = self.cum
        n = len(roots)
        members = np.arange(n)  # the trajectories still on a path at this depth, in batch order
        at = self.first_turn.copy()  # where each member's remaining tokens at this depth are read from `cum`
        end = self.end
        lengths = self.lengths
        code_at = self.offsets.copy()
        keys = roots
        parents = np.zeros(n, dtype=np.int64)
        codes = parents
        width = int(self.codes.max()) + 1 if len(self.codes) else 1
        levels = []
        depth = 0
        while n:
            order = np.argsort(keys, kind="stable")
            sorted_keys = keys[order]
            flag = np.empty(n, dtype=bool)
            flag[0] = True
            np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=flag[1:])
            starts = np.flatnonzero(flag)
            first_pos = order[starts]  # each group's first member, as a position among `members`
            visit = np.argsort(first_pos)  # (distinct positions: any sort)
            rank = np.empty(len(starts), dtype=np.int64)
            rank[visit] = np.arange(len(starts))
            rank_of = np.empty(n, dtype=np.int64)
            rank_of[order] = rank[np.cumsum(flag) - 1]
            sizes = np.diff(np.append(starts, n))
            starts = starts[visit]
            sizes = sizes[visit]
            remaining = end[order] - cum[at[order]]
            first_pos = first_pos[visit]
            levels.append(
                Level(
                    parents[first_pos].tolist(),
                    codes[first_pos].tolist(),
                    starts.tolist(),
                    (starts + sizes).tolist(),
                    members[first_pos].tolist(),
                    remaining[starts].tolist(),
                    remaining.tolist(),
                    (sizes > 1).tolist(),
                )
            )
            depth += 1
            still = lengths[members] >= depth
            members = members[still]
            n = len(members)
            parents = rank_of[still]
            at = at[still] + 1
            end = end[still]
            codes = self.codes[code_at[still]]
            code_at = code_at[still] + 1
            keys = parents * width + codes
        return levels


def _edges_of(codec: StateCodec, tool: str) -> Sequence[float]:
    if isinstance(codec, QuantileStateCodec):
        return codec.edges_for(tool)
    return codec.size_edges


def encode_batch(codec: StateCodec, batch: list[Trajectory], limit: int) -> Batch | None:
    """The batch's paths (the codes of `codec.encode_turns(traj.turns, limit)` of each trajectory, interned in the
    same order) and remaining tokens; None for a codec this module does not know (the caller walks per trajectory).
    Raises what `encode_turns` raises (an unknown tool), with the states before it interned as it would have."""
    if type(codec) not in (StateCodec, QuantileStateCodec):
        return None
    turn_lists = list(map(_TURNS, batch))
    counts = np.fromiter(map(len, turn_lists), np.int64, len(turn_lists))
    flat = list(chain.from_iterable(turn_lists))
    n = len(flat)
    gen = np.fromiter(map(_GEN, flat), np.int64, n)
    sizes = np.fromiter(map(_TOOL_TOKENS, flat), np.int64, n)
    tools = list(map(_TOOL, flat))
    tool_ids = {tool: i for i, tool in enumerate(dict.fromkeys(tools))}  # (str keys: hashes are cached)
    tool_of = np.fromiter(map(tool_ids.__getitem__, tools), np.int64, n)
    statuses = list(map(_STATUS, flat))
    status_ids = {status: i for i, status in enumerate(dict.fromkeys(statuses))}
    status_of = np.fromiter(map(status_ids.__getitem__, statuses), np.int64, n)
    first_turn = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=first_turn[1:])
    owner = np.repeat(np.arange(len(counts)), counts)  # the trajectory of each turn
    returns = np.arange(n) - first_turn[owner] < limit
    size_class = np.zeros(n, dtype=np.int64)
    for tool, i in tool_ids.items():
        is_tool = tool_of == i
        if tool is None:
            returns[is_tool] = False
            continue
        edges = np.asarray(_edges_of(codec, tool))
        if len(edges):
            mask = returns & is_tool
            size_class[mask] = np.searchsorted(edges, sizes[mask], side="right")
    picked = np.flatnonzero(returns)
    classes = int(size_class.max()) + 1 if n else 1
    keys = (tool_of[picked] * classes + size_class[picked]) * len(status_ids) + status_of[picked]
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    tool_names, status_names = list(tool_ids), list(status_ids)
    known = codec._codes
    lookup = np.empty(len(distinct), dtype=np.int64)
    for k in np.argsort(first).tolist():  # intern in the order of first sight
        at = int(picked[first[k]])
        key = (tool_names[int(tool_of[at])], int(size_class[at]), status_names[int(status_of[at])])
        code = known.get(key)
        lookup[k] = codec._intern(key) if code is None else code
    codes = lookup[inverse.reshape(-1)]
    lengths = np.bincount(owner[picked], minlength=len(counts))
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(gen + sizes, out=cum[1:])
    return Batch(batch, codes, lengths, cum, first_turn, first_turn + counts)


def _grow(level: Level, above: list, step: int, touch) -> tuple[list, list, list[bool], list]:
    """One depth's nodes below `above` (the depth above's, by rank): finds or makes each group's node and records
    its observations. Returns the nodes by rank, the dicts holding them, which groups made their node, and the
    nodes that were there and that this update touches first (for the eviction index)."""
    codes, values = level.codes, level.values
    owners = list(map(_CHILDREN, map(above.__getitem__, level.parents)))
    nodes = list(map(dict.get, owners, codes))
    fresh = list(map(operator.is_, nodes, repeat(None)))
    made = list(compress(range(len(nodes)), fresh))
    if made:
        new = list(map(Node, compress(level.heads, fresh), repeat(step)))
        deque(map(dict.__setitem__, compress(owners, fresh), compress(codes, fresh), new), maxlen=0)
        deque(map(nodes.__setitem__, made, new), maxlen=0)
        for i in compress(made, compress(level.multi, fresh)):  # a new node with more than one observation
            node = nodes[i]
            s, e = level.starts[i], level.ends[i]
            node.window = values[s:e]
            node.total = e - s
            touch(node)
        if len(made) == len(nodes):
            return nodes, owners, fresh, []
    first_touched = []
    starts, ends = level.starts, level.ends
    for i in compress(range(len(nodes)), map(operator.not_, fresh)):
        node = nodes[i]
        if node.last_step != step:
            node.last_step = step
            touch(node)
            first_touched.append(i)
        node.window += values[starts[i] : ends[i]]
        node.total += ends[i] - starts[i]
    return nodes, owners, fresh, first_touched


def learn_agnostic(root: Node, data: Batch, step: int, touched: list[Node], entries: list) -> int:
    """Record the batch's observations in the prompt-agnostic tree; returns the nodes created. `touched` gets
    the nodes whose statistics need a refresh, `entries` the eviction index's entries of the nodes first touched
    in this update (the root excepted)."""
    touch = touched.append
    levels = data.agnostic_levels()
    top = levels[0]
    if root.last_step != step:
        root.last_step = step
        touch(root)
    root.window += top.values
    root.total += len(top.values)
    created = 0
    above: list = [root]
    paths = data.paths()
    offsets = data.offsets_list()
    for depth, level in enumerate(levels[1:], 1):
        nodes, owners, fresh, first_touched = _grow(level, above, step, touch)
        chosen = list(compress(range(len(nodes)), fresh))
        created += len(chosen)
        chosen += first_touched
        starts = list(map(offsets.__getitem__, map(level.firsts.__getitem__, chosen)))
        entries += zip(
            map(nodes.__getitem__, chosen),
            map(owners.__getitem__, chosen),
            repeat(depth),
            map(paths.__getitem__, map(slice, starts, map(operator.add, starts, repeat(depth)))),
        )
        above = nodes
    return created


def learn_prompts(prompts: dict[str, Node], sizes: dict[str, int], data: Batch, step: int, touched: list) -> int:
    """Record the batch's observations in the prompts' trees (`sizes`: nodes per prompt tree, kept); returns the
    nodes created."""
    touch = touched.append
    pids = data.prompt_ids
    levels = data.prompt_levels()
    top = levels[0]
    values = top.values
    names = list(map(pids.__getitem__, top.firsts))
    above = list(map(prompts.get, names))
    fresh = list(map(operator.is_, above, repeat(None)))
    made = list(compress(range(len(above)), fresh))
    if made:
        new = list(map(Node, compress(top.heads, fresh), repeat(step)))
        new_names = list(compress(names, fresh))
        prompts.update(zip(new_names, new))
        sizes.update(zip(new_names, repeat(1)))
        deque(map(above.__setitem__, made, new), maxlen=0)
        for i in compress(made, compress(top.multi, fresh)):
            node = above[i]
            s, e = top.starts[i], top.ends[i]
            node.window = values[s:e]
            node.total = e - s
            touch(node)
    for i in compress(range(len(above)), map(operator.not_, fresh)):
        node = above[i]
        if node.last_step != step:
            node.last_step = step
            touch(node)
        s, e = top.starts[i], top.ends[i]
        node.window += values[s:e]
        node.total += e - s
    created = len(made)
    grown: list[int] = []  # first member of each group whose node is new, below the roots
    for level in levels[1:]:
        above, _, fresh, _ = _grow(level, above, step, touch)
        grown += compress(level.firsts, fresh)
    for pid, count in Counter(map(pids.__getitem__, grown)).items():
        sizes[pid] += count
    return created + len(grown)


def count_new_prompt_nodes(prompts: dict[str, Node], data: Batch) -> int:
    """How many nodes `learn_prompts` would create."""
    pids = data.prompt_ids
    levels = data.prompt_levels()
    above = list(map(prompts.get, map(pids.__getitem__, levels[0].firsts)))
    count = above.count(None)
    empty: dict[int, Node] = {}
    for level in levels[1:]:
        # a group below a node that is not there yet looks in an empty dict
        owners = [empty if node is None else node.children for node in map(above.__getitem__, level.parents)]
        above = list(map(dict.get, owners, level.codes))
        count += above.count(None)
    return count
