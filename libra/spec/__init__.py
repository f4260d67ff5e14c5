"""Vocabulary of Libra: hardware, cluster, model, RL settings, workload profile, plan and placement (frozen attrs)."""

from libra.spec.cluster import ClusterSpec
from libra.spec.errors import SpecError
from libra.spec.hardware import GPU_PRESETS, GPUSpec, get_gpu
from libra.spec.loaders import load_cluster, load_model
from libra.spec.model import MODEL_PRESETS, ModelSpec, get_model
from libra.spec.placement import Placement, Pool, Role, WorkerPlacement
from libra.spec.plan import (
    TP_DEGREES,
    Bucket,
    InstanceGroup,
    Plan,
    RolloutConfig,
    TrainConfig,
    bucket_index,
    format_buckets,
    parse_buckets,
)
from libra.spec.profile import LengthGroup, WorkloadProfile
from libra.spec.rl import RLSettings

__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "TP_DEGREES",
    "Bucket",
    "ClusterSpec",
    "GPUSpec",
    "InstanceGroup",
    "LengthGroup",
    "ModelSpec",
    "Placement",
    "Plan",
    "Pool",
    "RLSettings",
    "Role",
    "RolloutConfig",
    "SpecError",
    "TrainConfig",
    "WorkerPlacement",
    "WorkloadProfile",
    "bucket_index",
    "format_buckets",
    "get_gpu",
    "get_model",
    "load_cluster",
    "load_model",
    "parse_buckets",
]
