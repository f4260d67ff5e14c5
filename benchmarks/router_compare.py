"""Old against new `on_tool_return`, interleaved call by call in one process (a loaded machine slows both alike).

    git archive main | tar -x -C /tmp/old            # the old code, unpacked
    PYTHONPATH=$PWD nice -n 19 python benchmarks/router_compare.py /tmp/old --presets adaptive,published --reps 2

The old package is copied to a temporary folder as `libra_old` (its imports rewritten) and imported next to this
worktree's `libra`. For each workload and preset both routers' trees learn the same four synthetic steps of 512 x 16
trajectories (`tree.update`, as benchmarks/bench_router.py does); then round by round each router gets the same next
tool return (the request walked down to it untimed, as there), timed with `perf_counter_ns`, old and new taking
turns to go first. Prints the median of each and the median of the per-call ratios new / old, with the load average.
Every decision of both routers (the untimed walks' included) and what they keep per request (the budget's decision
points, the shrinkage fit's records) are compared: any difference is printed and the exit status is 1.

`--opcodes` counts instead the Python bytecode instructions each timed call executes (`sys.settrace` opcode events,
the router's own frames and what they call): a measure the machine's load does not move.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

SPEC = {"search-r1": "2:5000,4:15000,8:inf", "r2e-gym": "1:4000,2:12000,4:30000,8:inf"}


def _import_old(root: Path, into: Path):
    dst = into / "libra_old"
    shutil.copytree(root / "libra", dst)
    pattern = re.compile(r"\b(from|import) libra\b")
    for path in dst.rglob("*.py"):
        text = path.read_text()
        path.write_text(pattern.sub(r"\1 libra_old", text).replace('"libra.', '"libra_old.'))
    sys.path.insert(0, str(into))
    import libra_old.scheduling
    import libra_old.spec
    import libra_old.workloads.generators

    return libra_old


def _side(pkg, workload: str, preset: str, learnt_by_router: bool = False):
    gen = pkg.workloads.generators.WorkloadGenerator(workload, seed=0, num_prompts=512)
    *learnt, current = [gen.step(s) for s in range(5)]
    sched = pkg.scheduling
    router = sched.make_router("cmlfq", pkg.spec.parse_buckets(SPEC[workload]), **sched.CMLFQ_PRESETS[preset])
    if learnt_by_router:  # through the router contract: its step-end fits run (bench_router.py's `-learnt` case)
        import importlib

        importlib.import_module(f"{pkg.__name__}.scheduling.evaluate").replay(router, [t for s in learnt for t in s])
    else:
        for step in learnt:
            router.tree.update(step)
    cases = itertools.cycle([(t, k) for t in current for k, turn in enumerate(t.turns) if turn.tool is not None])
    return router, cases, [], []


def _key(d) -> tuple:
    return (d.request_id, d.bucket, d.migrate, d.from_bucket, d.migrated_tokens, d.reason)


def _books(router) -> tuple:
    """What a router keeps besides its decisions: its price and prior strength, and per request in flight its
    budget decision points (floats: a change of the shares that flips no decision still shows) and fit records."""
    reqs = [(r.bucket, r.migrations, r.state.points, r.state.calib) for r in router._requests.values()]
    return router.price, router.shrink, reqs


def _count_opcodes(call, *args, **kwargs):
    """`call(*args, **kwargs)` and the number of bytecode instructions it executed."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        out = call(*args, **kwargs)
    finally:
        sys.settrace(None)
    return out, count


def _one(router, cases, times, decisions, rid: int, timed: bool, opcodes: bool = False) -> None:
    traj, k = next(cases)
    call = router.on_tool_return
    decisions.append(_key(router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)))
    for j in range(k):
        turn = traj.turns[j]
        d = call(
            rid,
            tool=turn.tool,
            tool_tokens=turn.tool_tokens,
            status=turn.tool_status,
            context_tokens=traj.context_after(j + 1),
        )
        decisions.append(_key(d))
    turn = traj.turns[k]
    kw = {"tool": turn.tool, "tool_tokens": turn.tool_tokens, "status": turn.tool_status}
    ctx = traj.context_after(k + 1)
    if opcodes:
        d, n = _count_opcodes(call, rid, context_tokens=ctx, **kw)
        if timed:
            times.append(n)
    else:
        t0 = time.perf_counter_ns()
        d = call(rid, context_tokens=ctx, **kw)
        t1 = time.perf_counter_ns()
        if timed:
            times.append(t1 - t0)
    decisions.append(_key(d))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="an unpacked tree of the old code (holding libra/)")
    ap.add_argument("--presets", default="adaptive,published,priced,accuracy")
    ap.add_argument("--workloads", default="search-r1,r2e-gym")
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--learnt", action="store_true", help="the routers learn the four steps through replay()")
    ap.add_argument("--opcodes", action="store_true", help="count bytecode instructions per call instead of time")
    args = ap.parse_args()
    import libra
    import libra.scheduling
    import libra.spec
    import libra.workloads.generators

    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        old = _import_old(args.old, Path(tmp))
        print(f"new {Path(libra.__file__).parent}, old {args.old / 'libra'}")
        for rep in range(args.reps):
            for workload in args.workloads.split(","):
                for preset in args.presets.split(","):
                    sides = [_side(pkg, workload, preset, args.learnt) for pkg in (old, libra)]
                    for r in range(args.rounds + 100):  # 100 warm-up rounds
                        for side in sides if r % 2 == 0 else sides[::-1]:
                            _one(*side, rid=r, timed=r >= 100, opcodes=args.opcodes)
                    (r_old, _, a, d_old), (r_new, _, b, d_new) = sides
                    same = d_old == d_new and _books(r_old) == _books(r_new)
                    if not same:
                        differ += 1
                        first = next((i for i, (x, y) in enumerate(zip(d_old, d_new)) if x != y), None)
                        print(f"DECISIONS DIFFER: {workload} {preset}, first at call {first}", flush=True)
                    ratio = statistics.median(y / x for x, y in zip(a, b))
                    load = Path("/proc/loadavg").read_text().split()[0]
                    if args.opcodes:
                        print(
                            f"{rep} {workload:10s} {preset:10s} opcodes a call: old median {statistics.median(a):.0f} "
                            f"mean {statistics.mean(a):.1f}  new median {statistics.median(b):.0f} mean "
                            f"{statistics.mean(b):.1f}  per-call new/old {ratio:.3f}  "
                            f"{len(d_new)} decisions {'identical' if same else 'DIFFER'}",
                            flush=True,
                        )
                        continue
                    print(
                        f"{rep} {workload:10s} {preset:10s} old {statistics.median(a) / 1e3:6.2f} us  "
                        f"new {statistics.median(b) / 1e3:6.2f} us  per-call new/old {ratio:.3f}  load {load}  "
                        f"{len(d_new)} decisions {'identical' if same else 'DIFFER'}",
                        flush=True,
                    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
