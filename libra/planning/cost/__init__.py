"""The cost model: predicted rollout and training times from the model, the GPUs and coefficients (data)."""

from __future__ import annotations

from libra.planning.cost.coefficients import CostCoefficients, load_coefficients
from libra.planning.cost.rollout import RolloutCost
from libra.planning.cost.training import BatchStats, TrainingCost
from libra.spec import ClusterSpec, ModelSpec


class CostModel:
    """Both sides of the cost model for one cluster and model; `rollout` and `training` hold the formulas."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, coeffs: CostCoefficients | None = None) -> None:
        self.cluster, self.model = cluster, model
        self.coeffs = coeffs or CostCoefficients()
        self.rollout = RolloutCost(cluster.gpu, model, self.coeffs)
        self.training = TrainingCost(cluster, model, self.coeffs)


__all__ = ["BatchStats", "CostCoefficients", "CostModel", "RolloutCost", "TrainingCost", "load_coefficients"]
