"""The planner's public API as an integrator calls it: a bad value is one `SpecError` naming it, raised before any
work, and a plan made for another cluster is refused rather than kept and filled beyond the GPUs there are."""

from __future__ import annotations

import math
import re

import attrs
import pytest

from libra.planning import GlobalPlanner, PlannerOptions, ReplanGate
from libra.planning.placement import solve_placement
from libra.planning.train_tree import TreeOptions
from libra.spec import ClusterSpec, InstanceGroup, RLSettings, SpecError, WorkloadProfile, get_gpu, get_model

RL = RLSettings(num_prompts=8, samples_per_prompt=8)
PROFILE = WorkloadProfile.build(
    name="ramp", shapes=[(1000.0 * (i + 1), 500.0 * (i + 1), 3.0) for i in range(64)], mean_tool_time_s=2.0
)


def _planner(num_gpus: int) -> GlobalPlanner:
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=num_gpus, gpus_per_node=8)
    return GlobalPlanner(cluster=cluster, model=get_model("Qwen3-4B"), rl=RL)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_groups", 0),  # was taken as one length group
        ("num_groups", -1),
        ("num_groups", 1.5),  # was a TypeError deep in the profile's grouping
        ("cache_size", -1),
        ("routing", "fastest"),  # was attrs' ValueError with the attribute's repr
        ("tree", None),
        ("fill_spare_gpus", "no"),  # a truthy string read as True
        ("admission_delay", 1.0),  # was refused only when a plan was asked for
        ("admission_delay", True),
        ("tp_degrees", (1.5, 2)),
    ],
)
def test_planner_options_refuse_a_bad_value_at_construction(field: str, value: object) -> None:
    with pytest.raises(SpecError, match=rf"^PlannerOptions\.{field} must be .*, got {re.escape(repr(value))}$"):
        PlannerOptions(**{field: value})  # type: ignore[arg-type]


def test_planner_options_keep_every_valid_value() -> None:
    options = PlannerOptions(
        tp_degrees=[1, 2], num_groups=3, tree=TreeOptions(), fill_spare_gpus=False, cache_size=0, admission_delay=0
    )
    assert options.tp_degrees == (1, 2) and options.cache_size == 0
    assert PlannerOptions(tp_degrees=()).tp_degrees == ()  # no degree at all is explained when a plan is asked for


@pytest.mark.parametrize("budget", [3.5, True])
def test_a_gpu_budget_must_be_a_whole_number_of_gpus(budget: object) -> None:
    with pytest.raises(SpecError, match=rf"num_gpus must be between 2 and 16, got {budget}"):
        _planner(16).plan(PROFILE, num_gpus=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["plan_rollout", "replan_rollout"])
def test_the_rollout_side_is_not_replanned_for_a_plan_of_a_larger_cluster(method: str) -> None:
    """A plan for 64 GPUs handed to a 16-GPU planner was kept and its 48 rollout GPUs filled with instances:
    a plan of 64 GPUs for a cluster of 16, returned without a word."""
    big = _planner(64).plan(PROFILE)
    assert big.num_gpus > 16
    with pytest.raises(SpecError, match=rf"the current plan uses {big.num_gpus} GPUs .* cluster has 16 \(2 nodes"):
        getattr(_planner(16), method)(big, PROFILE)


def test_a_plan_of_the_planners_own_cluster_is_replanned() -> None:
    planner = _planner(16)
    plan = planner.plan(PROFILE)
    candidate, decision = planner.replan_rollout(plan, PROFILE)
    assert candidate.num_gpus <= 16 and candidate.train == plan.train and not decision.apply


@pytest.mark.parametrize("horizon", [1.5, True, 0])
def test_the_gate_horizon_is_a_whole_number_of_steps(horizon: object) -> None:
    plan = _planner(16).plan(PROFILE)
    with pytest.raises(SpecError, match=rf"horizon_steps must be >= 1, got {horizon!r}"):
        ReplanGate().decide(current=plan, candidate=plan, horizon_steps=horizon)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("time_limit_s", -1.0),  # CP-SAT said MODEL_INVALID: "a bug in the model builder", with no message
        ("time_limit_s", float("nan")),
        ("time_limit_s", 0),
        ("num_workers", -1),
        ("kv_reserve_tokens", -1),  # was accepted: a negative KV reserve lowered each instance's memory need
    ],
)
def test_placement_settings_are_checked_before_any_work(argument: str, value: object) -> None:
    planner = _planner(16)
    plan = planner.plan(PROFILE)
    with pytest.raises(SpecError, match=rf"^{argument} must be .*, got {re.escape(repr(value))}$"):
        solve_placement(plan, planner.cluster, model=planner.model, **{argument: value})  # type: ignore[arg-type]


def test_the_rollout_side_is_not_replanned_for_training_wider_than_a_node() -> None:
    """Same GPU count, narrower nodes: a kept TP-8 training group could not lie inside one 4-GPU node."""
    plan = _planner(16).plan(PROFILE)
    rollout = attrs.evolve(plan.rollout, num_gpus=8, instances=(InstanceGroup(tp=2, count=4, max_tokens=math.inf),))
    wide = attrs.evolve(plan, train=attrs.evolve(plan.train, num_gpus=8, tp=8, pp=1, dp=1), rollout=rollout)
    narrow = GlobalPlanner(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=4),
        model=get_model("Qwen3-4B"),
        rl=RL,
    )
    assert wide.num_gpus <= 16
    with pytest.raises(SpecError, match=r"trains with TP-8 but the planner's cluster has 4 GPUs per node"):
        narrow.plan_rollout(wide, PROFILE)
