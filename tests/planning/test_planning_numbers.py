"""Planning numbers are read as `libra.spec.checks` reads them: numpy numbers are numbers, an integer too large for a
float is no finite number (a one-line SpecError, where it was a traceback), a bool is none."""

from __future__ import annotations

import numpy as np
import pytest

from libra.planning import GlobalPlanner, ReplanGate
from libra.planning.placement import solve_placement
from libra.spec import ClusterSpec, RLSettings, SpecError, WorkloadProfile, get_gpu, get_model


def test_replan_gate_costs_take_numpy_numbers() -> None:
    # before: "ReplanGate.to_rollout_s must be a number >= 0, got np.int64(10)" (a float64 was taken, an int64 not)
    gate = ReplanGate(to_rollout_s=np.int64(10), to_training_s=np.float32(8.0), min_relative_gain=np.float16(0.5))  # type: ignore[arg-type]
    assert (gate.to_rollout_s, gate.to_training_s, gate.min_relative_gain) == (10, 8.0, 0.5)
    with pytest.raises(SpecError, match=r"^ReplanGate\.to_rollout_s must be a number >= 0, got 1000"):
        ReplanGate(to_rollout_s=10**400)


def test_a_placement_time_limit_too_large_for_a_float_is_refused_before_any_work() -> None:
    # before: taken, and CP-SAT's parameter raised a traceback (no SpecError)
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
    planner = GlobalPlanner(
        cluster=cluster, model=get_model("Qwen3-4B"), rl=RLSettings(num_prompts=8, samples_per_prompt=8)
    )
    profile = WorkloadProfile.build(name="ramp", shapes=[(1000.0, 500.0, 3.0)] * 8, mean_tool_time_s=2.0)
    plan = planner.plan(profile)
    with pytest.raises(SpecError, match=r"^time_limit_s must be a finite number of seconds > 0, got 1000"):
        solve_placement(plan, cluster, model=planner.model, time_limit_s=10**400)
    placed = solve_placement(plan, cluster, model=planner.model, time_limit_s=np.float32(5.0), num_workers=np.int64(1))  # type: ignore[arg-type]
    assert placed.optimal
