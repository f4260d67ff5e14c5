"""`libra route-eval`: replay a trace through a routing policy and report its routing quality.

Without `--trace` it generates a synthetic trace in memory (`--workload`, default search-r1, 20 steps).
`--policy all` compares C-MLFQ with the baselines (fcfs, mlfq, predictor, the most common bucket) and the oracle,
and says whether C-MLFQ meets issue 14's target over the best baseline (>= 5 points of single-shot accuracy at
<= 12 % migrated tokens). `--unique-prompts` turns the trace into the shape of an agent log (one
run per task, no steps), as real recorded trajectories usually come; with a generated trace it is still synthetic.
`--buckets quantiles` puts four buckets at the trace's own 25/50/75 % length quantiles.
"""

from __future__ import annotations

import argparse
from typing import Any

from libra.cli._common import (
    MAX_TRAJECTORIES_PER_STEP,
    CLIError,
    check_generation,
    check_ranges,
    emit_json,
    key_values,
    log,
    table,
)
from libra.scheduling import CMLFQ_PRESETS, DEFAULT_PRESET, POLICIES, as_agent_log, make_router, replay
from libra.scheduling.sources import (
    BASELINES,
    MAX_MIGRATED,
    TARGET_MARGIN,
    gap_over_baselines,
    meets_target,
    quantile_buckets,
)
from libra.spec import bucket_index, format_buckets, parse_buckets
from libra.workloads import WORKLOAD_NAMES, generate, load_trace

DEFAULT_BUCKETS = "2:5000,4:15000,8:inf"  # the published Search-R1 buckets (docs/design.md)
MOST_COMMON = "most-common"  # the predictor baseline's constant guess (BASELINES), a policy name of this command
# `--policy all`: every router, and the most-common baseline beside the predictor it is a mode of
ALL = tuple(p for name in POLICIES for p in ((name, MOST_COMMON) if name == "predictor" else (name,)))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "route-eval",
        help="score a request-routing policy on a trace",
        description="Replay a trace (or a synthetic workload) through a request-routing policy and score its "
        "routing: how often a trajectory ends in the bucket of its final length, its migrations, the share of tokens "
        "migrated and the bucket confusion. Defaults: synthetic search-r1, 20 steps of 64 prompts x 16 samples, "
        f"policy cmlfq on the published buckets {DEFAULT_BUCKETS}.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--trace", default=None, help="trace file (JSON Lines, or .gz); default: a synthetic --workload in memory"
    )
    src.add_argument(
        "--workload",
        default="search-r1",
        help=f"synthetic workload when no --trace: {', '.join(WORKLOAD_NAMES)} (default search-r1)",
    )
    p.add_argument("--steps", type=int, default=None, help="steps to generate when no --trace (default 20)")
    p.add_argument("--seed", type=int, default=None, help="seed when no --trace (default 0)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step when no --trace (default 64)")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt when no --trace (default 16)")
    p.add_argument(
        "--policy",
        default="cmlfq",
        help=f"{'|'.join(ALL)}|all (default cmlfq; all: every one, and whether cmlfq meets the target over the "
        "best baseline)",
    )
    p.add_argument(
        "--buckets",
        default=DEFAULT_BUCKETS,
        help=f"tp:max_tokens,... or 'quantiles' (1,2,4,8 at the trace's quartiles; default {DEFAULT_BUCKETS})",
    )
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        choices=tuple(CMLFQ_PRESETS),
        help=f"cmlfq option set (default {DEFAULT_PRESET}: learnt size classes, price set to spend an 8%% "
        "migrated-token budget); published: the published rule; accuracy/budget/priced: tuned on synthetic search-r1",
    )
    p.add_argument(
        "--admit",
        default=None,
        choices=("smallest", "predicted"),
        help="cmlfq admission: smallest bucket (published) or predicted from the prompt's statistics",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="router option, repeatable (e.g. rule=median, size_edges=1000,4000, mode=most_common); "
        "with --policy all they go to cmlfq only",
    )
    p.add_argument(
        "--unique-prompts", action="store_true", help="score in the shape of an agent log: unique prompt ids, no steps"
    )
    p.add_argument("--chunks", type=int, default=10, help="time chunks for a trace without steps (default 10)")
    p.add_argument("--warmup-steps", type=int, default=0, help="steps replayed but not scored (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if "," in text:
        return tuple(_value(part) for part in text.split(",") if part)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_options(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--option {item!r} is not KEY=VALUE")
        out[key.strip().replace("-", "_")] = _value(value.strip())
    return out


def _empty_quantile_note(buckets, trajectories) -> str | None:
    """A note where quantile buckets hold nothing: a trace whose quartile lengths coincide (every trajectory as
    long as the next) gets edges pushed one token apart, and the buckets between them stay empty, so every policy is
    scored on fewer buckets than it was given; None where each bucket holds a trajectory."""
    held = {bucket_index(buckets, traj.total_tokens) for traj in trajectories}
    empty = len(buckets) - len(held)
    if not empty:
        return None
    distinct = len({t.total_tokens for t in trajectories})
    return (
        f"note: quantile buckets {format_buckets(buckets)} leave {empty} of {len(buckets)} with no trajectory (the "
        f"trace's quartile lengths coincide: {distinct:,} distinct length{'' if distinct == 1 else 's'} in all); "
        "routing is scored on the others; --buckets TP:MAX,... sets the edges"
    )


_GENERATION = {"steps": 20, "seed": 0, "prompts": 64, "samples": 16}  # the synthetic workload's, without --trace


def run(args: argparse.Namespace) -> int:
    given = [name for name in _GENERATION if getattr(args, name) is not None]
    if args.trace and given:  # refused, not ignored
        raise CLIError(f"--{given[0]} shapes the synthetic workload; with --trace the trace is replayed as it is")
    for name, default in _GENERATION.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    check_ranges(
        args,
        {
            "steps": (1, 100_000),
            "seed": (0, 2**63 - 1),
            "prompts": (1, MAX_TRAJECTORIES_PER_STEP),
            "samples": (1, MAX_TRAJECTORIES_PER_STEP),
            "chunks": (1, 100_000),
            "warmup_steps": (0, 100_000),
        },
    )
    if not args.trace:
        check_generation(args.steps, args.prompts, args.samples)
    buckets = None if args.buckets == "quantiles" else parse_buckets(args.buckets)
    policies = ALL if args.policy == "all" else (args.policy,)
    if args.policy != "all" and args.policy not in ALL:
        raise CLIError(f"unknown policy {args.policy!r}; expected one of {', '.join(ALL)}, all")
    if args.trace:
        trajectories = load_trace(args.trace)
        source = args.trace
    else:
        if args.workload not in WORKLOAD_NAMES:
            raise CLIError(f"unknown workload {args.workload!r}; expected one of {', '.join(WORKLOAD_NAMES)}")
        trajectories = generate(
            args.workload,
            num_steps=args.steps,
            seed=args.seed,
            num_prompts=args.prompts,
            samples_per_prompt=args.samples,
        )
        source = f"synthetic {args.workload} (generated: {args.steps} steps, seed {args.seed})"
    if args.unique_prompts:
        trajectories = as_agent_log(trajectories)
    if buckets is None:
        buckets = quantile_buckets(trajectories)
        if (note := _empty_quantile_note(buckets, trajectories)) is not None:
            log(note)
    options = parse_options(args.option)
    results = []
    for name in policies:
        opts = dict(options) if name == "cmlfq" or args.policy != "all" else {}  # with all: options are cmlfq's
        if name == "cmlfq":
            opts = {**CMLFQ_PRESETS[args.preset], **opts}
        if name == "cmlfq" and args.admit:
            opts["admit"] = args.admit
        router, base = (BASELINES[name][0], {**BASELINES[name][1], **opts}) if name == MOST_COMMON else (name, opts)
        log(f"replaying {len(trajectories)} trajectories through {name}")
        results.append(
            replay(
                make_router(router, buckets, **base),
                trajectories,
                policy=name,
                num_chunks=args.chunks,
                warmup_steps=args.warmup_steps,
            )
        )
    verdict = _verdict({r.policy: r for r in results}) if args.policy == "all" else None
    if args.json:
        if len(results) == 1:
            emit_json(results[0].to_dict())
        else:
            emit_json(
                {
                    "trace": source,
                    "buckets": format_buckets(buckets),
                    "policies": {r.policy: r.to_dict() for r in results},
                    "target": verdict,
                }
            )
        return 0
    print(f"trace: {source}; buckets {format_buckets(buckets)}")
    rows = [
        [
            r.policy,
            r.trajectories,
            r.routing_accuracy,
            r.final_bucket_accuracy,
            r.migrated_token_fraction,
            r.migrations_per_trajectory,
        ]
        for r in results
    ]
    print(
        table(
            ["policy", "trajectories", "accuracy", "final_bucket_acc", "migrated_tokens", "migrations/traj"],
            rows,
            title="routing (accuracy: ends in its bucket with at most one migration)",
        )
    )
    if verdict is not None:
        print()
        print(_verdict_line(verdict))
    if len(results) == 1:
        labels = [f"TP{b.tp}<={'inf' if b.max_tokens == float('inf') else int(b.max_tokens)}" for b in buckets]
        confusion = [[labels[i], *row] for i, row in enumerate(results[0].confusion)]
        print()
        print(table(["true \\ routed", *labels], confusion, title="bucket confusion (rows: true, columns: final)"))
        print()
        print(key_values([("migrated tokens", results[0].migrated_tokens), ("total tokens", results[0].total_tokens)]))
    return 0


def _verdict(results: dict) -> dict[str, Any]:
    """C-MLFQ against the best baseline (BASELINES: fcfs, mlfq, predictor, most-common), as issue 14's target
    counts it (`libra.scheduling.sources.gap_over_baselines`, `meets_target`)."""
    gap, migrated, best = gap_over_baselines(results, "cmlfq")
    return {
        "best_baseline": best,
        "margin": gap,
        "migrated_tokens": migrated,
        "target_margin": TARGET_MARGIN,
        "max_migrated": MAX_MIGRATED,
        "met": meets_target(gap, migrated),
    }


def _verdict_line(v: dict[str, Any]) -> str:
    verdict = "met" if v["met"] else "not met"
    return (
        f"cmlfq against the best baseline ({v['best_baseline']}): {100 * v['margin']:+.1f} points of accuracy at "
        f"{100 * v['migrated_tokens']:.1f} % migrated tokens; target (>= +{100 * v['target_margin']:.0f} points at "
        f"<= {100 * v['max_migrated']:.0f} %): {verdict}"
    )
