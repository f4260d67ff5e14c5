"""Node classes and node patterns: what lets the CP-SAT model scale with the number of distinct nodes, not nodes.

An **entity** is what a node can keep on its own: a keepable rollout instance (1 unit of its kind, saves 1 move), or
an EP block whose keepable replicas have every stage on one node `n` (it pins `pp` training units on `n` and saves
one move per keepable replica: keeping one of them costs the same GPUs as keeping all, so all or none are kept).
A block whose keepable replicas have stages on several nodes is **coupled**: the nodes it touches are **single
nodes**, modelled one by one. Every other node belongs to a **class**: nodes holding the same multiset of entity types
`(kind, units, saves)`. Nodes of one class are interchangeable (swapping two of them, entities included, changes no
constraint and no objective term), so the model only decides how many nodes of each class take each **pattern**:
which entities a node keeps and how many new units of each kind it adds, within `G` GPUs. Patterns that add a new
unit of a kind while leaving an entity of that kind unkept (and of no more units) are dropped: keeping the entity
instead uses the same GPUs and saves a move, so an optimum never needs them. A class with more than
`MAX_PATTERNS` patterns (wide nodes: 72 GPUs with TP-1..8 instances have ~10^5) is not enumerated: its nodes
become single nodes too.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import attrs

from libra.planning.placement.problem import TRAIN_KIND, PlacementProblem

EntityType = tuple[str, int, int]  # (kind, units, saves)
MAX_PATTERNS = 2000


@attrs.frozen(kw_only=True)
class Entity:
    kind: str
    units: int
    node: int
    workers: tuple[str, ...]

    @property
    def type(self) -> EntityType:
        return (self.kind, self.units, len(self.workers))


@attrs.frozen(kw_only=True)
class Pattern:
    """`kept[i]` entities of the class's `i`-th entity type kept, `units[kind]` units in total on the node."""

    kept: tuple[int, ...]
    units: tuple[tuple[str, int], ...]
    saves: int

    def count(self, kind: str) -> int:
        return dict(self.units).get(kind, 0)

    @property
    def has_train(self) -> bool:
        return self.count(TRAIN_KIND) > 0

    @property
    def used(self) -> bool:
        return any(n > 0 for _, n in self.units)


@attrs.frozen(kw_only=True)
class NodeClass:
    nodes: tuple[int, ...]
    types: tuple[EntityType, ...]
    patterns: tuple[Pattern, ...]


@attrs.frozen(kw_only=True)
class Decomposition:
    """Entities per node, the coupled blocks (block -> names of its keepable replicas), the nodes modelled one by
    one and the classes of the remaining nodes."""

    entities: dict[int, tuple[Entity, ...]]
    coupled_blocks: dict[int, tuple[str, ...]]
    single_nodes: tuple[int, ...]
    classes: tuple[NodeClass, ...]


def _entities(problem: PlacementProblem) -> tuple[list[Entity], dict[int, tuple[str, ...]]]:
    entities, coupled = [], {}
    by_block: dict[int, list] = defaultdict(list)
    for o in problem.old:
        w = problem.worker(o.name)
        if w.kind == TRAIN_KIND:
            by_block[w.block].append(o)
        else:
            entities.append(Entity(kind=w.kind, units=1, node=o.nodes[0], workers=(o.name,)))
    for b, olds in sorted(by_block.items()):
        nodes = {n for o in olds for n in o.nodes}
        names = tuple(o.name for o in olds)
        if len(nodes) == 1:
            entities.append(Entity(kind=TRAIN_KIND, units=problem.train_stages, node=nodes.pop(), workers=names))
        else:
            coupled[b] = names
    return entities, coupled


def _patterns(problem: PlacementProblem, types: tuple[EntityType, ...], avail: tuple[int, ...]) -> list[Pattern] | None:
    """The class's patterns, or None when there are more than `MAX_PATTERNS`."""
    g = problem.cluster.gpus_per_node
    size = {k.key: k.size for k in problem.kinds}
    limit = {k.key: k.count for k in problem.kinds}
    keys = [k.key for k in problem.kinds]
    out = []
    for kept in itertools.product(*(range(a + 1) for a in avail)):
        pinned = dict.fromkeys(keys, 0)
        for (kind, units, _), n in zip(types, kept):
            pinned[kind] += units * n
        room = g - sum(size[k] * n for k, n in pinned.items())
        if room < 0 or any(pinned[k] > limit[k] for k in keys):
            continue
        saves = sum(t[2] * n for t, n in zip(types, kept))
        # The smallest unkept entity of each kind: adding that many new units of the kind is dominated.
        unkept_min: dict[str, int] = {}
        for (kind, units, _), n, a in zip(types, kept, avail):
            if n < a:
                unkept_min[kind] = min(units, unkept_min.get(kind, units))
        for extra in _fill(keys, size, limit, pinned, room):
            if any(extra[k] >= m for k, m in unkept_min.items()):
                continue
            new_units = tuple((k, pinned[k] + extra[k]) for k in keys)
            out.append(Pattern(kept=tuple(kept), units=new_units, saves=saves))
            if len(out) > MAX_PATTERNS:
                return None
    return out


def _fill(keys: list[str], size: dict[str, int], limit: dict[str, int], pinned: dict[str, int], room: int):
    """Every vector of new units per kind that fits in `room` GPUs and in the plan's unit counts."""
    if not keys:
        yield {}
        return
    head, rest = keys[0], keys[1:]
    for n in range(min(room // size[head], limit[head] - pinned[head]) + 1):
        for tail in _fill(rest, size, limit, pinned, room - n * size[head]):
            yield {head: n, **tail}


def decompose(problem: PlacementProblem) -> Decomposition:
    entities, coupled_blocks = _entities(problem)
    coupled_names = {name for names in coupled_blocks.values() for name in names}
    single = {n for o in problem.old if o.name in coupled_names for n in o.nodes}
    per_node: dict[int, list[Entity]] = defaultdict(list)
    for e in entities:
        per_node[e.node].append(e)
    members: dict[tuple[tuple[EntityType, int], ...], list[int]] = defaultdict(list)
    for n in range(problem.cluster.num_nodes):
        if n in single:
            continue
        profile: dict[EntityType, int] = defaultdict(int)
        for e in per_node.get(n, ()):
            profile[e.type] += 1
        members[tuple(sorted(profile.items()))].append(n)
    classes = []
    for counts, nodes in sorted(members.items(), key=lambda item: item[1][0]):
        types = tuple(t for t, _ in counts)
        patterns = _patterns(problem, types, tuple(a for _, a in counts))
        if patterns is None:
            single.update(nodes)
        else:
            classes.append(NodeClass(nodes=tuple(nodes), types=types, patterns=tuple(patterns)))
    return Decomposition(
        entities={n: tuple(es) for n, es in per_node.items()},
        coupled_blocks=coupled_blocks,
        single_nodes=tuple(sorted(single)),
        classes=tuple(classes),
    )
