"""The virtual cluster: what the planner plans, and how its decisions map onto the engines that run here.

The planner plans a scaled-down cluster (`VirtualSettings`: e.g. 6 A800 GPUs training Qwen3-14B) on the workload
profile of the run's own trajectories, their token counts multiplied by `token_scale` and the batch by
`batch_scale`. Its decisions are carried out unchanged in structure:

- each rollout instance of the placement (`rollout-tp<x>-<i>`) is one vLLM engine here; every engine runs with TP 1
  on CPU, and the plan's TP becomes the engine's capacity (`max_num_seqs = seqs_per_tp * tp`);
- each length bucket of the plan (its `max_tokens`, divided by `token_scale`) routes to the instances of its group;
- the core training replicas of the first plan are the torch trainer here (one process; the plan's TP/PP/DP is
  recorded, not emulated). The core pool is fixed for the run (as in the paper), so later plans keep the training
  layout and re-optimise the rollout side on the remaining GPUs (`rollout_candidate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from libra.adapters.types import InstanceSpec
from libra.planning import GlobalPlanner, ReplanDecision, ReplanGate
from libra.planning.planner import PlannerOptions
from libra.runtime.config import RunConfig
from libra.spec import (
    Bucket,
    ClusterSpec,
    Placement,
    Plan,
    RLSettings,
    Role,
    WorkloadProfile,
    get_gpu,
    get_model,
)
from libra.workloads.trace import Trajectory


def virtual_cluster(config: RunConfig) -> ClusterSpec:
    v = config.virtual
    return ClusterSpec.from_total(gpu=get_gpu(v.gpu), num_gpus=v.gpus, gpus_per_node=v.gpus_per_node)


def virtual_planner(config: RunConfig) -> GlobalPlanner:
    v = config.virtual
    rl = RLSettings(
        num_prompts=len(config.prompts) * v.batch_scale,
        samples_per_prompt=config.samples_per_prompt,
        max_model_len=v.max_model_len,
    )
    return GlobalPlanner(
        cluster=virtual_cluster(config),
        model=get_model(v.model),
        rl=rl,
        options=PlannerOptions(tp_degrees=tuple(v.tp_degrees)),
    )


def scaled_profile(
    trajectories: Sequence[Trajectory], config: RunConfig, *, name: str, mean_tool_time_s: float = 0.0
) -> WorkloadProfile:
    """The virtual workload of real trajectories: token counts times `token_scale`, the step's requests times
    `batch_scale`."""
    s = config.virtual.token_scale
    shapes = [(t.total_tokens * s, t.gen_tokens * s, float(max(1, len(t.turns)))) for t in trajectories]
    return WorkloadProfile.build(
        name=name,
        shapes=shapes,
        requests_per_step=config.batch_size * config.virtual.batch_scale,
        mean_tool_time_s=mean_tool_time_s,
    )


def prior_profile(config: RunConfig, prompt_tokens: Sequence[int]) -> WorkloadProfile:
    """Before any trajectory finished: each prompt decodes `max_tokens` per turn for `max_turns` turns with tool
    outputs of one turn's size (the planner's first guess; the first replan replaces it)."""
    shapes: list[tuple[float, float, float]] = []
    for p in prompt_tokens:
        gen = config.max_tokens * config.max_turns
        shapes.append(((p + 2 * gen) * config.virtual.token_scale, gen * config.virtual.token_scale, config.max_turns))
    return WorkloadProfile.build(
        name="prior",
        shapes=shapes * config.samples_per_prompt,
        requests_per_step=config.batch_size * config.virtual.batch_scale,
    )


def rollout_candidate(planner: GlobalPlanner, current: Plan, profile: WorkloadProfile) -> Plan:
    """The best rollout side on the rollout GPUs of `current`, its training layout kept (the core pool is fixed)."""
    return planner.plan_rollout(current, profile)


def replan_rollout(
    planner: GlobalPlanner, current: Plan, profile: WorkloadProfile, gate: ReplanGate, horizon_steps: int
) -> tuple[Plan, ReplanDecision]:
    """Candidate rollout side for the newest profile and the gate's verdict; both scored on that profile."""
    return planner.replan_rollout(current, profile, gate=gate, horizon_steps=horizon_steps)


def instance_specs(placement: Placement, config: RunConfig) -> dict[str, InstanceSpec]:
    """One engine per rollout instance of the placement (name -> spec)."""
    e = config.engine
    return {
        w.name: InstanceSpec(name=w.name, tp=w.tp, max_num_seqs=e.seqs_per_tp * w.tp, max_model_len=e.max_model_len)
        for w in placement.workers
        if w.role == Role.ROLLOUT_INSTANCE
    }


def real_buckets(plan: Plan, config: RunConfig) -> tuple[Bucket, ...]:
    """The plan's buckets in real tokens (limits divided by `token_scale`, kept strictly increasing)."""
    out: list[Bucket] = []
    for b in plan.rollout.buckets:
        limit = (
            b.max_tokens
            if math.isinf(b.max_tokens)
            else max(1.0, math.floor(b.max_tokens / config.virtual.token_scale))
        )
        if out and limit <= out[-1].max_tokens:
            limit = out[-1].max_tokens + 1
        out.append(Bucket(tp=b.tp, max_tokens=limit))
    return tuple(out)


def bucket_instances(plan: Plan, placement: Placement) -> dict[int, list[str]]:
    """Bucket index -> the placement's instances of that bucket's group (groups in length order; instances of one
    TP degree are dealt to that degree's groups in order)."""
    groups = sorted(plan.rollout.instances, key=lambda g: g.max_tokens)
    by_tp: dict[int, list[str]] = {}
    for w in sorted(placement.workers, key=lambda w: w.name):
        if w.role == Role.ROLLOUT_INSTANCE:
            by_tp.setdefault(w.tp, []).append(w.name)
    out: dict[int, list[str]] = {}
    for k, g in enumerate(groups):
        names = by_tp.get(g.tp, [])
        out[k], by_tp[g.tp] = names[: g.count], names[g.count :]
    return out


def plan_summary(plan: Plan, config: RunConfig) -> dict:
    t = plan.train
    return {
        "makespan_s": plan.makespan_s,
        "train": {"gpus": t.num_gpus, "tp": t.tp, "pp": t.pp, "dp": t.dp, "time_s": t.time_s},
        "rollout": {
            "gpus": plan.rollout.num_gpus,
            "time_s": plan.rollout.time_s,
            "instances": [
                {"tp": g.tp, "count": g.count, "max_tokens": None if math.isinf(g.max_tokens) else g.max_tokens}
                for g in sorted(plan.rollout.instances, key=lambda g: g.max_tokens)
            ],
        },
        "buckets_real_tokens": [None if math.isinf(b.max_tokens) else b.max_tokens for b in real_buckets(plan, config)],
    }


def mix(plan: Plan) -> list[tuple[int, int]]:
    return sorted((g.tp, g.count) for g in plan.rollout.instances)
