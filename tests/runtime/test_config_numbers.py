"""Run configuration numbers take what `libra.spec.checks` takes: numpy integers are counts (as `ClusterSpec` takes
them) and become Python ints; a bool is no number; the error stays a `RunConfigError`."""

from __future__ import annotations

import numpy as np
import pytest

from libra.runtime import RunConfig, RunConfigError, config_from_dict
from libra.runtime.config import HybridSettings, VirtualSettings


def test_numpy_counts_are_accepted_as_python_ints() -> None:
    # before: "steps must be a whole number >= 1, got np.int64(3)" (ClusterSpec took the same value)
    c = RunConfig(steps=np.int64(3), seed=np.uint32(7), router_size_edges=(np.int32(8), np.int64(32)))
    v = VirtualSettings(gpus=np.int64(8), gpus_per_node=np.int32(8), tp_degrees=[np.int64(1), np.int64(2)])
    assert (c.steps, c.seed, c.router_size_edges, v.gpus, v.tp_degrees) == (3, 7, (8, 32), 8, (1, 2))
    assert all(type(x) is int for x in (c.steps, c.seed, *c.router_size_edges, v.gpus, v.gpus_per_node, *v.tp_degrees))


def test_numpy_floats_are_numbers() -> None:
    # before: a float32 was refused (not a Python float), a float64 taken
    assert RunConfig(lr=np.float32(0.5), temperature=np.float32(0.5)).lr == 0.5  # type: ignore[arg-type]
    assert HybridSettings(min_idle_fraction=np.float32(0.5)).min_idle_fraction == 0.5  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"steps": True}, "steps must be a whole number >= 1, got True"),
        ({"steps": np.float64(2.0)}, "steps must be a whole number >= 1, got np.float64(2.0)"),
        ({"seed": np.int64(-1)}, "seed must be an integer in [0, 4294967295], got -1"),
        ({"lr": 10**400}, "lr must be a positive number, got 1000"),
        ({"temperature": True}, "temperature must be a number >= 0, got True"),
        ({"hybrid": {"workers": np.int64(-1)}}, "workers must be an integer >= 0, got -1"),
    ],
)
def test_bad_numbers_stay_run_config_errors(raw, needle) -> None:
    with pytest.raises(RunConfigError) as err:
        config_from_dict(raw)
    assert needle in str(err.value)
