"""Planner speed, old against new in the same run: CPU time of a cold `GlobalPlanner(...).plan(profile)` (the
`bench_planner.py` setup: Qwen3-14B on 8-GPU A800 nodes, an r2e-gym step of 8,192 requests) in two or more git
revisions or source trees, run in turn round by round in fresh processes, and whether their plans are identical.

    python benchmarks/planner_compare.py 616dbdd . --gpus 1024 --rounds 5 --plans 5

A revision is exported with `git archive` into a temporary directory; a path is used as it is. Each process runs
from inside its own tree with only that tree on PYTHONPATH (pytest's `pythonpath = ["."]`, or `python -c` started in
a worktree, would import the worktree's code whatever PYTHONPATH says). Reports the best CPU time over rounds x plans
for each and the ratio to the first. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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


def _tree(rev: str, tmp: Path) -> Path:
    if Path(rev).is_dir():
        return Path(rev).resolve()
    dest = tmp / rev.replace("/", "_").replace("~", "-")
    dest.mkdir()
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


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
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            trees = [_tree(r, tmp) for r in args.revs]
        except subprocess.CalledProcessError as e:
            print(f"error: git archive failed: {e.stderr.decode().strip()}", file=sys.stderr)
            return 2
        cpu: dict[int, list[float]] = {i: [] for i in range(len(trees))}
        plans: dict[int, str] = {}
        for r in range(args.rounds):
            for i, tree in enumerate(trees):
                out = tmp / f"out{i}.json"
                cmd = [sys.executable, "-c", _RUN, str(args.gpus), str(args.plans), str(out)]
                env = {"PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
                subprocess.run(cmd, cwd=tree, env=env, check=True)
                got = json.loads(out.read_text())
                if not got["file"].startswith(str(tree)):
                    print(f"error: {args.revs[i]} imported {got['file']}", file=sys.stderr)
                    return 2
                cpu[i].append(got["cpu"])
                plans[i] = got["plan"]
                load = os.getloadavg()[0]
                print(f"round {r}: {args.revs[i]} {got['cpu'] * 1e3:.1f} ms CPU (load {load:.1f})", flush=True)
        base = min(cpu[0])
        for i, rev in enumerate(args.revs):
            same = "baseline" if i == 0 else ("identical" if plans[i] == plans[0] else "DIFFERENT")
            print(f"{rev}: best {min(cpu[i]) * 1e3:.1f} ms CPU, baseline / this {base / min(cpu[i]):.3f}, plan {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
