"""Simulator speed (pytest-benchmark): whole runs of every policy.

    python -m pytest benchmarks/bench_sim.py -o python_files='bench_*.py' --benchmark-only -p no:cacheprovider

- ``test_default_100_steps_all_policies``: the default scenario (48 x A800-80GB, Qwen3-14B, r2e-gym, 512 prompts
  x 16 samples = 8,192 trajectories per step) for 100 steps, all eight policies. ``LIBRA_BENCH_STEPS`` overrides
  the step count.
- ``test_1024_gpus``: 1,024 A800 GPUs (128 nodes), 4,096 prompts x 16 = 65,536 trajectories per step, 3 steps,
  all policies. ``LIBRA_BENCH_BIG_STEPS`` overrides the step count.

Each runs once (a run takes minutes) with ``LIBRA_BENCH_WORKERS`` worker processes (default 2, the CLI's default
on this machine; 1 for a single process); per-policy throughput lands in ``extra_info``. Nothing here asserts a
time.
"""

from __future__ import annotations

import os

from libra.sim import POLICY_NAMES, Scenario, WorkSource, simulate
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model


def _scenario(*, gpus: int, prompts: int, workload: str = "r2e-gym") -> Scenario:
    source = WorkSource.from_generator(
        workload, seed=0, num_prompts=prompts, samples_per_prompt=16, max_model_len=40960
    )
    return Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=prompts),
        source=source,
    )


def _run(benchmark, scenario: Scenario, steps: int) -> None:
    workers = int(os.environ.get("LIBRA_BENCH_WORKERS", "2"))
    report = benchmark.pedantic(
        simulate,
        args=(scenario,),
        rounds=1,
        iterations=1,
        kwargs={"num_steps": steps, "policies": POLICY_NAMES, "workers": workers},
    )
    benchmark.extra_info["steps"] = steps
    benchmark.extra_info["workers"] = workers
    benchmark.extra_info["gpus"] = scenario.cluster.num_gpus
    benchmark.extra_info["throughput_tok_s"] = {k: round(v["throughput_tok_s"]) for k, v in report.summary().items()}


def test_default_100_steps_all_policies(benchmark):
    _run(benchmark, _scenario(gpus=48, prompts=512), int(os.environ.get("LIBRA_BENCH_STEPS", "100")))


def test_1024_gpus(benchmark):
    _run(benchmark, _scenario(gpus=1024, prompts=4096), int(os.environ.get("LIBRA_BENCH_BIG_STEPS", "3")))
