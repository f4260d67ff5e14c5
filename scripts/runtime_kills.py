"""Seeded engine kills of `libra run`: N runs, each SIGKILLs the engine of one busy rollout instance at a seeded
random moment (a random engine poll of a random step), and reports per run the steps completed and the
trajectories lost, duplicated and re-queued, checked from the run's own records (run.jsonl and trace.jsonl).

    python scripts/runtime_kills.py [--seeds 20] [--first-seed 0] [--steps 2] [--out out/runtime_kills] [--json]
                                    [--ray [--kill-actor]]

`--ray`: the engines run in Ray actors of a local Ray (`libra run --ray`); `--kill-actor` SIGKILLs the victim's
actor process instead of its engine core.

The runs share one set of live engines (each run adopts them, as `libra run` does its own), so a run costs its
steps plus the restart of the killed engine. The config is the embedded default without the workload shift (the
2 instances of its placement stay: a kill always has a live instance to re-queue on). Writes OUT/kills.json
(atomically) and each run's records in OUT/seed-N/. Exit code 1 if any run lost or duplicated a trajectory or
did not complete every step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLUMNS = ("seed", "kill_step", "kill_poll", "victim", "steps", "finished", "lost", "duplicated", "requeued", "wall_s")


class _ActorView:
    """The orchestrator as `EngineKiller` sees it with --kill-actor: an instance's "engine" is its Ray actor's
    process, so the kill is an actor death (`RayRolloutBackend.actor_pid`)."""

    def __init__(self, orch) -> None:
        self.rolling_step, self.backend = orch.rolling_step, _ActorPids(orch.backend)


class _ActorPids:
    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def engine_pids(self, name: str) -> tuple[int, ...]:
        return (self._backend.actor_pid(name),)


def one_run(seed: int, steps: int, out: Path, backend, model: str, kill_actor: bool = False) -> dict:
    import random

    from libra.runtime import Orchestrator, RunConfig
    from libra.runtime.faults import EngineKiller
    from libra.runtime.records import read_jsonl

    kill_step = random.Random(seed).randrange(steps)
    killer = EngineKiller(seed=seed, steps=(kill_step,))
    config = RunConfig(steps=steps, max_staleness=1, model=model, shift=None)
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    hook = (lambda orch: killer(_ActorView(orch))) if kill_actor else killer
    orch = Orchestrator(config, out, on_poll=hook, backend=backend)
    error = None
    try:
        orch.run()
    except Exception as exc:  # noqa: BLE001 - a failed run is a result of the sweep
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        orch.close()
    records = read_jsonl(out / "run.jsonl")
    trace = read_jsonl(out / "trace.jsonl")
    keys = [(t["step"], t["request_id"]) for t in trace]
    return {
        "seed": seed,
        "kill_step": kill_step,
        "kill_poll": killer.killed_at_poll.get(kill_step),
        "victim": killer.killed[0][1] if killer.killed else None,
        "steps": len(records),
        "finished": len(set(keys)),
        # lost: expected trajectories of the completed steps missing from the trace; the records count them too
        "lost": config.batch_size * len(records) - len(set(keys)),
        "duplicated": len(keys) - len(set(keys)) + sum(r["trajectories"]["duplicated"] for r in records),
        "requeued": sum(r["trajectories"]["requeued"] for r in records),
        "retried": sum(r["trajectories"]["retried"] for r in records),
        "records_lost": sum(r["trajectories"]["lost"] for r in records),
        "wall_s": round(time.perf_counter() - t0, 1),
        "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="number of seeded runs (default 20)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2, help="steps per run (default 2; the kill is in one of them)")
    parser.add_argument("--out", default="out/runtime_kills", help="report directory (default out/runtime_kills)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--ray", action="store_true", help="engines in Ray actors of a local Ray")
    parser.add_argument("--kill-actor", action="store_true", help="with --ray: kill the actor, not the engine")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        print("runtime_kills: --seeds and --steps must be >= 1", file=sys.stderr)
        return 2
    if args.kill_actor and not args.ray:
        print("runtime_kills: --kill-actor needs --ray (without Ray an engine has no actor to kill)", file=sys.stderr)
        return 2

    from tqdm import tqdm

    from libra.adapters.tiny_model import build_tiny_model
    from libra.runtime import RunConfig, make_backend
    from libra.runtime.config import RaySettings
    from libra.runtime.records import write_atomic

    base = RunConfig(ray=RaySettings() if args.ray else None)

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"runtime_kills: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    model = tempfile.mkdtemp(prefix="libra-kills-model-")
    build_tiny_model(model, seed=RunConfig().seed)
    saved_stdout = os.dup(1)  # engines log to stdout: keep it for the table
    os.dup2(2, 1)
    runs: list[dict] = []
    backend = make_backend(base, model)
    try:
        for seed in tqdm(range(args.first_seed, args.first_seed + args.seeds), desc="kills", file=sys.stderr):
            run = one_run(seed, args.steps, out / f"seed-{seed}", backend, model, kill_actor=args.kill_actor)
            runs.append(run)
            if run["error"] is not None:  # start again on fresh engines
                backend.shutdown()
                backend = make_backend(base, model)
            report = {"steps_per_run": args.steps, "runs": runs}
            write_atomic(out / "kills.json", json.dumps(report, indent=1).encode())
    finally:
        backend.shutdown()
        shutil.rmtree(model, ignore_errors=True)
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
    ok = [
        r["error"] is None and r["steps"] == args.steps and r["lost"] == r["records_lost"] == 0 and r["duplicated"] == 0
        for r in runs
    ]
    summary = {
        "runs": len(runs),
        "ok": sum(ok),
        "killed": sum(r["victim"] is not None for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "duplicated": sum(r["duplicated"] for r in runs),
        "steps_completed": sum(r["steps"] for r in runs),
        "steps_expected": args.steps * len(runs),
    }
    if args.json:
        print(json.dumps({**summary, "per_run": runs}))
    else:
        print(" | ".join(COLUMNS))
        for r in runs:
            cells = " | ".join("-" if r[c] is None else str(r[c]) for c in COLUMNS)
            print(cells + (f"  ERROR {r['error']}" if r["error"] else ""))
        print(json.dumps(summary))
    return 0 if all(ok) else 1


if __name__ == "__main__":  # vLLM spawns its workers: the guard is required
    raise SystemExit(main())
