"""Placement: map a plan onto concrete GPUs with OR-Tools CP-SAT (node-level model, then deterministic GPU ids)."""

from libra.planning.placement.assign import describe
from libra.planning.placement.errors import (
    InfeasiblePlacementError,
    PlacementError,
    PlacementModelError,
    PlacementTimeoutError,
)
from libra.planning.placement.place import PlacementResult, place, solve_placement
from libra.planning.placement.problem import (
    DEFAULT_KV_RESERVE_TOKENS,
    PlacementCost,
    build_problem,
    moved,
    placement_cost,
    plan_workers,
    rollout_gb_per_gpu,
)

__all__ = [
    "DEFAULT_KV_RESERVE_TOKENS",
    "InfeasiblePlacementError",
    "PlacementCost",
    "PlacementError",
    "PlacementModelError",
    "PlacementResult",
    "PlacementTimeoutError",
    "build_problem",
    "describe",
    "moved",
    "place",
    "placement_cost",
    "plan_workers",
    "rollout_gb_per_gpu",
    "solve_placement",
]
