"""Planning: cost model, training-parallelism tree, rollout DP, global planner, replan gate and placement.

Placement (OR-Tools CP-SAT) lives in `libra.planning.placement` and is imported on demand (OR-Tools takes a few
hundred milliseconds to import).
"""

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.planner import GlobalPlanner, PlannerOptions, PlanningError
from libra.planning.replan import ReplanDecision, ReplanGate
from libra.planning.rollout_dp import RolloutTable
from libra.planning.train_tree import TrainingSearch, TreeOptions

__all__ = [
    "BatchStats",
    "CostCoefficients",
    "CostModel",
    "GlobalPlanner",
    "PlannerOptions",
    "PlanningError",
    "ReplanDecision",
    "ReplanGate",
    "RolloutTable",
    "TrainingSearch",
    "TreeOptions",
]
