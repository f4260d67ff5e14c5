"""Placement speed: 48, 128, 1024 and 8192 GPUs (8-GPU nodes), fresh and replanning from a current placement.

Run: `python -m pytest benchmarks/bench_placement.py -o python_files='bench_*.py' --benchmark-only`
(`--benchmark-columns=min,median,max,rounds`). Measures only; nothing here asserts a time.

Scenarios per size `n`:
- `fresh`: training TP-4 x PP-2 on half the GPUs, rollout TP-1/2/4/8 on the rest (a mix like the planner's).
- `replan`: the same cluster replanned with 1/8 of the rollout GPUs moved to training, from the fresh placement.
- `replan-spanning`: training TP-4 x PP-3 (12-GPU replicas span nodes, so their nodes are modelled one by one),
  replanned after growing training by 1/8.
"""

from __future__ import annotations

import pytest

from libra.planning.placement import solve_placement
from libra.spec import ClusterSpec, InstanceGroup, Placement, Plan, RolloutConfig, TrainConfig, get_gpu

A800 = get_gpu("A800-80GB")
SIZES = (48, 128, 1024, 8192)


def make_plan(tp: int, pp: int, dp: int, instances: list[tuple[int, int]]) -> Plan:
    groups = tuple(InstanceGroup(tp=t, count=c, max_tokens=1000.0 * (i + 1)) for i, (t, c) in enumerate(instances))
    return Plan(
        train=TrainConfig(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp),
        rollout=RolloutConfig(num_gpus=sum(t * c for t, c in instances), time_s=1.0, instances=groups),
        makespan_s=1.0,
    )


def mixed_plan(num_gpus: int, tp: int, pp: int, train_gpus: int) -> Plan:
    """Training on `train_gpus` (rounded down to whole replicas), rollout split 1/4 each over TP-1/2/4/8."""
    dp = train_gpus // (tp * pp)
    quarter = (num_gpus - dp * tp * pp) // 4
    return make_plan(tp, pp, dp, [(1, quarter), (2, quarter // 2), (4, quarter // 4), (8, quarter // 8)])


def scenario(num_gpus: int, kind: str) -> tuple[Plan, ClusterSpec, Placement | None]:
    cluster = ClusterSpec(gpu=A800, num_nodes=num_gpus // 8, gpus_per_node=8)
    tp, pp = (4, 3) if kind == "replan-spanning" else (4, 2)
    first = mixed_plan(num_gpus, tp, pp, num_gpus // 2)
    if kind == "fresh":
        return first, cluster, None
    current = solve_placement(first, cluster, time_limit_s=60.0).placement
    return mixed_plan(num_gpus, tp, pp, num_gpus // 2 + num_gpus // 8), cluster, current


@pytest.mark.parametrize("kind", ["fresh", "replan", "replan-spanning"])
@pytest.mark.parametrize("num_gpus", SIZES)
def test_place(benchmark, num_gpus: int, kind: str) -> None:
    plan, cluster, current = scenario(num_gpus, kind)
    result = benchmark(solve_placement, plan, cluster, current=current, time_limit_s=60.0)
    benchmark.extra_info.update(
        moves=result.cost.moves, train_nodes=result.cost.train_nodes, nodes=result.cost.nodes, optimal=result.optimal
    )
    assert result.optimal
