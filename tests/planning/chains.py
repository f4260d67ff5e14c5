"""Shared by the chain-of-turns tests (test_chain_of_range.py, test_paced_chain.py, test_chain_mutants.py): a
planner that keeps one request a length group (16 x A800, Qwen3-14B, TP-1 and TP-2), so a bucket's candidates are
named requests, and a profile from (total, decoded, turns[, tool seconds]) shapes."""

from __future__ import annotations

from libra.planning import GlobalPlanner, PlannerOptions
from libra.spec import ClusterSpec, RLSettings, WorkloadProfile, get_gpu, get_model

CLUSTER = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)


def one_request_a_group(num_requests: int, routing: str = "start-small") -> GlobalPlanner:
    """A planner whose length groups are the requests themselves (one prompt, one sample each)."""
    return GlobalPlanner(
        cluster=CLUSTER,
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=num_requests, samples_per_prompt=1),
        options=PlannerOptions(routing=routing, num_groups=num_requests, tp_degrees=(1, 2)),
    )


def shaped_profile(shapes: list, name: str = "chain") -> WorkloadProfile:
    """The profile of `shapes`, (total, decoded, turns[, tool seconds]) per request, 3 s the mean tool call."""
    return WorkloadProfile.build(name=name, shapes=shapes, mean_tool_time_s=3.0)
