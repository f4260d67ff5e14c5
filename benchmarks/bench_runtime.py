"""Orchestration overhead of `libra run` (pytest-benchmark): wall time of the orchestrator's thread not spent
inside engines, tools, waiting for the trainer, pushing weights or starting/stopping engines, per step.

    python -m pytest benchmarks/bench_runtime.py --benchmark-only -p no:cacheprovider

One run of the embedded default (`RunConfig()`, 4 steps, max_staleness 1) on real engines. The overhead includes
Libra's own decisions (profile, replan, placement, router) and the bookkeeping (records, checkpoints). Reported in
`extra_info`: per step, the overhead in seconds and as a share of the step's wall time, and the planning part;
the target is < 2 % of step time. `LIBRA_BENCH_RUN_STEPS` changes the number of steps. Nothing here asserts a time.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")

from libra.runtime import Orchestrator, RunConfig  # noqa: E402
from libra.runtime.records import read_jsonl  # noqa: E402

STEPS = int(os.environ.get("LIBRA_BENCH_RUN_STEPS", 4))


def test_orchestration_overhead_per_step(benchmark, tmp_path) -> None:
    out = tmp_path / "run"

    def one_run():
        orch = Orchestrator(RunConfig(steps=STEPS, max_staleness=1), out)
        try:
            orch.run()
        finally:
            orch.close()

    benchmark.pedantic(one_run, rounds=1, iterations=1)
    records = read_jsonl(out / "run.jsonl")
    rows = [
        {
            "step": r["step"],
            "wall_s": r["orchestration"]["wall_s"],
            "overhead_s": r["orchestration"]["overhead_s"],
            "planning_s": r["orchestration"]["planning_s"],
            "overhead_share": r["orchestration"]["overhead_s"] / max(r["orchestration"]["wall_s"], 1e-9),
        }
        for r in records
    ]
    benchmark.extra_info["steps"] = rows
    total_wall = sum(r["wall_s"] for r in rows[1:]) or 1e-9  # step 0 includes engine start-up
    benchmark.extra_info["overhead_share_after_step0"] = sum(r["overhead_s"] for r in rows[1:]) / total_wall
    for r in rows:
        print(
            f"step {r['step']}: wall {r['wall_s']:.2f} s, overhead {r['overhead_s']:.3f} s "
            f"({100 * r['overhead_share']:.2f} %), planning {r['planning_s']:.3f} s"
        )
