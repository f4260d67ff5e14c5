"""`libra simulate`: compare resource-management policies on a simulated agentic RL run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from libra.cli._common import (
    MAX_MODEL_LEN,
    MAX_TRAJECTORIES_PER_STEP,
    CLIError,
    add_setup_args,
    add_tool_latency_args,
    check_batch,
    check_new_output,
    check_prompts_fit,
    check_ranges,
    emit_json,
    log,
    max_len_note,
    progress_bar,
    setup_from_args,
    table,
    tool_latency_from_args,
)

DEFAULT_STEPS = 3
DEFAULT_PROMPTS = 512
_COLUMNS = (
    ("throughput_tok_s", "tok/s"),
    ("steady_throughput_tok_s", "steady tok/s"),
    ("mean_step_s", "step s"),
    ("gpu_idle_fraction", "idle"),
    ("reconfigurations", "reconfigs"),
    ("migrations", "migrations"),
    ("staleness", "staleness"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate an agentic RL run under each resource-management policy",
        description="Discrete-event simulation of rollout (instances, KV-limited continuous batching, tool calls, "
        "migrations) and training, with the planner's cost model, for each policy. Defaults: 48 x "
        f"A800-80GB, Qwen3-14B, r2e-gym, 512 prompts x 16 samples, {DEFAULT_STEPS} steps (a quick "
        "look; --steps 100 shows the drift over a run, about 2 minutes of CPU for r2e-gym, split over --workers; "
        "docs/sim.md, Speed). With --trace: every step of the trace; with --trace and --resample, --steps steps "
        'drawn from it (a trace of one step shows no pipeline overlap: docs/sim.md, "A short trace").',
    )
    add_setup_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--workload", default="r2e-gym", help="synthetic workload: search-r1, dapo-math, r2e-gym, swe-agent"
    )
    src.add_argument(
        "--trace", metavar="FILE", help="replay a trace file (JSON Lines, or gzipped) instead, one step per label"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"RL steps to simulate (default {DEFAULT_STEPS}; with --trace, every step of the trace)",
    )
    p.add_argument(
        "--resample",
        action="store_true",
        help="with --trace: simulate --steps steps (default 3) of --prompts prompt groups each (default: as many as "
        "the trace's first step has), drawn with replacement from the trace's prompts, each copy under a new "
        "prompt id: the steady state of a short trace, which one step never reaches",
    )
    p.add_argument(
        "--policy",
        default="all",
        help="all (colocated, static-uniform, greedy, static-optimal, libra-homogeneous, libra-hetero-tp, "
        "libra-cmlfq, libra), or a comma-separated list of policy names; libra-oracle (libra-cmlfq planned and run "
        "with perfect routing, each request on the bucket of its final length: what routing could gain; docs/sim.md, "
        "Policies) runs only when named",
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="prompts per step (default 512; with --resample, see there)"
    )
    p.add_argument(
        "--samples",
        type=int,
        default=16,
        help="samples per prompt (default 16; with --trace, how its steps split into prompts for the training batch; "
        "with --resample, each drawn group keeps the trace's own samples)",
    )
    p.add_argument("--max-len", type=int, default=40960, help="maximum model length (default 40960)")
    p.add_argument(
        "--drift-steps", type=int, default=None, help="steps over which the synthetic workload drifts (default 100)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and tool latencies (default 0)")
    add_tool_latency_args(p)
    p.add_argument(
        "--colocated-switch-s",
        type=float,
        metavar="S",
        help="fixed seconds per switch of the colocated pipeline between rollout and training (the engine's sleep "
        "or wake; paid twice per step, on top of the offload/reload and weight-reshard terms that follow from the "
        "model and GPU, `libra estimate` shows them; default: the coefficients' colocated_switch_s, 5.6)",
    )
    p.add_argument(
        "--colocated-offload-bytes-per-param",
        type=float,
        metavar="B",
        help="bytes per parameter of the colocated trainer's state offloaded to host memory at each switch "
        "(verl's FSDP param/optimizer offload: 0 off, the default; 16 both on)",
    )
    p.add_argument(
        "--colocated-kv-fraction",
        type=float,
        metavar="F",
        help="share of GPU memory the colocated engine may use, its KV pool follows (verl's rollout "
        "gpu_memory_utilization; default: the coefficients' colocated_kv_fraction, 0.5)",
    )
    p.add_argument("--slices", type=int, default=300, help="time slices per rollout: the fidelity knob (default 300)")
    p.add_argument(
        "--steal",
        default="all",
        choices=("all", "new", "off"),
        help="what an idle rollout instance takes from busy ones' queues: all (new requests and stuck "
        "turns, re-prefilled; default), new (new requests only: turns stick to their server, as in "
        "RL agent loops), or off",
    )
    p.add_argument(
        "--dispatch",
        default="blocks",
        choices=("blocks", "interleaved"),
        help="how a step's requests are first spread over a bucket's instances: blocks (contiguous, the "
        "samples of a prompt together; default) or interleaved (dealt out in turn, as a "
        "least-loaded dispatcher sends them)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes for groups of policies (same numbers as 1; default min(2, CPUs))",
    )
    p.add_argument("--out", metavar="DIR", default="sim-out", help="folder for report.json and PNG plots")
    p.add_argument("--no-plots", action="store_true", help="write only the JSON report")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(run=run)


def _policies(text: str) -> list[str]:
    from libra.sim import KNOWN_POLICY_NAMES, POLICY_NAMES

    if text.strip() == "all":
        return list(POLICY_NAMES)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in KNOWN_POLICY_NAMES]
    if bad or not names:
        raise CLIError(
            f"unknown policy {', '.join(bad) or repr(text)}; expected all or {', '.join(KNOWN_POLICY_NAMES)}"
        )
    return names


def _colocated(args: argparse.Namespace, coeffs):
    """The coefficients with the colocated options applied (checked: finite, switch >= 0, fraction in (0, 1])."""
    import math

    from libra.planning.cost import CostCoefficients

    changes = {}
    if args.colocated_switch_s is not None:
        if not math.isfinite(args.colocated_switch_s) or args.colocated_switch_s < 0:
            raise CLIError(f"--colocated-switch-s must be a finite number >= 0, got {args.colocated_switch_s}")
        changes["colocated_switch_s"] = args.colocated_switch_s
    if args.colocated_offload_bytes_per_param is not None:
        b = args.colocated_offload_bytes_per_param
        if not math.isfinite(b) or not 0 <= b <= 1e3:
            raise CLIError(f"--colocated-offload-bytes-per-param must be a number in [0, 1000], got {b}")
        changes["colocated_offload_bytes_per_param"] = b
    if args.colocated_kv_fraction is not None:
        if not math.isfinite(args.colocated_kv_fraction) or not 0 < args.colocated_kv_fraction <= 1:
            raise CLIError(f"--colocated-kv-fraction must be in (0, 1], got {args.colocated_kv_fraction}")
        changes["colocated_kv_fraction"] = args.colocated_kv_fraction
    return (coeffs or CostCoefficients()).replace(**changes) if changes else coeffs


def run(args: argparse.Namespace) -> int:
    from libra.sim import Scenario, SimOptions, WorkSource, simulate
    from libra.spec import RLSettings
    from libra.spec.cluster import MAX_GPUS, MAX_GPUS_PER_NODE

    steps_given, prompts_given = args.steps is not None, args.prompts is not None
    if not steps_given:
        args.steps = DEFAULT_STEPS  # (with --trace: the trace's step count, once it is read)
    if not prompts_given:
        args.prompts = DEFAULT_PROMPTS  # (with --resample: the trace's first step's, once it is read)
    if args.resample and not args.trace:
        raise CLIError("--resample draws steps from a trace: give --trace FILE")
    if args.trace and prompts_given and not args.resample:  # refused, not ignored
        raise CLIError("--prompts with --trace needs --resample (a trace's steps hold the prompts they hold)")
    if args.trace and args.drift_steps is not None:
        raise CLIError("--drift-steps shapes a synthetic workload's drift; a trace drifts as it was recorded")
    if args.drift_steps is None:
        args.drift_steps = 100
    for name in ("steps", "prompts", "samples", "max_len", "slices", "drift_steps", "workers"):
        if getattr(args, name) < 1:
            raise CLIError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    check_ranges(
        args,
        {
            "gpus": (1, MAX_GPUS),
            "gpus_per_node": (1, MAX_GPUS_PER_NODE),
            "steps": (1, 100_000),
            "prompts": (1, MAX_TRAJECTORIES_PER_STEP),
            "samples": (1, MAX_TRAJECTORIES_PER_STEP),
            "max_len": (1, MAX_MODEL_LEN),
            "slices": (1, 100_000),
            "drift_steps": (1, 1_000_000),
            "workers": (1, 64),
            "seed": (0, 2**63 - 1),
        },
    )
    check_batch(args.prompts, args.samples)
    check_new_output(Path(args.out), directory=True)  # before the simulation, not after it
    policies = _policies(args.policy)
    cluster, model, coeffs = setup_from_args(args)
    coeffs = _colocated(args, coeffs)
    latency = tool_latency_from_args(args)
    if args.trace and args.resample:
        source = WorkSource.resampled(
            args.trace,
            num_steps=args.steps,
            num_prompts=args.prompts if prompts_given else None,
            seed=args.seed,
            latency=latency,
        )
        drawn = source.trajectories(0)
        groups = len({t.prompt_id for t in drawn})
        prompts, samples = (groups, len(drawn) // groups) if len(drawn) % groups == 0 else (len(drawn), 1)
    elif args.trace:
        source = WorkSource.from_trace(args.trace, seed=args.seed, latency=latency)
        trace_steps = source.num_steps
        assert trace_steps is not None  # (a trace knows how many steps it holds)
        if not steps_given:
            args.steps = trace_steps
        if args.steps > trace_steps:
            raise CLIError(
                f"--steps {args.steps} but the trace has {_steps(trace_steps)} (--resample draws steps from it)"
            )
        first = len(source.trajectories(0))
        prompts, samples = max(1, first // args.samples), args.samples
        if prompts * samples != first:
            prompts, samples = first, 1
    else:
        prompts, samples = args.prompts, args.samples
        source = WorkSource.from_generator(
            args.workload,
            seed=args.seed,
            num_prompts=prompts,
            samples_per_prompt=samples,
            max_model_len=args.max_len,
            drift_steps=args.drift_steps,
        )
        check_prompts_fit(int(source.step(0).total_tokens.max()), args.max_len, "--max-len")
    if args.trace:
        lengths = [t.total_tokens for s in range(args.steps) for t in source.trajectories(s)]
        if (note := max_len_note(lengths, args.max_len)) is not None:
            log(note)
    rl = RLSettings(num_prompts=prompts, samples_per_prompt=samples, max_model_len=args.max_len)
    scenario = Scenario(
        cluster=cluster,
        model=model,
        rl=rl,
        source=source,
        coeffs=coeffs,
        options=SimOptions(slices_per_rollout=args.slices, steal=args.steal, dispatch=args.dispatch),
    )
    log(
        f"simulating {source.name}: {cluster.num_gpus} x {cluster.gpu.name}, {model.name}, {prompts} x {samples} "
        f"trajectories per step, {_steps(args.steps)}, policies {', '.join(policies)}"
    )
    bar = progress_bar(total=args.steps * len(policies), desc="simulate", unit="stage")

    def progress(policy: str, step: int) -> None:
        bar.set_postfix_str(f"{policy} step {step}", refresh=False)
        bar.update(1)

    try:
        report = simulate(scenario, num_steps=args.steps, policies=policies, progress=progress, workers=args.workers)
    finally:
        bar.close()
    files = _write(report, Path(args.out), plots=not args.no_plots)
    summary = report.summary()
    if args.json:
        emit_json(
            {
                "workload": report.workload,
                "gpus": report.num_gpus,
                "steps": report.num_steps,
                "seed": report.seed,
                "elapsed_s": report.elapsed_s,
                "policies": summary,
                "files": [str(f) for f in files],
            }
        )
        return 0
    rows = [[name] + ["-" if s[key] is None else s[key] for key, _ in _COLUMNS] for name, s in summary.items()]
    print(
        table(
            ["policy"] + [h for _, h in _COLUMNS],
            rows,
            title=f"{report.workload} on {report.num_gpus} GPUs, {_steps(report.num_steps)} "
            f"(simulated in {report.elapsed_s:.1f} s)",
        )
    )
    base = summary.get("colocated")
    for key, what in (("throughput_tok_s", "throughput"), ("steady_throughput_tok_s", "steady throughput")):
        if base and base[key] and all(s[key] is not None for s in summary.values()):
            print(f"\n{what} vs colocated: " + ", ".join(f"{n} {s[key] / base[key]:.2f}x" for n, s in summary.items()))
    from libra.sim.report import switch_note

    if (note := switch_note(summary)) is not None:
        log(note)
    if report.num_steps == 1:
        log(
            "note: one step is the pipeline's fill, not its steady state: the asynchronous policies train it only "
            "after its rollout, with nothing to overlap (no 'steady tok/s'); --resample --steps 5 draws more steps "
            'from a trace (docs/sim.md, "A short trace")'
        )
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def _write(report, out: Path, *, plots: bool) -> list[Path]:
    """report.json (and the plots) in `out`, each file whole or not at all: written in a temporary folder inside
    `out`, then renamed into place, so that a full disk or a failed plot leaves no half-written file behind, nor
    the folders this run would have created."""
    import shutil
    import tempfile

    from libra.sim.report import write_json, write_report

    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out, prefix=".partial-"))
        try:
            written = write_report(report, tmp) if plots else [write_json(report, tmp / "report.json")]
            for f in written:
                f.replace(out / f.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)
        raise CLIError(f"cannot write {out}: {exc.strerror or exc}") from None
    return [out / f.name for f in written]


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
