"""Simulator speed, old against new in the same run: CPU seconds of one simulation in two or more git revisions
(or source trees), run in turn round by round in fresh processes, and whether their reports are identical.

    python benchmarks/sim_compare.py HEAD~3 HEAD                             # default scenario, 3 policies, 2 steps
    python benchmarks/sim_compare.py 5221dc7 HEAD --scenario big --steps 3 --policies all --rounds 1

A revision is exported with `git archive` into a temporary directory; a path to a source tree is used as it is.
Reports the best CPU time of the rounds for each (on a shared machine the best is the least disturbed) and the
ratio to the first. `--scenario default`: 48 x A800, Qwen3-14B, r2e-gym 512 x 16; `big`: 1,024 GPUs, 4,096 x 16
(`benchmarks/bench_sim.py`). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = r"""
import json, sys, time
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
    json.dump({"cpu": cpu, "report": data}, f, sort_keys=True)
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
    p.add_argument("--scenario", choices=("default", "big"), default="default")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--policies", default="colocated,static-uniform,libra", help="comma-separated, or all")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if len(args.revs) < 2 or args.steps < 1 or args.rounds < 1:
        print("error: give at least two revisions, --steps >= 1 and --rounds >= 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            trees = [_tree(r, tmp) for r in args.revs]
        except subprocess.CalledProcessError as e:
            print(f"error: git archive failed: {e.stderr.decode().strip()}", file=sys.stderr)
            return 2
        cpu: dict[int, list[float]] = {i: [] for i in range(len(trees))}
        reports: dict[int, dict] = {}
        for r in range(args.rounds):
            for i, tree in enumerate(trees):
                out = tmp / f"out{i}.json"
                cmd = [sys.executable, "-c", _RUN, args.scenario, str(args.steps), args.policies, str(out)]
                subprocess.run(cmd, cwd=tree, env={"PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}, check=True)
                got = json.loads(out.read_text())
                cpu[i].append(got["cpu"])
                reports[i] = got["report"]
                print(f"round {r}: {args.revs[i]} {got['cpu']:.2f} s CPU", flush=True)
        base = min(cpu[0])
        for i, rev in enumerate(args.revs):
            same = "baseline" if i == 0 else ("identical" if reports[i] == reports[0] else "DIFFERENT")
            print(f"{rev}: best {min(cpu[i]):.2f} s CPU, baseline / this {base / min(cpu[i]):.3f}, report {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
