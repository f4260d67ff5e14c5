"""Orchestration overhead of `libra run` (pytest-benchmark): wall time of the orchestrator's thread not spent
inside engines, tools, waiting for the trainer, pushing weights or starting/stopping engines, per step.

    python -m pytest benchmarks/bench_runtime.py --benchmark-only -p no:cacheprovider

One run of the embedded default (`RunConfig()`, 4 steps, max_staleness 1) on real engines. The overhead includes
Libra's own decisions (profile, replan, placement, router) and the bookkeeping (records, checkpoints). Reported in
`extra_info`: per step, the overhead in seconds and as a share of the step's wall time, and the planning part;
the target is < 2 % of step time. `LIBRA_BENCH_RUN_STEPS` changes the number of steps. Nothing here asserts a time.

The same summary of runs already made (their `run.jsonl`, e.g. the runs of `scripts/runtime_kills.py`):

    python benchmarks/bench_runtime.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from libra.runtime.records import read_jsonl

if __name__ != "__main__":
    import pytest

    pytest.importorskip("vllm")

STEPS = int(os.environ.get("LIBRA_BENCH_RUN_STEPS", 4))


def test_orchestration_overhead_per_step(benchmark, tmp_path) -> None:
    out = tmp_path / "run"

    from libra.runtime import Orchestrator, RunConfig

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


def overhead_summary(run_dirs: list[str]) -> dict[str, float]:
    """Orchestration overhead over the step records of `run_dirs`: its share of all wall time and of the wall time
    without engine starts/stops (`switching`), the largest share of one step (without them), the step count."""
    records = [r for d in run_dirs for r in read_jsonl(Path(d) / "run.jsonl")]
    rows = [r["orchestration"] for r in records]
    bare = [max(o["wall_s"] - r["phases_s"].get("switching", 0.0), 1e-9) for o, r in zip(rows, records)]
    wall = sum(r["wall_s"] for r in rows) or 1e-9
    overhead = sum(r["overhead_s"] for r in rows)
    return {
        "steps": len(rows),
        "wall_s": round(wall, 2),
        "switching_s": round(wall - sum(bare), 2),
        "overhead_s": round(overhead, 3),
        "overhead_share": overhead / wall,
        "overhead_share_without_switching": overhead / (sum(bare) or 1e-9),
        "max_step_share_without_switching": max((o["overhead_s"] / b for o, b in zip(rows, bare)), default=0.0),
        "checkpoint_s": round(sum(r["checkpoint_s"] for r in rows), 3),
        "planning_s": round(sum(r["planning_s"] for r in rows), 3),
    }


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python benchmarks/bench_runtime.py RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        raise SystemExit(2)
    summary = overhead_summary(sys.argv[1:])
    print(
        f"{summary['steps']} steps, wall {summary['wall_s']} s ({summary['switching_s']} s starting/stopping "
        f"engines), overhead {summary['overhead_s']} s: {100 * summary['overhead_share']:.2f} % of the wall time, "
        f"{100 * summary['overhead_share_without_switching']:.2f} % without engine starts (largest step "
        f"{100 * summary['max_step_share_without_switching']:.2f} %); checkpoint {summary['checkpoint_s']} s, "
        f"planning {summary['planning_s']} s"
    )
