"""Planner speed, old against new in the same run: CPU time of a cold `GlobalPlanner(...).plan(profile)` (the
`bench_planner.py` setup: Qwen3-14B on 8-GPU A800 nodes, an r2e-gym step of 8,192 requests) in two or more git
revisions or source trees, run in turn round by round in fresh processes, and whether their plans are identical.

    python benchmarks/planner_compare.py 616dbdd . --gpus 1024 --rounds 5 --plans 5

A revision is exported with `git archive` into a temporary directory; a path is used as it is; each runs in its own
process from inside its own tree with only that tree importable (`benchmarks/revisions.py`). Reports the best CPU
time over rounds x plans for each and the ratio to the first. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import sys

from revisions import compare  # benchmarks/revisions.py, next to this script

_RUN = r"""
import json, sys, time
import attrs
import libra
from libra.planning import GlobalPlanner
from libra.spec import ClusterSpec, get_gpu, get_model
from libra.workloads import profile_from_trajectories
from libra.workloads.generators import WorkloadGenerator
gpus, plans, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
profile = profile_from_trajectories(WorkloadGenerator("r2e-gym", seed=0, num_prompts=512).step(0), name="r2e-gym")
def plan():
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8)
    return GlobalPlanner(cluster=cluster, model=get_model("Qwen3-14B")).plan(profile)
first = plan()  # warm-up
times = []
for _ in range(plans):
    t0 = time.process_time()
    plan()
    times.append(time.process_time() - t0)
with open(out, "w") as f:
    json.dump({"cpu": min(times), "plan": repr(attrs.evolve(first, solve_time_s=0.0)), "file": libra.__file__}, f)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions or source-tree paths; the first is the baseline")
    p.add_argument("--gpus", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--plans", type=int, default=5, help="timed plans per process (after one warm-up plan)")
    args = p.parse_args(argv)
    if len(args.revs) < 2 or args.gpus < 16 or args.rounds < 1 or args.plans < 1:
        print("error: give at least two revisions, --gpus >= 16, --rounds >= 1 and --plans >= 1", file=sys.stderr)
        return 2
    run = [str(args.gpus), str(args.plans)]
    return compare(args.revs, _RUN, run, rounds=args.rounds, result="plan", scale=1e3, unit="ms")


if __name__ == "__main__":
    sys.exit(main())
