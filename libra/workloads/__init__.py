"""Trace schema and loader, workload profiles, and synthetic agentic workload generators."""

from libra.workloads.generators import WORKLOAD_NAMES, WorkloadGenerator, generate
from libra.workloads.profile import profile_from_trajectories, profiles_over_steps
from libra.workloads.trace import (
    TOOL_STATUSES,
    TraceError,
    TraceValueError,
    Trajectory,
    Turn,
    group_by_step,
    iter_trace,
    load_trace,
    write_trace,
)

__all__ = [
    "TOOL_STATUSES",
    "WORKLOAD_NAMES",
    "TraceError",
    "TraceValueError",
    "Trajectory",
    "Turn",
    "WorkloadGenerator",
    "generate",
    "group_by_step",
    "iter_trace",
    "load_trace",
    "profile_from_trajectories",
    "profiles_over_steps",
    "write_trace",
]
