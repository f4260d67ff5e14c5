"""`libra trace generate`: write a synthetic agentic trace; `libra trace import`: turn real agent logs (OpenAI
chat messages, SWE-agent, mini-swe-agent, verl rollout exports) into a trace. Both write JSON Lines in the trace
schema of docs/trace-schema.md."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from libra.cli._common import (
    MAX_MODEL_LEN,
    MAX_TRAJECTORIES_PER_STEP,
    CLIError,
    check_generation,
    check_new_output,
    check_prompts_fit,
    check_ranges,
    emit_json,
    key_values,
    log,
    one_line,
    progress_bar,
)
from libra.workloads import WORKLOAD_NAMES, TraceError, generate, write_trace

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


def _add_import_args(p: argparse.ArgumentParser) -> None:
    from libra.workloads.importers import DEFAULT_TOKENIZER, IMPORT_FORMATS

    p.add_argument(
        "sources",
        nargs="*",
        metavar="SRC",
        help="agent log files (JSON, JSON Lines, Parquet, Inspect .eval), or directories (their matching files)",
    )
    p.add_argument(
        "--format",
        default="openai",
        choices=IMPORT_FORMATS,
        help="log format (default openai, which also reads ShareGPT, Anthropic, Gemini, Bedrock Converse and OpenAI "
        "Responses logs, Claude Code / Codex CLI / Gemini CLI / Qwen Code session logs, codex exec --json output, "
        "OpenHands event streams and outputs, "
        "LangChain serialized messages, smolagents messages and memory steps, Moatless Tools trajectories, "
        "Inspect AI evaluation logs, JSON or .eval archives, and text rollouts with tool results inline "
        "(Search-R1 and the like; verl's rollout_data_dir dumps))",
    )
    p.add_argument("--out", default="imported-trace.jsonl", help="output trace (default imported-trace.jsonl)")
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help=f"{DEFAULT_TOKENIZER} (default), cl100k_base, a tokenizer.json path, or bytes4 (an approximation)",
    )
    p.add_argument(
        "--glob",
        action="append",
        default=[],
        metavar="PATTERN",
        help="which files of a SRC directory are logs, by name (repeat; default by format: openai *.json *.jsonl "
        "*.json.gz *.jsonl.gz *.parquet *.eval, swe-agent *.traj, mini-swe-agent *.traj.json, verl the JSON ones "
        "and *.parquet, atif the JSON ones)",
    )
    p.add_argument(
        "--skip-errors",
        action="store_true",
        help="leave out a file that is not a log of the format (all of it), say why on stderr, import the rest; read a "
        "JSON Lines file whose writer stopped mid-line up to its last whole line",
    )
    p.add_argument(
        "--skip-bad-records",
        action="store_true",
        help="as --skip-errors, and leave out alone a record (a JSON Lines line, a list item, a sample) that is not "
        "a trajectory of the format, keeping the file's others; say which on stderr",
    )
    p.add_argument("--source", default=None, help="a name stored in every trajectory's 'source' field")
    p.add_argument("--error-pattern", action="append", default=[], metavar="REGEX", help="extra error text (repeat)")
    p.add_argument("--timeout-pattern", action="append", default=[], metavar="REGEX", help="extra timeout text")
    p.add_argument("--no-default-patterns", action="store_true", help="use only the patterns given")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "trace",
        help="`libra trace generate` (synthetic) or `libra trace import` (real agent logs)",
        description="Write a trace (JSON Lines in the schema of docs/trace-schema.md) that plan, simulate and "
        "route-eval replay: `generate` a synthetic agentic workload (the default action), or `import` real agent "
        "logs, counting their tokens with a real tokenizer.",
    )
    actions = parser.add_subparsers(dest="trace_action", metavar="ACTION")
    gen = actions.add_parser("generate", help="write a synthetic agentic trace")
    _add_generate_args(gen, inherit=True)
    gen.set_defaults(run=run)
    imp = actions.add_parser("import", help="turn real agent logs into a trace (token counts by a real tokenizer)")
    _add_import_args(imp)
    imp.set_defaults(run=run_import)
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
    check_generation(args.steps, args.prompts, args.samples)
    out = Path(args.out or f"{args.workload}-trace.jsonl")
    check_new_output(out, directory=False)
    log(
        f"generating {args.steps} step(s) of synthetic {args.workload} "
        f"({args.prompts} prompts x {args.samples} samples)"
    )
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
    check_prompts_fit(max(t.total_tokens for t in trajectories), args.max_model_len, "--max-model-len")
    try:
        written = write_trace(out, trajectories)  # whole or not at all: a reader never sees half a trace
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
        print(key_values(list(summary.items()), title=f"wrote {written} synthetic trajectories to {out}"))
    return 0


class _Stderr(logging.Handler):
    """An importer's warnings (e.g. the samples of an Inspect log that failed before any generation), one line each
    on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        log(f"warning: {record.getMessage()}")


def _check_patterns(args: argparse.Namespace) -> None:
    """Each pattern given is a regular expression; the error names it (not the whole list of defaults)."""
    import re

    for flag, patterns in (("--error-pattern", args.error_pattern), ("--timeout-pattern", args.timeout_pattern)):
        for pattern in patterns:
            try:
                re.compile(f"(?:{pattern})", re.I | re.M)  # as the importers join them
            except re.error as exc:
                raise CLIError(f"{flag} {pattern!r} is not a regular expression: {exc}") from None


def run_import(args: argparse.Namespace) -> int:
    from libra.workloads.importers import (
        DEFAULT_ERROR_PATTERNS,
        DEFAULT_TIMEOUT_PATTERNS,
        BadRecord,
        CutTail,
        StatusRules,
        TokenizerError,
        expand_paths,
        import_files,
        write_trace_atomic,
    )

    if not args.sources:
        raise CLIError("trace import needs at least one SRC file (e.g. libra trace import --format openai log.jsonl)")
    base_err = () if args.no_default_patterns else DEFAULT_ERROR_PATTERNS
    base_tmo = () if args.no_default_patterns else DEFAULT_TIMEOUT_PATTERNS
    _check_patterns(args)
    try:
        rules = StatusRules(base_err + tuple(args.error_pattern), base_tmo + tuple(args.timeout_pattern))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    out = Path(args.out)
    check_new_output(out, directory=False)  # before the import, which may read large logs for minutes
    try:
        files = expand_paths(args.format, args.sources, args.glob)  # a TraceError is the CLI's one-line error
    except ValueError as exc:  # a --glob that cannot match a name
        raise CLIError(str(exc)) from None
    folders = sum(Path(s).is_dir() for s in args.sources)
    found = f" ({folders} director{'y' if folders == 1 else 'ies'} listed)" if folders else ""
    log(f"importing {len(files)} file(s){found} as {args.format} (tokenizer {args.tokenizer})")
    warnings = logging.getLogger("libra.workloads.importers")  # what an importer skipped, said on stderr
    handler = _Stderr(logging.WARNING)
    warnings.addHandler(handler)
    bar = progress_bar(total=len(files), desc="import", unit="file", enabled=not args.json and len(files) > 1)
    skipped: list[TraceError] = []  # with --skip-errors: the files (and records) left out, and why
    lenient = args.skip_errors or args.skip_bad_records
    try:
        trajectories = import_files(
            args.format,
            files,
            tokenizer=args.tokenizer,
            rules=rules,
            source=args.source,
            progress=lambda _path: bar.update(),
            on_error=skipped.append if lenient else None,
            skip_records=args.skip_bad_records,
        )
    except TokenizerError as exc:
        raise CLIError(str(exc)) from None
    except TraceError as exc:
        raise CLIError(_listed_hint(exc, args.sources, args.glob)) from None
    finally:
        bar.close()
        warnings.removeHandler(handler)
    try:
        written = write_trace_atomic(out, trajectories)
    except OSError as exc:
        raise CLIError(f"cannot write {out}: {exc.strerror}") from None
    cut = [e for e in skipped if isinstance(e, CutTail)]  # files read up to a line their writer stopped in
    bad = [e for e in skipped if isinstance(e, BadRecord)]  # records left out alone (--skip-bad-records)
    skipped = [e for e in skipped if not isinstance(e, CutTail | BadRecord)]
    _warn_some(skipped, "left out", "file(s) left out")
    _warn_some(cut, "read up to its last whole line:", "file(s) cut off mid-line")
    _warn_some(bad, "left out the record at", "record(s) left out")
    summary: dict = {"format": args.format, "tokenizer": args.tokenizer if args.format != "verl" else "token ids"}
    summary.update(trace_summary(trajectories))
    summary["out"] = str(out)
    if lenient:
        summary["files_read"] = len(files) - len(skipped)
        summary["files_left_out"] = len(skipped)
        summary["files_cut_off"] = len(cut)
    if args.skip_bad_records:
        summary["records_left_out"] = len(bad)
    for key, errors in (("left_out", skipped), ("cut_off", cut), ("bad_records", bad)):
        if args.json and errors:
            summary[key] = [{"file": e.path, "line": e.line, "error": e.message} for e in errors]
    if args.json:
        emit_json(summary)
    else:
        print(key_values(list(summary.items()), title=f"imported {written} trajectories into {out}"))
    return 0


_SKIPS_SHOWN = 5  # files left out by --skip-errors named one per line on stderr; --json lists them all


def _warn_some(errors: list, what: str, more: str) -> None:
    """The first _SKIPS_SHOWN of `errors` one per line on stderr, then how many more."""
    for e in errors[:_SKIPS_SHOWN]:
        log(f"warning: {what} {one_line(str(e))}")
    if len(errors) > _SKIPS_SHOWN:
        log(f"warning: {len(errors) - _SKIPS_SHOWN} more {more} (--json lists them all)")


def _listed_hint(exc: TraceError, sources: list[str], globs: list[str]) -> str:
    """The importer's error, and where the file came from when it was found under a SRC directory (not named by the
    user): which files a directory stands for is a choice the user can change."""
    bad = Path(exc.path or ".")
    folder = next((s for s in sources if Path(s).is_dir() and Path(s) in bad.parents), None)
    if folder is None or any(Path(s) == bad for s in sources):
        return str(exc)
    chosen = "the --glob patterns" if globs else "the format's default patterns"
    return f"{exc} (a file under {folder}, matched by {chosen}; --glob PATTERN names which files to read)"


def trace_summary(trajectories) -> dict:
    """Statistics of a trace: lengths, turns, tokens per generation and per tool return, statuses, tail share."""
    lengths = np.array([t.total_tokens for t in trajectories], float)
    turns = np.array([len(t.turns) for t in trajectories], float)
    gens = np.array([x.gen_tokens for t in trajectories for x in t.turns], float)
    rets = np.array([x.tool_tokens for t in trajectories for x in t.turns if x.tool is not None], float)
    statuses = [x.tool_status for t in trajectories for x in t.turns if x.tool is not None]
    top = np.sort(lengths)[::-1][: max(1, len(lengths) // 10)]
    return {
        "trajectories": len(trajectories),
        "mean_tokens": float(lengths.mean()),
        "p50_tokens": float(np.quantile(lengths, 0.5)),
        "p90_tokens": float(np.quantile(lengths, 0.9)),
        "max_tokens": int(lengths.max()),
        "longest_10pct_share": float(top.sum() / lengths.sum()) if lengths.sum() else 0.0,
        "median_turns": float(np.median(turns)),
        "max_turns": int(turns.max()),
        "median_gen_tokens_per_turn": float(np.median(gens)) if len(gens) else 0.0,
        "median_tool_return_tokens": float(np.median(rets)) if len(rets) else 0.0,
        "p90_tool_return_tokens": float(np.quantile(rets, 0.9)) if len(rets) else 0.0,
        "tool_returns": len(statuses),
        "error_rate": statuses.count("error") / len(statuses) if statuses else 0.0,
        "timeout_rate": statuses.count("timeout") / len(statuses) if statuses else 0.0,
        "prompt_share": float(sum(t.prompt_tokens for t in trajectories) / max(1.0, lengths.sum())),
    }
