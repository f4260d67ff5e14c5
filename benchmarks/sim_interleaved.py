"""Simulator speed, old against new interleaved policy by policy in one process (a loaded machine slows both
alike): each policy simulated alone for `--steps` steps by the old code and by this tree's, taking turns to go
first, CPU time of each, and whether the two reports are identical.

    PYTHONPATH=$PWD nice -n 19 python benchmarks/sim_interleaved.py 12e3af9 --steps 2 --rounds 1
    PYTHONPATH=$PWD nice -n 19 python benchmarks/sim_interleaved.py 12e3af9 --scenario big --steps 1

The old revision is exported (`benchmarks/revisions.py`) and imported as `libra_old`. Each run includes the step's
generation and the policy's first plan. Prints per run the CPU seconds and old / new, then the median ratio and
the ratio of the totals, with the load average. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from revisions import RevisionError, export_tree, import_renamed  # benchmarks/revisions.py, next to this script


def _scenario(pkg, big: bool):
    import importlib

    sim, spec = importlib.import_module(f"{pkg.__name__}.sim"), importlib.import_module(f"{pkg.__name__}.spec")
    gpus, prompts = (1024, 4096) if big else (48, 512)
    source = sim.WorkSource.from_generator(
        "r2e-gym", seed=0, num_prompts=prompts, samples_per_prompt=16, max_model_len=40960
    )
    cluster = spec.ClusterSpec.from_total(gpu=spec.get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8)
    return sim, sim.Scenario(
        cluster=cluster, model=spec.get_model("Qwen3-14B"), rl=spec.RLSettings(num_prompts=prompts), source=source
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("old", help="git revision or source-tree path of the old code")
    p.add_argument("--scenario", choices=("default", "big"), default="default")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--policies", default="all", help="comma-separated, or all")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        print("error: give --steps >= 1 and --rounds >= 1", file=sys.stderr)
        return 2
    import libra
    from libra.sim import POLICY_NAMES

    names = list(POLICY_NAMES) if args.policies == "all" else args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            old = import_renamed(export_tree(args.old, tmp), tmp / "pkg")
        except RevisionError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        sides = {"old": _scenario(old, args.scenario == "big"), "new": _scenario(libra, args.scenario == "big")}
        ratios, total, same = [], {"old": 0.0, "new": 0.0}, True
        for r in range(args.rounds):
            for policy in names:
                cpu, report = {}, {}
                for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    sim, scenario = sides[side]
                    t0 = time.process_time()
                    got = sim.simulate(scenario, num_steps=args.steps, policies=[policy], workers=1)
                    cpu[side] = time.process_time() - t0
                    total[side] += cpu[side]
                    data = got.to_dict()
                    data.pop("elapsed_s")
                    report[side] = json.dumps(data, sort_keys=True)
                same &= report["old"] == report["new"]
                ratios.append(cpu["old"] / cpu["new"])
                load = Path("/proc/loadavg").read_text().split()[0]
                print(
                    f"{r} {policy:18s} old {cpu['old']:6.2f} s  new {cpu['new']:6.2f} s  old/new {ratios[-1]:.3f}  "
                    f"report {'identical' if report['old'] == report['new'] else 'DIFFERENT'}  load {load}",
                    flush=True,
                )
    print(
        f"median old/new {statistics.median(ratios):.3f}, totals {total['old']:.2f} / {total['new']:.2f} s = "
        f"{total['old'] / total['new']:.3f}, reports {'identical' if same else 'DIFFERENT'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
