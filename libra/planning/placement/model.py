"""The CP-SAT placement model, at the granularity of node classes (see `patterns.py` for entities and classes).

Variables
---------
- `x[C, p]` in `0..|C|`: how many nodes of class `C` take pattern `p` (a pattern fixes, for one node, which of its
  entities are kept and how many units of each kind it hosts, within `G` GPUs).
- For each single node `n` (touched by an EP block whose kept replicas would span nodes, or in a class with too
  many patterns): `c[t][n]` in
  `0..G // size_t` units of kind `t`, `keep[e]` per entity on `n`, `keep[r]` per replica of a coupled block, and
  `fixed[b, s, n]`: block-stage `(b, s)` is pinned to `n` by a kept replica whose stage `s` was there.
- `ut[n]`, `u[n]` (bool) for single nodes: `n` hosts training / any unit.

Hard constraints, each behind a named guard literal (`add_assumptions`, as in `assumptions_sample_sat.py`)
---------------------------------------------------------------------------------------------------------
- `place <kind>`: `sum_{C,p} x[C, p] * units_t(p) + sum_n c[t][n] = count_t`: every unit placed exactly once.
- `node capacity`: `sum_t size_t * c[t][n] <= G` on single nodes; patterns respect it by construction.
Unguarded, because `keep = 0` always satisfies them: `sum_p x[C, p] = |C|`; `c[t][n] >= pinned units of kept
entities and fixed block-stages on n`; `fixed[b, s, n] >= keep[r]`; `sum_n fixed[b, s, n] <= 1`.

Objective (lexicographic, as one weighted sum)
----------------------------------------------
`minimise W1 * moves + W2 * train_nodes + nodes`, `moves = matched - kept` (`kept` counts kept workers: pattern
saves, kept entities and kept replicas), `train_nodes = sum x[C, p] [p hosts training] + sum_n ut[n]`,
`nodes = sum x[C, p] [p hosts anything] + sum_n u[n]`, `W2 = N + 1`, `W1 = (N + 1)^2`: no packing outweighs one
move and no rollout packing outweighs one training node.

Why this loses no optimality
----------------------------
Every constraint is about nodes (a unit inside one node, at most `G` GPUs per node), GPUs inside a node are
interchangeable (NVLink joins them all), and the objective depends only on which nodes host training or anything
and on which workers keep their exact GPUs. So a solution is fully described by per-node unit counts and the kept
set: `assign.py` gives kept workers their old GPUs (disjoint, inside their units' nodes) and fills the other
`G - kept` GPUs of each node with the remaining units, which fit because capacity counts kept GPUs inside their
units. Conversely every GPU-level placement projects onto such counts with an objective no worse (a worker that
lands on its old GPUs by chance can be marked kept). Nodes of one class are interchangeable, so counting nodes per
pattern instead of choosing a pattern per node loses nothing either. The model has `O(sum_C patterns(C))` variables
(a few hundred on 8-GPU nodes, whatever the number of nodes) plus per-node variables on single nodes only, instead
of one boolean per (worker, GPU).

Single nodes that nothing pins are interchangeable too: their `c[train][n]`, `ut[n]` and `u[n]` are made
non-increasing in node order (symmetry breaking; sorting them so keeps every objective term).

Solving: first without assumptions (guards fixed true: full presolve); only an INFEASIBLE result is solved again
with the guards as assumptions, which yields `sufficient_assumptions_for_infeasibility`.
"""

from __future__ import annotations

import time
from collections import defaultdict

import attrs
from ortools.sat.python import cp_model

from libra.planning.placement.errors import InfeasiblePlacementError, PlacementModelError, PlacementTimeoutError
from libra.planning.placement.patterns import Decomposition, decompose
from libra.planning.placement.problem import TRAIN_KIND, PlacementProblem


@attrs.frozen(kw_only=True)
class NodeSolution:
    """`counts[kind][n]` units per node, the names of kept workers, and how the solve ended."""

    counts: dict[str, tuple[int, ...]]
    kept: frozenset[str]
    objective: int
    optimal: bool
    solve_time_s: float


@attrs.define
class _Vars:
    x: dict[tuple[int, int], cp_model.IntVar] = attrs.Factory(dict)
    c: dict[tuple[str, int], cp_model.IntVar] = attrs.Factory(dict)
    keep_entity: dict[tuple[int, int], cp_model.IntVar] = attrs.Factory(dict)
    keep_replica: dict[str, cp_model.IntVar] = attrs.Factory(dict)
    guards: dict[int, str] = attrs.Factory(dict)
    guard_lits: list[cp_model.IntVar] = attrs.Factory(list)


def _single(model: cp_model.CpModel, problem: PlacementProblem, dec: Decomposition, v: _Vars):
    """Per-node variables for single nodes. Returns per-kind unit sums, kept count, training/any-use indicators."""
    g = problem.cluster.gpus_per_node
    units: dict[str, list] = defaultdict(list)
    saved, used_train, used = [], [], []
    pinned: dict[tuple[str, int], list] = defaultdict(list)
    for n in dec.single_nodes:
        for k in problem.kinds:
            v.c[(k.key, n)] = model.new_int_var(0, g // k.size, f"{k.key} on node {n}")
            units[k.key].append(v.c[(k.key, n)])
        for i, e in enumerate(dec.entities.get(n, ())):
            lit = v.keep_entity[(n, i)] = model.new_bool_var(f"keep {e.workers}")
            pinned[(e.kind, n)].append(e.units * lit)
            saved.append(len(e.workers) * lit)
        ut, u = model.new_bool_var(f"training on node {n}"), model.new_bool_var(f"node {n} used")
        train = v.c.get((TRAIN_KIND, n))
        model.add((train if train is not None else 0) <= g * ut)
        model.add(sum(v.c[(k.key, n)] for k in problem.kinds) <= g * u)
        used_train.append(ut)
        used.append(u)
    old = {o.name: o for o in problem.old}
    for b, names in dec.coupled_blocks.items():
        stage_lits: dict[tuple[int, int], list] = defaultdict(list)
        for name in names:
            lit = v.keep_replica[name] = model.new_bool_var(f"keep {name}")
            saved.append(lit)
            for s, n in enumerate(old[name].nodes):
                stage_lits[(s, n)].append(lit)
        per_stage: dict[int, list] = defaultdict(list)
        for (s, n), lits in stage_lits.items():
            fixed = model.new_bool_var(f"block {b} stage {s} on node {n}")
            for lit in lits:
                model.add_implication(lit, fixed)
            per_stage[s].append(fixed)
            pinned[(TRAIN_KIND, n)].append(fixed)
        for lits in per_stage.values():
            model.add_at_most_one(lits)
    for (kind, n), terms in pinned.items():
        model.add(v.c[(kind, n)] >= sum(terms))
    # Symmetry breaking: single nodes that nothing pins are interchangeable, so order them by use.
    touched = {n for names in dec.coupled_blocks.values() for name in names for n in old[name].nodes}
    free = [i for i, n in enumerate(dec.single_nodes) if n not in touched and n not in dec.entities]
    for a, b in zip(free, free[1:]):
        model.add(used_train[a] >= used_train[b])
        model.add(used[a] >= used[b])
        if TRAIN_KIND in units:
            model.add(units[TRAIN_KIND][a] >= units[TRAIN_KIND][b])
    return units, saved, used_train, used


def build_model(problem: PlacementProblem, dec: Decomposition, *, explain: bool) -> tuple[cp_model.CpModel, _Vars]:
    """The model; with `explain`, the guards are assumptions, otherwise they are fixed true."""
    model = cp_model.CpModel()
    v = _Vars()

    def guard(text: str) -> cp_model.IntVar:
        lit = model.new_bool_var(text)
        v.guards[lit.index] = text
        v.guard_lits.append(lit)
        return lit

    # Variables: nodes per (class, pattern), and the single nodes' own variables.
    for ci, cls in enumerate(dec.classes):
        for pi, _ in enumerate(cls.patterns):
            v.x[(ci, pi)] = model.new_int_var(0, len(cls.nodes), f"class {ci} pattern {pi}")
        model.add(sum(v.x[(ci, pi)] for pi in range(len(cls.patterns))) == len(cls.nodes))
    units, saved, used_train, used = _single(model, problem, dec, v)

    # Constraints.
    for k in problem.kinds:
        terms = [
            p.count(k.key) * v.x[(ci, pi)]
            for ci, cls in enumerate(dec.classes)
            for pi, p in enumerate(cls.patterns)
            if p.count(k.key)
        ]
        model.add(sum(terms) + sum(units[k.key]) == k.count).only_enforce_if(guard(k.label))
    g = problem.cluster.gpus_per_node
    cap = guard(f"node capacity: {problem.cluster.num_nodes} nodes x {g} GPUs, each GPU used at most once")
    for n in dec.single_nodes:
        model.add(sum(k.size * v.c[(k.key, n)] for k in problem.kinds) <= g).only_enforce_if(cap)

    # Objective.
    for ci, cls in enumerate(dec.classes):
        for pi, p in enumerate(cls.patterns):
            saved.append(p.saves * v.x[(ci, pi)])
            if p.has_train:
                used_train.append(v.x[(ci, pi)])
            if p.used:
                used.append(v.x[(ci, pi)])
    w2 = problem.cluster.num_nodes + 1
    moves = problem.unkeepable + len(problem.old) - sum(saved)
    model.minimize(w2 * w2 * moves + w2 * sum(used_train) + sum(used))

    if explain:
        model.add_assumptions(v.guard_lits)
    else:
        model.add_bool_and(v.guard_lits)
    return model, v


def _extract(problem: PlacementProblem, dec: Decomposition, v: _Vars, solver: cp_model.CpSolver):
    counts = {k.key: [0] * problem.cluster.num_nodes for k in problem.kinds}
    kept: set[str] = set()
    for ci, cls in enumerate(dec.classes):
        chosen = [p for pi, p in enumerate(cls.patterns) for _ in range(solver.value(v.x[(ci, pi)]))]
        # Training first, on the lowest node ids of the class, so training stays contiguous.
        chosen.sort(key=lambda p: (-p.count(TRAIN_KIND), not p.used))
        for n, p in zip(cls.nodes, chosen):
            for key, count in p.units:
                counts[key][n] = count
            for t, num in zip(cls.types, p.kept):
                of_type = sorted((e for e in dec.entities.get(n, ()) if e.type == t), key=lambda e: e.workers)
                for e in of_type[:num]:
                    kept.update(e.workers)
    for (key, n), var in v.c.items():
        counts[key][n] = solver.value(var)
    for (n, i), lit in v.keep_entity.items():
        if solver.boolean_value(lit):
            kept.update(dec.entities[n][i].workers)
    kept.update(name for name, lit in v.keep_replica.items() if solver.boolean_value(lit))
    return {key: tuple(vals) for key, vals in counts.items()}, frozenset(kept)


def solve_nodes(problem: PlacementProblem, *, time_limit_s: float, num_workers: int) -> NodeSolution:
    """Solve the model; raise a typed error unless a placement was found."""
    dec = decompose(problem)
    model, v = build_model(problem, dec, explain=False)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = num_workers
    start = time.perf_counter()
    status = solver.solve(model)
    elapsed = time.perf_counter() - start

    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        counts, kept = _extract(problem, dec, v, solver)
        return NodeSolution(
            counts=counts,
            kept=kept,
            objective=round(solver.objective_value),
            optimal=status == cp_model.OPTIMAL,
            solve_time_s=elapsed,
        )
    if status == cp_model.INFEASIBLE:
        raise InfeasiblePlacementError(
            _explain(problem, dec, time_limit_s), prefix="infeasible placement, these constraints conflict"
        )
    if status == cp_model.MODEL_INVALID:
        raise PlacementModelError(f"CP-SAT rejected the placement model: {model.validate()}")
    raise PlacementTimeoutError(
        f"no placement found within {time_limit_s:g} s (CP-SAT status {solver.status_name(status)}); raise time_limit_s"
    )


def _explain(problem: PlacementProblem, dec: Decomposition, time_limit_s: float) -> list[str]:
    """Solve again with the guards as assumptions (sequential search, no presolve: the setting in which CP-SAT
    reports a useful core), then shrink the core by deletion (drop a guard when the rest stays infeasible), so
    that every constraint named is needed for the conflict. Capacity is built into the patterns, so it is part of
    every conflict and always named."""
    model, v = build_model(problem, dec, explain=True)
    lits = {lit.index: lit for lit in v.guard_lits}
    cap = v.guard_lits[-1].index

    def infeasible(indices: list[int]) -> list[int] | None:
        model.clear_assumptions()
        model.add_assumptions([lits[i] for i in indices])
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = time_limit_s
        solver.parameters.num_workers = 1
        solver.parameters.cp_model_presolve = False
        if solver.solve(model) != cp_model.INFEASIBLE:
            return None
        return [i for i in solver.sufficient_assumptions_for_infeasibility() if i in lits]

    core = infeasible(list(lits)) or list(lits)
    for i in list(core):
        if i != cap and len(core) > 1 and infeasible([j for j in core if j != i]) is not None:
            core.remove(i)
    return [v.guards[i] for i in core if i != cap] + [v.guards[cap]]
