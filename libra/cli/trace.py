"""`libra trace generate`: write a synthetic agentic trace (JSON Lines, the schema of docs/trace-schema.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from libra.cli._common import (
    MAX_MODEL_LEN,
    MAX_TRAJECTORIES_PER_STEP,
    CLIError,
    check_batch,
    check_new_output,
    check_ranges,
    emit_json,
    key_values,
    log,
)
from libra.workloads import WORKLOAD_NAMES, generate, write_trace

_DEFAULTS = {
    "workload": "search-r1",
    "steps": 1,
    "seed": 0,
    "prompts": 64,
    "samples": 16,
    "start_step": 0,
    "drift_steps": 100,
    "max_model_len": 40960,
    "out": None,
    "json": False,
}


def _add_generate_args(p: argparse.ArgumentParser, *, inherit: bool = False) -> None:
    """The options of `libra trace` and of `libra trace generate`. `inherit`: the subcommand's options default to
    nothing at all (argparse.SUPPRESS), so values given before `generate` (`libra trace --steps 3 generate`) stay."""

    def d(name: str):
        return argparse.SUPPRESS if inherit else _DEFAULTS[name]

    p.add_argument("--workload", default=d("workload"), help=f"one of {', '.join(WORKLOAD_NAMES)} (default search-r1)")
    p.add_argument("--steps", type=int, default=d("steps"), help="RL steps to generate (default 1)")
    p.add_argument("--seed", type=int, default=d("seed"), help="random seed (default 0)")
    p.add_argument("--prompts", type=int, default=d("prompts"), help="prompts per step (default 64)")
    p.add_argument("--samples", type=int, default=d("samples"), help="samples per prompt (default 16)")
    p.add_argument("--start-step", type=int, default=d("start_step"), help="first step index, for drift (default 0)")
    p.add_argument(
        "--drift-steps", type=int, default=d("drift_steps"), help="steps over which lengths drift (default 100)"
    )
    p.add_argument(
        "--max-model-len", type=int, default=d("max_model_len"), help="cap on trajectory length (default 40960)"
    )
    p.add_argument("--out", default=d("out"), help="output file (default WORKLOAD-trace.jsonl)")
    p.add_argument("--json", action="store_true", default=d("json"), help="print one JSON object")


def register(subparsers) -> None:
    parser = subparsers.add_parser("trace", help="synthetic traces: `libra trace generate --workload NAME ...`")
    actions = parser.add_subparsers(dest="trace_action", metavar="ACTION")
    gen = actions.add_parser("generate", help="write a synthetic agentic trace")
    _add_generate_args(gen, inherit=True)
    gen.set_defaults(run=run)
    _add_generate_args(parser)  # `libra trace` alone generates with the defaults
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.workload not in WORKLOAD_NAMES:
        raise CLIError(f"unknown workload {args.workload!r}; expected one of {', '.join(WORKLOAD_NAMES)}")
    check_ranges(
        args,
        {
            "steps": (1, 100_000),
            "seed": (0, 2**63 - 1),
            "prompts": (1, MAX_TRAJECTORIES_PER_STEP),
            "samples": (1, MAX_TRAJECTORIES_PER_STEP),
            "start_step": (0, 1_000_000),
            "drift_steps": (1, 1_000_000),
            "max_model_len": (1, MAX_MODEL_LEN),
        },
    )
    check_batch(args.prompts, args.samples)
    if args.steps * args.prompts * args.samples > 10 * MAX_TRAJECTORIES_PER_STEP:
        raise CLIError(f"--steps x --prompts x --samples: at most {10 * MAX_TRAJECTORIES_PER_STEP:,} trajectories")
    out = Path(args.out or f"{args.workload}-trace.jsonl")
    check_new_output(out, directory=False)
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
    longest = max(t.total_tokens for t in trajectories)
    if longest > args.max_model_len:
        raise CLIError(
            f"--max-model-len {args.max_model_len} is shorter than the workload's prompts ({longest:,} tokens)"
        )
    partial = out.with_name(f".{out.name}.partial")
    try:
        written = write_trace(partial, trajectories)
        partial.replace(out)  # atomic: a reader never sees half a trace
    except OSError as exc:
        partial.unlink(missing_ok=True)
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
