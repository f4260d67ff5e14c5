"""Spec values built in code are checked as those read from files are: a wrong type, a bool for a count, NaN, inf,
a negative or huge value, or fields that contradict each other is one line naming the class, the field and the
value (before, `InstanceGroup(min_tokens=200, max_tokens=100)`, negative counts, `TrainConfig(time_s=nan)`,
`WorkloadProfile(requests_per_step=nan)` and NaN plan times were all accepted and planned with)."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import numpy as np
import pytest

from libra.spec import (
    Bucket,
    ClusterSpec,
    GPUSpec,
    InstanceGroup,
    LengthGroup,
    Plan,
    RLSettings,
    RolloutConfig,
    SpecError,
    TrainConfig,
    WorkloadProfile,
    get_gpu,
    parse_buckets,
)
from libra.spec.placement import Role, WorkerPlacement

GROUP: dict[str, Any] = {"tp": 2, "count": 1, "max_tokens": 100.0}
TRAIN: dict[str, Any] = {"num_gpus": 4, "tp": 2, "pp": 1, "dp": 2}
LENGTHS: dict[str, Any] = {"count": 4, "mean_total": 100.0, "mean_gen": 50.0, "max_total": 150.0}
PROFILE: dict[str, Any] = {"name": "p", "total_lengths": (100.0, 200.0), "gen_tokens": (50.0, 80.0)}


def _rollout(**kw: Any) -> RolloutConfig:
    return RolloutConfig(**{"num_gpus": 2, "time_s": 1.0, "instances": (InstanceGroup(**GROUP),), **kw})


def _plan(**kw: Any) -> Plan:
    return Plan(**{"train": TrainConfig(**TRAIN), "rollout": _rollout(), "makespan_s": 2.0, **kw})


def _one_line_naming(err: pytest.ExceptionInfo, owner: str, field: str) -> None:
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{owner}.{field} must be ") and ", got " in text, text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", -1),
        ("count", 1.0),
        ("count", True),
        ("count", 10**9),
        ("tp", 0),
        ("tp", True),
        ("tp", "2"),
        ("tp", 128),
        ("max_tokens", math.nan),
        ("max_tokens", -5.0),
        ("max_tokens", "inf"),
        ("min_tokens", math.nan),
        ("min_tokens", -1.0),
        ("min_tokens", math.inf),
    ],
)
def test_instance_group_refuses_bad_fields(field, value) -> None:
    with pytest.raises(SpecError) as err:
        InstanceGroup(**{**GROUP, field: value})
    _one_line_naming(err, "InstanceGroup", field)


def test_instance_group_min_above_max_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^InstanceGroup\.min_tokens \(200\) must be <= max_tokens \(100\)$"):
        InstanceGroup(tp=2, count=1, max_tokens=100, min_tokens=200)


def test_instance_group_keeps_what_plans_hold() -> None:
    """A bucket with no instances (placement takes such plans), an empty (min, max] where groups end at the same
    length, the open last bucket, and numpy's integers."""
    assert InstanceGroup(tp=2, count=0, max_tokens=100.0).num_gpus == 0
    InstanceGroup(tp=2, count=1, max_tokens=100.0, min_tokens=100.0)
    InstanceGroup(tp=8, count=3, max_tokens=math.inf, min_tokens=4000.0)
    assert InstanceGroup(tp=np.int64(4), count=np.int32(2), max_tokens=np.float64(9.0)).num_gpus == 8  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("time_s", math.nan),
        ("time_s", math.inf),
        ("time_s", -1.0),
        ("memory_gb", -1.0),
        ("memory_gb", math.nan),
        ("micro_batch", 0),
        ("micro_batch", 1.5),
        ("recompute", "false"),
        ("recompute", 1),
        ("ep", 0),
        ("tp", True),
        ("num_gpus", "4"),
    ],
)
def test_train_config_refuses_bad_fields(field, value) -> None:
    with pytest.raises(SpecError) as err:
        TrainConfig(**{**TRAIN, field: value})
    _one_line_naming(err, "TrainConfig", field)


def test_train_config_of_no_training_gpus_is_still_a_value() -> None:
    """dp 0: a plan without training GPUs (the placement properties build such plans)."""
    assert TrainConfig(num_gpus=0, tp=2, pp=1, dp=0).num_gpus == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_gpus": -1}, "num_gpus"),
        ({"num_gpus": 2.0}, "num_gpus"),
        ({"time_s": math.nan}, "time_s"),
        ({"time_s": -3.0}, "time_s"),
        ({"instances": [InstanceGroup(**GROUP)]}, "instances"),
        ({"instances": ({"tp": 2, "count": 1},)}, r"instances[]"),
    ],
)
def test_rollout_config_refuses_bad_fields(kwargs, field) -> None:
    with pytest.raises(SpecError) as err:
        _rollout(**kwargs)
    _one_line_naming(err, "RolloutConfig", field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("makespan_s", math.nan),
        ("makespan_s", -1.0),
        ("lower_bound_s", math.inf),
        ("fluid_bound_s", math.nan),
        ("chain_bound_s", "1"),
        ("solve_time_s", math.nan),
        ("train", None),
        ("rollout", "rollout"),
    ],
)
def test_plan_refuses_bad_fields(field, value) -> None:
    with pytest.raises(SpecError) as err:
        _plan(**{field: value})
    _one_line_naming(err, "Plan", field)


def test_plan_times_read_back_from_json_still_load() -> None:
    """JSON gives whole numbers as ints and the open last bucket as null (read back as inf)."""
    data = json.loads(json.dumps(_plan(makespan_s=2, lower_bound_s=1).to_dict()))
    train = TrainConfig(num_gpus=data["train"]["gpus"], **{k: data["train"][k] for k in ("tp", "pp", "dp", "ep")})
    groups = tuple(
        InstanceGroup(tp=g["tp"], count=g["count"], max_tokens=math.inf if g["max_tokens"] is None else g["max_tokens"])
        for g in data["rollout"]["instances"]
    )
    rollout = RolloutConfig(num_gpus=data["rollout"]["gpus"], time_s=data["rollout"]["time_s"], instances=groups)
    again = Plan(train=train, rollout=rollout, makespan_s=data["makespan_s"], lower_bound_s=data["lower_bound_s"])
    assert again == _plan(makespan_s=2.0, lower_bound_s=1.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tp": 0}, "tp"),
        ({"tp": True}, "tp"),
        ({"tp": 2.0}, "tp"),
        ({"tp": "2"}, "tp"),
        ({"tp": 65}, "tp"),
        ({"max_tokens": math.nan}, "max_tokens"),
        ({"max_tokens": 0.0}, "max_tokens"),
        ({"max_tokens": "inf"}, "max_tokens"),
        ({"max_tokens": None}, "max_tokens"),
    ],
)
def test_bucket_refuses_bad_fields(kwargs, field) -> None:
    with pytest.raises(SpecError) as err:
        Bucket(**{"tp": 2, "max_tokens": 100.0, **kwargs})
    _one_line_naming(err, "Bucket", field)


def test_bucket_takes_any_degree_a_node_holds() -> None:
    """TP_DEGREES is only the planner's default: its `tp_degrees` option and `parse_buckets` take any degree up to
    the GPUs of a node (TP-3 serves a model of 24 heads on nodes of 6 GPUs), so Bucket(tp=3) is a valid bucket."""
    assert Bucket(tp=3, max_tokens=100.0).tp == 3
    assert parse_buckets("3:100,6:inf") == (Bucket(tp=3, max_tokens=100.0), Bucket(tp=6, max_tokens=math.inf))
    assert Bucket(tp=np.int64(64), max_tokens=np.float64(5.0)).tp == 64  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", -1),
        ("count", 0),
        ("count", 2.5),
        ("mean_total", math.nan),
        ("mean_gen", -1.0),
        ("max_total", math.inf),
        ("mean_turns", "1"),
        ("max_tool_s", -1.0),
        ("max_tool_s", math.nan),
        ("max_gen_tool_s", math.inf),
    ],
)
def test_length_group_refuses_bad_fields(field, value) -> None:
    with pytest.raises(SpecError) as err:
        LengthGroup(**{**LENGTHS, field: value})
    _one_line_naming(err, "LengthGroup", field)


@pytest.mark.parametrize("value", [math.nan, 2.5, True, "8", 0, -3, 10**10])
def test_profile_refuses_a_bad_step_size(value) -> None:
    with pytest.raises(SpecError) as err:
        WorkloadProfile(**PROFILE, requests_per_step=value)
    _one_line_naming(err, "WorkloadProfile", "requests_per_step")
    assert "requests_per_step must be >= 1" in str(err.value)  # the wording the planner's tests match


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"turns": (1.0, math.nan)}, r"^WorkloadProfile\.turns must be finite counts >= 0$"),
        ({"turns": (-1.0, 2.0)}, r"^WorkloadProfile\.turns must be finite counts >= 0$"),
        (
            {"total_lengths": (100.0, "200")},
            r"^WorkloadProfile 'p': trajectory shapes must be finite numbers, got '200'$",
        ),
        ({"gen_tokens": (50.0, None)}, r"^WorkloadProfile 'p': trajectory shapes must be finite numbers, got None$"),
        ({"tool_s": ("1", 2.0)}, r"^WorkloadProfile 'p': trajectory shapes must be finite numbers, got '1'$"),
        ({"total_lengths": (100.0, 2e9)}, r"^WorkloadProfile\.total_lengths must be .* <= 1,000,000,000$"),
        ({"total_lengths": (100.0, 10**400)}, r"^WorkloadProfile 'p': trajectory shapes must be finite numbers, got 1"),
        ({"mean_tool_time_s": math.nan}, r"^WorkloadProfile\.mean_tool_time_s must be finite seconds >= 0, got nan$"),
        ({"mean_tool_time_s": "1"}, r"^WorkloadProfile\.mean_tool_time_s must be finite seconds >= 0, got '1'$"),
        ({"name": 7}, r"^WorkloadProfile\.name must be a str, got int 7$"),
    ],
)
def test_profile_refuses_bad_samples(kwargs, message) -> None:
    with pytest.raises(SpecError, match=message):
        WorkloadProfile(**{**PROFILE, **kwargs})


def test_profile_keeps_numpy_samples() -> None:
    p = WorkloadProfile(name="p", total_lengths=np.array([1.0, 2.0]), gen_tokens=np.array([1, 1]), turns=[1, 2])
    assert p.num_samples == 2 and attrs.evolve(p, requests_per_step=np.int64(3)).requests_per_step == 3  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"), [("num_prompts", True), ("samples_per_prompt", 2.0), ("max_model_len", 10**12)]
)
def test_rl_settings_refuse_bools_and_huge_values(field, value) -> None:
    with pytest.raises(SpecError) as err:
        RLSettings(**{field: value})
    _one_line_naming(err, "RLSettings", field)


def test_gpu_needs_a_name_and_takes_numpy_numbers() -> None:
    fields = {f.name: getattr(get_gpu("H100-80GB"), f.name) for f in attrs.fields(GPUSpec)}
    for name in (7, "", None):
        with pytest.raises(SpecError) as err:
            GPUSpec(**{**fields, "name": name})
        _one_line_naming(err, "GPUSpec", "name")
    gpu = GPUSpec(**{**fields, "memory_gb": np.float32(80.0)})
    assert ClusterSpec(gpu=gpu, num_nodes=np.int64(2), gpus_per_node=8).num_gpus == 16  # type: ignore[arg-type]


def test_worker_placement_takes_numpy_ids_and_refuses_ids_past_the_largest_cluster() -> None:
    w = WorkerPlacement(name="r0", role=Role.ROLLOUT_INSTANCE, tp=2, gpu_ids=(np.int64(0), np.int64(1)))  # type: ignore[arg-type]
    assert w.gpu_ids == (0, 1)
    with pytest.raises(SpecError, match=r"gpu_ids must be distinct GPU ids in \[0, 65,536\), got \(0, 65536\)$"):
        WorkerPlacement(name="r0", role=Role.ROLLOUT_INSTANCE, tp=2, gpu_ids=(0, 65536))
    with pytest.raises(SpecError) as err:
        WorkerPlacement(name="r0", role=Role.ROLLOUT_INSTANCE, tp=True, gpu_ids=(0,))
    _one_line_naming(err, "WorkerPlacement", "tp")
