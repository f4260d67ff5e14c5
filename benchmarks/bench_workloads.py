"""Workload generation (pytest-benchmark): one step of 512 prompts x 16 samples, as the simulator builds it.

    python -m pytest benchmarks/bench_workloads.py --benchmark-only

`WorkloadGenerator.step` makes the 8,192 `Trajectory` values; `WorkSource.step` also turns them into the
simulator's arrays (`step_work`). Early (step 5) and late (step 90) in the drift: late trajectories are longer.
Nothing here asserts a time.
"""

from __future__ import annotations

import pytest

from libra.sim.workload import WorkSource
from libra.workloads.generators import WorkloadGenerator


@pytest.mark.parametrize("step", [5, 90])
@pytest.mark.parametrize("workload", ["search-r1", "r2e-gym"])
def test_generator_step(benchmark, workload, step) -> None:
    gen = WorkloadGenerator(workload, seed=0, num_prompts=512, samples_per_prompt=16)
    trajectories = benchmark.pedantic(gen.step, args=(step,), rounds=5, iterations=1)
    benchmark.extra_info.update(
        workload=workload, step=step, trajectories=len(trajectories), turns=sum(len(t.turns) for t in trajectories)
    )


@pytest.mark.parametrize("step", [5, 90])
@pytest.mark.parametrize("workload", ["search-r1", "r2e-gym"])
def test_work_source_step(benchmark, workload, step) -> None:
    source = WorkSource.from_generator(workload, seed=0, num_prompts=512, samples_per_prompt=16, max_model_len=40960)
    work = benchmark.pedantic(source.step, args=(step,), rounds=5, iterations=1)
    benchmark.extra_info.update(workload=workload, step=step, requests=work.num_requests)
