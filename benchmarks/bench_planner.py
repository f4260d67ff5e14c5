"""Planner solve time (pytest-benchmark): `python -m pytest benchmarks/bench_planner.py --benchmark-only`.

Each round builds a fresh planner (no memoised tables), exactly what one `libra plan` call does, for the default
model (Qwen3-14B) on A800 nodes of 8 with an R2E-Gym-like step of 8,192 requests. Targets: 48 GPUs < 50 ms,
128 GPUs < 0.2 s, 1,024 GPUs < 100 ms and 8,192 GPUs < 0.5 s (issue 16; on an idle machine). Plans must stay
identical while speeding it up: tests/planning/test_golden_plans.py.
"""

from __future__ import annotations

import pytest

from libra.planning import GlobalPlanner
from libra.spec import ClusterSpec, get_gpu, get_model
from libra.workloads import profile_from_trajectories
from libra.workloads.generators import WorkloadGenerator


@pytest.fixture(scope="module")
def profile():
    return profile_from_trajectories(WorkloadGenerator("r2e-gym", seed=0, num_prompts=512).step(0), name="r2e-gym")


def _planner(gpus: int) -> GlobalPlanner:
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8)
    return GlobalPlanner(cluster=cluster, model=get_model("Qwen3-14B"))


@pytest.mark.parametrize("gpus", [48, 128, 1024, 8192])
def test_plan_cold(benchmark, profile, gpus: int) -> None:
    rounds = 10 if gpus <= 128 else 3
    plan = benchmark.pedantic(lambda: _planner(gpus).plan(profile), rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(makespan_s=plan.makespan_s, lower_bound_s=plan.lower_bound_s)
    assert plan.num_gpus == gpus


@pytest.mark.parametrize(("gpus", "per_node"), [(1020, 6), (1015, 7), (1020, 12)])
def test_plan_cold_odd_nodes(benchmark, profile, gpus: int, per_node: int) -> None:
    """Nodes whose size some TP degree does not divide: the search carries node packing (docs/planner.md)."""
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=per_node)
    plan = benchmark.pedantic(
        lambda: GlobalPlanner(cluster=cluster, model=get_model("Qwen3-14B")).plan(profile),
        rounds=3,
        iterations=1,
        warmup_rounds=1,
    )
    benchmark.extra_info.update(makespan_s=plan.makespan_s)
    assert plan.num_gpus == gpus


@pytest.mark.parametrize("gpus", [48, 1024])
def test_replan_with_memoised_tables(benchmark, profile, gpus: int) -> None:
    planner = _planner(gpus)
    planner.plan(profile)
    plan = benchmark(lambda: planner.plan(profile, num_gpus=gpus - 8))
    assert plan.num_gpus == gpus - 8
