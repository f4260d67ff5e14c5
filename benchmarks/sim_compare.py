"""Simulator speed, old against new in the same run: CPU seconds of one simulation in two or more git revisions
(or source trees), run in turn round by round in fresh processes, and whether their reports are identical.

    python benchmarks/sim_compare.py HEAD~3 HEAD                             # default scenario, 3 policies, 2 steps
    python benchmarks/sim_compare.py 5221dc7 HEAD --scenario big --steps 3 --policies all --rounds 1

A revision is exported with `git archive` into a temporary directory; a path to a source tree is used as it is;
each runs in its own process with only its tree importable (`benchmarks/revisions.py`). Reports the best CPU time of
the rounds for each (on a shared machine the best is the least disturbed) and the ratio to the first.
`--scenario default`: 48 x A800, Qwen3-14B, r2e-gym 512 x 16; `big`: 1,024 GPUs, 4,096 x 16
(`benchmarks/bench_sim.py`). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import sys

from revisions import compare  # benchmarks/revisions.py, next to this script

_RUN = r"""
import json, sys, time
import libra
from benchmarks.bench_sim import _scenario
from libra.sim import POLICY_NAMES, simulate
scenario, steps, policies, out = sys.argv[1:5]
sc = _scenario(gpus=48, prompts=512) if scenario == "default" else _scenario(gpus=1024, prompts=4096)
names = POLICY_NAMES if policies == "all" else policies.split(",")
t0 = time.process_time()
report = simulate(sc, num_steps=int(steps), policies=names, workers=1)
cpu = time.process_time() - t0
data = report.to_dict()
data.pop("elapsed_s")
with open(out, "w") as f:
    json.dump({"cpu": cpu, "report": data, "file": libra.__file__}, f, sort_keys=True)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions or source-tree paths; the first is the baseline")
    p.add_argument("--scenario", choices=("default", "big"), default="default")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--policies", default="colocated,static-uniform,libra", help="comma-separated, or all")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if len(args.revs) < 2 or args.steps < 1 or args.rounds < 1:
        print("error: give at least two revisions, --steps >= 1 and --rounds >= 1", file=sys.stderr)
        return 2
    return compare(
        args.revs, _RUN, [args.scenario, str(args.steps), args.policies], rounds=args.rounds, result="report"
    )


if __name__ == "__main__":
    sys.exit(main())
