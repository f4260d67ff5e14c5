"""`libra trace generate`: write a synthetic agentic trace (JSON Lines, the trace schema of DESIGN.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from libra.cli._common import CLIError, emit_json, key_values, log
from libra.workloads import WORKLOAD_NAMES, generate, write_trace


def _add_generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="search-r1", help=f"one of {', '.join(WORKLOAD_NAMES)} (default search-r1)")
    p.add_argument("--steps", type=int, default=1, help="RL steps to generate (default 1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--prompts", type=int, default=64, help="prompts per step (default 64)")
    p.add_argument("--samples", type=int, default=16, help="samples per prompt (default 16)")
    p.add_argument("--start-step", type=int, default=0, help="first step index, for drift (default 0)")
    p.add_argument("--drift-steps", type=int, default=100, help="steps over which lengths drift (default 100)")
    p.add_argument("--max-model-len", type=int, default=40960, help="cap on trajectory length (default 40960)")
    p.add_argument("--out", default=None, help="output file (default WORKLOAD-trace.jsonl)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers) -> None:
    parser = subparsers.add_parser("trace", help="synthetic traces: `libra trace generate --workload NAME ...`")
    actions = parser.add_subparsers(dest="trace_action", metavar="ACTION")
    gen = actions.add_parser("generate", help="write a synthetic agentic trace")
    _add_generate_args(gen)
    gen.set_defaults(run=run)
    _add_generate_args(parser)  # `libra trace` alone generates with the defaults
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.workload not in WORKLOAD_NAMES:
        raise CLIError(f"unknown workload {args.workload!r}; expected one of {', '.join(WORKLOAD_NAMES)}")
    out = Path(args.out or f"{args.workload}-trace.jsonl")
    log(f"generating {args.steps} step(s) of {args.workload} ({args.prompts} prompts x {args.samples} samples)")
    trajectories = generate(
        args.workload,
        num_steps=args.steps,
        seed=args.seed,
        num_prompts=args.prompts,
        samples_per_prompt=args.samples,
        start_step=args.start_step,
        drift_steps=args.drift_steps,
        max_model_len=args.max_model_len,
    )
    try:
        written = write_trace(out, trajectories)
    except OSError as exc:
        raise CLIError(f"cannot write {out}: {exc.strerror}") from None
    lengths = np.array([t.total_tokens for t in trajectories], float)
    summary = {
        "workload": args.workload,
        "steps": args.steps,
        "seed": args.seed,
        "trajectories": written,
        "out": str(out),
        "mean_tokens": float(lengths.mean()),
        "p50_tokens": float(np.quantile(lengths, 0.5)),
        "p90_tokens": float(np.quantile(lengths, 0.9)),
        "max_tokens": int(lengths.max()),
        "mean_tool_calls": float(np.mean([t.num_tool_calls for t in trajectories])),
    }
    if args.json:
        emit_json(summary)
    else:
        print(key_values(list(summary.items()), title=f"wrote {written} trajectories to {out}"))
    return 0
