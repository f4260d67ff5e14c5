"""How much one many-turn rollout depends on the simulator's time slice (docs/sim.md, "Many-turn agents").

    python examples/sim_slicing.py                          # steal off, new, all at 10x coarser .. 30x finer
    python examples/sim_slicing.py --steal off --factors 1,0.1

One step of 64 prompts x 16 synthetic many-turn trajectories (`libra.sim.manyturn.many_turn_pool`, seed 2; the
longest 145 turns) on 12 TP-2 instances of Qwen3-14B on A800-80GB, the slice a 300th of the rollout's lower bound
(`rollout_floor_s`) times each factor. Prints the rollout's end time per admission mode and factor.
"""

from __future__ import annotations

import argparse
import sys

from libra.planning.cost import CostModel
from libra.sim.engine import rollout_floor_s
from libra.sim.manyturn import many_turn_pool
from libra.sim.rollout import Instances, RolloutRun
from libra.sim.routing import routes_for
from libra.sim.states import STEAL_MODES
from libra.sim.workload import step_work
from libra.spec import ClusterSpec, get_gpu, get_model, parse_buckets


def rollout_s(cm: CostModel, work, slice_s: float, steal: str, instances: int = 12) -> float:
    routes = routes_for("single", work, parse_buckets("2:inf"), None)
    run = RolloutRun(
        cm,
        work,
        routes,
        Instances([2] * instances, [0] * instances, [0.0] * instances),
        start=0.0,
        min_slice_s=slice_s,
        steal=steal,
    )
    run.run_to_end()
    return run.end_time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steal", default="off,new,all", help="comma-separated admission modes (off, new, all)")
    p.add_argument("--factors", default="10,1,0.1,0.0333", help="slice multipliers, comma-separated")
    args = p.parse_args(argv)
    try:
        steals = args.steal.split(",")
        factors = [float(f) for f in args.factors.split(",")]
    except ValueError:
        print(f"error: --factors must be comma-separated numbers, got {args.factors!r}", file=sys.stderr)
        return 2
    bad = [s for s in steals if s not in STEAL_MODES]
    if bad or min(factors) <= 0:
        print(f"error: steal modes must be among {', '.join(STEAL_MODES)} and factors > 0", file=sys.stderr)
        return 2
    cm = CostModel(
        ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=24, gpus_per_node=8), get_model("Qwen3-14B")
    )
    work = step_work(0, many_turn_pool(64, 16, seed=2))
    floor = rollout_floor_s(cm, work, Instances([2] * 12, [0] * 12, [0.0] * 12)) / 300
    print(f"default slice {floor:.2f} s")
    print("| steal | " + " | ".join(f"x{f:g} ({floor * f:.2f} s)" for f in factors) + " |")
    print("|---|" + "---:|" * len(factors))
    for steal in steals:
        row = [rollout_s(cm, work, floor * f, steal) for f in factors]
        print(f"| {steal} | " + " | ".join(f"{x:,.1f} s" for x in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
