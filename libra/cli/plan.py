"""`libra plan`: the optimal GPU split, training layout and rollout instance mix for a cluster, model, workload."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import attrs

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
    key_values,
    log,
    max_len_note,
    setup_from_args,
    table,
    tool_latency_from_args,
)

DEFAULT_WORKLOAD = "r2e-gym"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan the GPU split, training parallelism and rollout instances",
        description="Find the plan minimising the iteration makespan max(T_train, T_rollout). "
        "Defaults: 48 x A800-80GB (6 nodes x 8), Qwen3-14B, an R2E-Gym-like workload.",
    )
    add_setup_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--trace", metavar="FILE", help="plan from a trace file (JSON Lines, or gzipped; docs/trace-schema.md)"
    )
    src.add_argument(
        "--workload", default=DEFAULT_WORKLOAD, help="synthetic workload: search-r1, dapo-math, r2e-gym, swe-agent"
    )
    p.add_argument("--step", type=int, default=0, help="step of the synthetic workload to plan for (drift)")
    p.add_argument("--window-steps", type=int, default=None, help="with --trace: profile only the last N steps")
    p.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="prompts per RL step (default 512; with --trace: the trace's trajectories per step)",
    )
    p.add_argument("--samples", type=int, default=None, help="samples per prompt (default 16; with --trace: 1)")
    p.add_argument("--max-len", type=int, default=40960, help="maximum model length in tokens (default 40960)")
    p.add_argument(
        "--tp-degrees", default=None, help="rollout TP degrees to consider (default 1,2,4,8, those that fit in a node)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the synthetic workload, or of a trace's untimed tool calls"
    )
    add_tool_latency_args(p)
    p.add_argument(
        "--routing",
        default="start-small",
        choices=("start-small", "final-length"),
        help="how requests reach rollout buckets: start-small (C-MLFQ: start in the smallest, promoted as "
        "the context grows; default) or final-length (perfect routing)",
    )
    p.add_argument("--place", action="store_true", help="also map the plan onto GPU ids (OR-Tools CP-SAT)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--emit", choices=("verl",), default=None, help="also write the plan as a framework config (verl)")
    p.add_argument("--out", metavar="DIR", default=None, help="with --emit: the folder to write it to")
    p.add_argument(
        "--verl-strategy", choices=("megatron", "fsdp"), default=None, help="verl actor (--emit verl; default megatron)"
    )
    p.add_argument("--model-path", default=None, help="with --emit verl: the model's HF path (default: --model)")
    p.set_defaults(run=run)


def _check_combination(args: argparse.Namespace) -> None:
    """Options that only mean something beside another are refused alone, not ignored; the folder of --emit is
    checked before the plan is made."""
    if args.window_steps is not None and not args.trace:
        raise CLIError("--window-steps profiles the last steps of a trace: give --trace FILE")
    if args.emit is None and (args.out is not None or args.model_path is not None or args.verl_strategy is not None):
        flag = "--out" if args.out is not None else "--model-path" if args.model_path is not None else "--verl-strategy"
        raise CLIError(f"{flag} goes with --emit verl")
    if args.emit is not None and args.out:
        check_new_output(Path(args.out), directory=True)


def _trace_batch(args: argparse.Namespace, trajectories) -> tuple[int, int]:
    """(prompts, samples) of one step of a trace, unless given: the mean trajectories per step of the window."""
    if args.prompts is not None or args.samples is not None:
        return args.prompts or 512, args.samples or 1
    from libra.workloads.profile import steps_in_window

    steps = steps_in_window(trajectories, args.window_steps)
    per_step = round(sum(len(s) for s in steps) / len(steps))
    return max(1, per_step), 1


def _profile(args: argparse.Namespace, rl, trajectories, latency):
    from libra.workloads import profile_from_trajectories

    if trajectories is not None:
        profile = profile_from_trajectories(
            trajectories, name=args.trace, window_steps=args.window_steps, requests_per_step=rl.global_batch
        )
        return profile if profile.tool_s else _untimed(args, rl, trajectories, profile, latency)
    from libra.workloads.generators import WorkloadGenerator

    gen = WorkloadGenerator(
        args.workload,
        seed=args.seed,
        num_prompts=rl.num_prompts,
        samples_per_prompt=rl.samples_per_prompt,
        max_model_len=args.max_len,
    )
    step = gen.step(args.step)
    check_prompts_fit(max(t.total_tokens for t in step), args.max_len, "--max-len")
    return profile_from_trajectories(step, name=args.workload, requests_per_step=rl.global_batch)


def _untimed(args: argparse.Namespace, rl, trajectories, profile, latency):
    """A trace whose tool calls are not all timed: the profile with each call drawn as `libra simulate` draws it
    (`latency`, from --tool-latency; --seed; the draw is a function of the trajectory's content), so that plan and
    simulation price a call alike; as it is where the window makes no tool call."""
    from libra.sim.engine import profile_of
    from libra.sim.workload import step_work
    from libra.workloads.profile import steps_in_window

    chosen = [t for step in steps_in_window(trajectories, args.window_steps) for t in step]
    if not any(u.tool is not None for t in chosen for u in t.turns):
        return profile
    work = step_work(0, chosen, latency=latency, seed=args.seed)
    return profile_of([work], profile.name, rl.global_batch)


def _tp_degrees(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise CLIError(f"--tp-degrees must be comma-separated integers, got {text!r}") from None
    if not values:
        raise CLIError("--tp-degrees is empty")
    return values


def _range(low: float, high: float) -> str:
    hi = "inf" if math.isinf(high) else f"{high:,.0f}"
    return f"({low:,.0f}, {hi}]"


def _emit_verl(args: argparse.Namespace, plan, cluster, rl, model) -> dict[str, Any]:
    from libra.adapters.verl import VerlConfigError, emit_verl_config  # pure: imports no verl

    if not args.out:
        raise CLIError("--emit verl needs --out DIR")
    try:
        config = emit_verl_config(
            plan,
            cluster=cluster,
            rl=rl,
            model_path=args.model_path or model.name,
            strategy=args.verl_strategy or "megatron",
            config_dir=args.out,
        )
    except VerlConfigError as exc:
        raise CLIError(f"--emit verl: {exc}") from None
    try:
        files = config.write(args.out)
    except OSError as exc:
        raise CLIError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    log(f"verl {config.trainer_mode} config written to {args.out}: " + ", ".join(f.name for f in files))
    return {**config.summary(), "files": [str(f) for f in files]}


def run(args: argparse.Namespace) -> int:
    from libra.planning import GlobalPlanner, PlannerOptions
    from libra.spec import RLSettings, SpecError
    from libra.spec.cluster import MAX_GPUS, MAX_GPUS_PER_NODE

    _check_combination(args)
    if args.gpus < 2 and not args.cluster:
        raise CLIError(f"--gpus must be at least 2 (one for training, one for rollout), got {args.gpus}")
    check_ranges(
        args,
        {
            "gpus": (2, MAX_GPUS),
            "gpus_per_node": (1, MAX_GPUS_PER_NODE),
            "step": (0, 1_000_000),
            "window_steps": (1, 1_000_000),
            "prompts": (1, MAX_TRAJECTORIES_PER_STEP),
            "samples": (1, MAX_TRAJECTORIES_PER_STEP),
            "max_len": (1, MAX_MODEL_LEN),
            "seed": (0, 2**63 - 1),
        },
    )
    cluster, model, coeffs = setup_from_args(args)
    latency = tool_latency_from_args(args)
    trajectories = None
    if args.trace:
        from libra.workloads import load_trace

        trajectories = load_trace(args.trace)
        prompts, samples = _trace_batch(args, trajectories)
    else:
        prompts, samples = args.prompts or 512, args.samples or 16
    check_batch(prompts, samples)
    rl = RLSettings(num_prompts=prompts, samples_per_prompt=samples, max_model_len=args.max_len)
    profile = _profile(args, rl, trajectories, latency)
    if trajectories is not None and (note := max_len_note(profile.total_lengths, args.max_len)) is not None:
        log(note)
    options = PlannerOptions(routing=args.routing)
    if args.tp_degrees is not None:
        options = attrs.evolve(options, tp_degrees=_tp_degrees(args.tp_degrees))
    planner = GlobalPlanner(cluster=cluster, model=model, rl=rl, options=options, coeffs=coeffs)
    tps = tuple(tp for tp in options.tp_degrees if tp <= cluster.gpus_per_node)
    if args.tp_degrees is not None and len(tps) < len(options.tp_degrees):
        raise CLIError(
            f"--tp-degrees {args.tp_degrees}: a TP group must fit in one node of {cluster.gpus_per_node} GPUs"
        )
    plan = planner.plan(profile)
    single = []
    for tp in tps:
        try:
            single.append((tp, planner.plan(profile, tp_degrees=(tp,)).makespan_s))
        except SpecError:  # a degree the model does not fit on (PlanningError) is simply absent
            single.append((tp, math.inf))
    best_single = min(single, key=lambda x: x[1])
    placement = None
    if args.place:
        from libra.planning.placement import place

        placement = place(plan, cluster, model=model)

    out: dict[str, Any] = plan.to_dict()
    out.update(
        cluster={"gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node, "gpu": cluster.gpu.name},
        model=model.name,
        workload=profile.summary(),
        routing=args.routing,
        best_single_tp={"tp": best_single[0], "makespan_s": best_single[1]},
    )
    if placement is not None:
        out["placement"] = [{"name": w.name, "role": str(w.role), "gpus": list(w.gpu_ids)} for w in placement.workers]
    if args.emit == "verl":
        out["verl"] = _emit_verl(args, plan, cluster, rl, model)
    if args.json:
        emit_json(out)
        return 0
    log(f"planned in {plan.solve_time_s * 1e3:.1f} ms")
    t = plan.train
    print(
        key_values(
            [
                (
                    "cluster",
                    f"{cluster.num_gpus} x {cluster.gpu.name} ({cluster.num_nodes} nodes x {cluster.gpus_per_node})",
                ),
                ("model", model.name),
                (
                    "workload",
                    f"{profile.name}: {rl.global_batch} trajectories/step, mean "
                    f"{profile.mean_length:,.0f} tokens, p90 {profile.quantile(0.9):,.0f}"
                    + (f", up to {max(profile.tool_s):,.1f} s of tool calls in one" if profile.tool_s else ""),
                ),
            ],
            title="Libra plan",
        )
    )
    print()
    print(
        table(
            ["GPUs", "TP", "PP", "DP", "EP", "micro-batch", "recompute", "memory GB/GPU", "step s"],
            [
                [
                    t.num_gpus,
                    t.tp,
                    t.pp,
                    t.dp,
                    t.ep,
                    t.micro_batch,
                    "yes" if t.recompute else "no",
                    round(t.memory_gb, 1),
                    t.time_s,  # (the table shows about four significant digits: 0.154 s, not 0.200)
                ]
            ],
            title="Training",
        )
    )
    print()
    rows = [[g.tp, g.count, g.num_gpus, _range(g.min_tokens, g.max_tokens)] for g in plan.rollout.instances]
    used = sum(g.num_gpus for g in plan.rollout.instances)
    idle = f", {plan.rollout.num_gpus - used} idle" if used < plan.rollout.num_gpus else ""
    title = f"Rollout ({plan.rollout.num_gpus} GPUs{idle}; {args.routing} routing)"
    print(table(["TP", "instances", "GPUs", "request length (tokens)"], rows, title=title))
    print()
    gap = plan.makespan_s / plan.lower_bound_s - 1 if plan.lower_bound_s > 0 else math.nan
    single_gap = best_single[1] / plan.makespan_s - 1
    print(
        key_values(
            [
                ("training time", f"{t.time_s:,.1f} s"),
                ("rollout time", f"{plan.rollout.time_s:,.1f} s"),
                ("makespan", f"{plan.makespan_s:,.1f} s per step"),
                ("lower bound", f"{plan.lower_bound_s:,.1f} s (plan is {gap:+.1%} above it)"),
                ("  fluid", f"{plan.fluid_bound_s:,.1f} s (both sides scaling perfectly with GPUs)"),
                ("  longest chain", f"{plan.chain_bound_s:,.1f} s (its turns and tool calls alone, a batch of one)"),
                ("best single-TP plan", f"TP-{best_single[0]} only: {best_single[1]:,.1f} s ({single_gap:+.1%})"),
                ("solve time", f"{plan.solve_time_s * 1e3:.1f} ms"),
            ],
            title="Prediction",
        )
    )
    from libra.sim.report import plan_note

    log(plan_note(planner.cost_model))
    if placement is not None:
        print()
        rows = [[w.name, str(w.role), ",".join(map(str, w.gpu_ids))] for w in placement.workers]
        print(table(["worker", "role", "GPUs"], rows, title="Placement"))
    return 0
