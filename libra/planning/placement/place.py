"""`place(plan, cluster)`: map a plan onto concrete GPUs with CP-SAT (see `model.py` for the math)."""

from __future__ import annotations

import math
import time

import attrs

from libra.planning.placement.assign import assign_gpus
from libra.planning.placement.model import solve_nodes
from libra.planning.placement.problem import (
    DEFAULT_KV_RESERVE_TOKENS,
    PlacementCost,
    build_problem,
    placement_cost,
)
from libra.spec import ClusterSpec, ModelSpec, Placement, Plan, SpecError, checks


@attrs.frozen(kw_only=True)
class PlacementResult:
    """A placement with its cost (moves, training nodes, nodes), whether CP-SAT proved it optimal, and timings."""

    placement: Placement
    cost: PlacementCost
    optimal: bool
    solve_time_s: float
    total_time_s: float


def _check_arguments(*, time_limit_s: float, num_workers: int, kv_reserve_tokens: int) -> None:
    """Bad solver settings are the caller's error, said before any work (CP-SAT would reject a negative or NaN
    time limit as MODEL_INVALID, which reads as a bug in the model builder)."""
    if not 0 < checks.as_float(time_limit_s) < math.inf:  # a bool or a string: as_float is NaN
        raise SpecError(f"time_limit_s must be a finite number of seconds > 0, got {time_limit_s!r}")
    if not (checks.is_whole(num_workers) and num_workers >= 0):
        raise SpecError(f"num_workers must be an integer >= 0 (0: CP-SAT's default), got {num_workers!r}")
    if not (checks.is_whole(kv_reserve_tokens) and kv_reserve_tokens >= 0):
        raise SpecError(f"kv_reserve_tokens must be an integer >= 0, got {kv_reserve_tokens!r}")


def solve_placement(
    plan: Plan,
    cluster: ClusterSpec,
    *,
    model: ModelSpec | None = None,
    current: Placement | None = None,
    time_limit_s: float = 10.0,
    num_workers: int = 1,
    kv_reserve_tokens: int = DEFAULT_KV_RESERVE_TOKENS,
) -> PlacementResult:
    """Like `place`, and also report the cost and whether it is proven optimal. `num_workers=1` (the default)
    keeps CP-SAT deterministic, so the same inputs give the same GPU ids."""
    _check_arguments(time_limit_s=time_limit_s, num_workers=num_workers, kv_reserve_tokens=kv_reserve_tokens)
    start = time.perf_counter()
    problem = build_problem(plan, cluster, model=model, current=current, kv_reserve_tokens=kv_reserve_tokens)
    solution = solve_nodes(problem, time_limit_s=time_limit_s, num_workers=num_workers)
    placement = assign_gpus(problem, solution)
    return PlacementResult(
        placement=placement,
        cost=placement_cost(placement, problem, current),
        optimal=solution.optimal,
        solve_time_s=solution.solve_time_s,
        total_time_s=time.perf_counter() - start,
    )


def place(
    plan: Plan,
    cluster: ClusterSpec,
    *,
    model: ModelSpec | None = None,
    current: Placement | None = None,
    time_limit_s: float = 10.0,
    kv_reserve_tokens: int = DEFAULT_KV_RESERVE_TOKENS,
) -> Placement:
    """Concrete GPUs for every worker of `plan`: one training replica `train-<i>` per DP rank (`tp * pp` GPUs,
    pool CORE_TRAIN) and one rollout instance `rollout-tp<x>-<i>` per instance (`tp` GPUs, pool CORE_ROLLOUT).

    Hard constraints: every TP group and every EP block (see `problem.py`) inside one node; a replica's stages may
    span nodes; each GPU used at most once; the plan within the cluster's GPUs; with `model`, each rollout GPU holds
    its weight shard plus a KV reserve of `kv_reserve_tokens` tokens; `plan.train.memory_gb` (if > 0) fits a GPU.
    Objective, lexicographic: fewest workers of `current` moved (a worker moves when its GPUs change), then fewest
    nodes holding training, then fewest nodes used. Raises `InfeasiblePlacementError` naming the constraints in
    conflict, `PlacementModelError` if CP-SAT rejects the model, `PlacementTimeoutError` if nothing is found in
    `time_limit_s`."""
    return solve_placement(
        plan, cluster, model=model, current=current, time_limit_s=time_limit_s, kv_reserve_tokens=kv_reserve_tokens
    ).placement
