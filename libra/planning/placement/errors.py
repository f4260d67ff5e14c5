"""Typed placement errors: an infeasible request names the constraints in conflict; a broken model is a bug."""

from __future__ import annotations


class PlacementError(Exception):
    """Base class: the plan could not be mapped onto GPUs."""


class InfeasiblePlacementError(PlacementError, ValueError):
    """No placement satisfies the hard constraints. `conflicts` holds one sentence per constraint in conflict
    (from the pre-solve checks, or from CP-SAT's sufficient assumptions for infeasibility)."""

    def __init__(self, conflicts: list[str] | tuple[str, ...], *, prefix: str = "infeasible placement") -> None:
        self.conflicts = tuple(conflicts)
        super().__init__(f"{prefix}: " + "; ".join(self.conflicts))


class PlacementModelError(PlacementError, RuntimeError):
    """CP-SAT rejected the model itself (MODEL_INVALID): a bug in the model builder, not in the request."""


class PlacementTimeoutError(PlacementError, RuntimeError):
    """CP-SAT found no placement within the time limit and could not prove that none exists."""
