"""Planner scenarios whose plans are pinned in `data/golden_plans.json` (computed by the planner before the
speed work of issue 16, commit 7d97385). Regenerate ONLY for an intended change of the plans:
`python -m tests.planning.golden_scenarios` (writes the file)."""

from __future__ import annotations

import json
from pathlib import Path

from libra.planning import GlobalPlanner, PlannerOptions
from libra.spec import ClusterSpec, Plan, get_gpu, get_model
from libra.workloads import profile_from_trajectories
from libra.workloads.generators import WorkloadGenerator

GOLDEN = Path(__file__).parent / "data" / "golden_plans.json"

# name -> (workload, gpu, model, gpus, num_gpus for the call or None, routing, tp_degrees or None)
SCENARIOS: dict[str, tuple] = {
    "r2e-14b-a800-16": ("r2e-gym", "A800-80GB", "Qwen3-14B", 16, None, "start-small", None),
    "r2e-14b-a800-48": ("r2e-gym", "A800-80GB", "Qwen3-14B", 48, None, "start-small", None),
    "r2e-14b-a800-128": ("r2e-gym", "A800-80GB", "Qwen3-14B", 128, None, "start-small", None),
    "r2e-14b-a800-1024": ("r2e-gym", "A800-80GB", "Qwen3-14B", 1024, None, "start-small", None),
    "r2e-14b-a800-1024-replan-1000": ("r2e-gym", "A800-80GB", "Qwen3-14B", 1024, 1000, "start-small", None),
    "r2e-14b-a800-128-final-length": ("r2e-gym", "A800-80GB", "Qwen3-14B", 128, None, "final-length", None),
    "r2e-14b-a800-64-tp12": ("r2e-gym", "A800-80GB", "Qwen3-14B", 64, None, "start-small", (1, 2)),
    "search-4b-h100-32": ("search-r1", "H100-80GB", "Qwen3-4B", 32, None, "start-small", None),
    "dapo-7b-a100-96": ("dapo-math", "A100-80GB", "Qwen2.5-7B", 96, None, "start-small", None),
    "dapo-7b-a100-96-final-length": ("dapo-math", "A100-80GB", "Qwen2.5-7B", 96, None, "final-length", None),
    "r2e-moe-h200-64": ("r2e-gym", "H200", "Qwen3-30B-A3B", 64, None, "start-small", None),
    "search-70b-h100-256": ("search-r1", "H100-80GB", "Llama-3-70B", 256, None, "start-small", None),
}
SLOW_SCENARIOS: dict[str, tuple] = {
    "r2e-14b-a800-8192": ("r2e-gym", "A800-80GB", "Qwen3-14B", 8192, None, "start-small", None),
}


def _profile(workload: str):
    return profile_from_trajectories(WorkloadGenerator(workload, seed=0, num_prompts=512).step(0), name=workload)


def solve(scenario: tuple) -> Plan:
    workload, gpu, model, gpus, num_gpus, routing, tps = scenario
    cluster = ClusterSpec.from_total(gpu=get_gpu(gpu), num_gpus=gpus, gpus_per_node=8)
    planner = GlobalPlanner(cluster=cluster, model=get_model(model), options=PlannerOptions(routing=routing))
    return planner.plan(_profile(workload), num_gpus=num_gpus, tp_degrees=tps)


def plan_record(plan: Plan) -> dict:
    """The plan as JSON-ready data, without the solve time (not part of the plan)."""
    data = plan.to_dict()
    data.pop("solve_time_s")
    return json.loads(json.dumps(data))  # floats round-trip exactly through repr


if __name__ == "__main__":
    records = {name: plan_record(solve(s)) for name, s in {**SCENARIOS, **SLOW_SCENARIOS}.items()}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(records)} plans to {GOLDEN}")
