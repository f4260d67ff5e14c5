"""The runtime's planning glue and its step record, worked out by hand (libra/runtime/virtual.py, records.py): what
the virtual planner plans for, how real trajectories are scaled, what a rollout-only replan keeps, the buckets in
real tokens, and the `run.jsonl` record of a step. No engine starts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import pytest

from libra.planning import ReplanGate
from libra.planning.placement import place
from libra.runtime import RunConfig, virtual
from libra.runtime.records import step_record
from libra.spec import InstanceGroup, RLSettings
from libra.workloads.trace import Trajectory, Turn


def _traj(prompt: int, *gens: int, tool_tokens: int = 10, version: int | None = None) -> Trajectory:
    extra = {} if version is None else {"weight_version": version}
    turns = [Turn(gen_tokens=g, tool="calc", tool_status="ok", tool_tokens=tool_tokens, extra=extra) for g in gens]
    turns[-1] = Turn(gen_tokens=gens[-1], extra=extra)
    return Trajectory(prompt_id=f"p{prompt}", prompt_tokens=prompt, turns=tuple(turns), reward=1.0)


def test_the_virtual_planner_plans_the_scaled_batch_on_the_virtual_cluster() -> None:
    cfg = RunConfig()
    planner = virtual.virtual_planner(cfg)
    v = cfg.virtual
    assert planner.rl == RLSettings(
        num_prompts=len(cfg.prompts) * v.batch_scale,
        samples_per_prompt=cfg.samples_per_prompt,
        max_model_len=v.max_model_len,
    )
    assert planner.cluster.num_gpus == v.gpus and planner.cluster.gpu.name == v.gpu
    assert planner.options.tp_degrees == tuple(v.tp_degrees)


def test_real_trajectories_are_scaled_into_the_virtual_workload() -> None:
    cfg = RunConfig()
    s = cfg.virtual.token_scale
    trajectories = [_traj(5, 12, 12), _traj(7, 20)]
    p = virtual.scaled_profile(trajectories, cfg, name="window@3", mean_tool_time_s=0.5)
    assert p.name == "window@3" and p.requests_per_step == cfg.batch_size * cfg.virtual.batch_scale
    assert sorted(p.total_lengths) == sorted(t.total_tokens * s for t in trajectories)
    assert sorted(p.gen_tokens) == sorted(t.gen_tokens * s for t in trajectories)
    assert sorted(p.turns) == [1.0, 2.0] and p.mean_tool_time_s == 0.5


def test_the_prior_is_every_prompt_decoding_its_whole_budget() -> None:
    cfg = RunConfig()
    s, gen = cfg.virtual.token_scale, cfg.max_tokens * cfg.max_turns
    p = virtual.prior_profile(cfg, [5, 9])
    assert p.name == "prior" and p.requests_per_step == cfg.batch_size * cfg.virtual.batch_scale
    assert sorted(set(p.total_lengths)) == [(5 + 2 * gen) * s, (9 + 2 * gen) * s]
    assert len(p.total_lengths) == 2 * cfg.samples_per_prompt and set(p.turns) == {float(cfg.max_turns)}


def test_a_rollout_only_replan_keeps_training_and_takes_the_slower_side_as_its_makespan() -> None:
    cfg = RunConfig()
    planner = virtual.virtual_planner(cfg)
    current = planner.plan(virtual.prior_profile(cfg, [5, 6, 6, 5]))
    grown = virtual.scaled_profile([_traj(5, 12, 12, 12, tool_tokens=150)] * 16, cfg, name="grown")
    cand = virtual.rollout_candidate(planner, current, grown)
    assert cand.train == current.train and cand.rollout.num_gpus == current.rollout.num_gpus
    assert cand.makespan_s == max(cand.train.time_s, cand.rollout.time_s)
    assert cand.solve_time_s == 0.0
    assert cand.rollout.time_s == pytest.approx(planner.rollout_time(cand.rollout.instances, grown), rel=0.05)


def test_a_mix_that_cannot_hold_the_new_lengths_is_replaced_whatever_the_gate_says() -> None:
    cfg = RunConfig()
    planner = virtual.virtual_planner(cfg)
    current = planner.plan(virtual.prior_profile(cfg, [5, 6, 6, 5]))
    small = attrs.evolve(
        current,
        rollout=attrs.evolve(
            current.rollout,
            instances=(InstanceGroup(tp=1, count=current.rollout.num_gpus, max_tokens=math.inf),),
        ),
    )
    rc = planner.cost_model.rollout
    longest = next(n for n in range(1_000, 100_000, 500) if not rc.fits(1, n * cfg.virtual.token_scale))
    assert rc.fits(2, longest * cfg.virtual.token_scale)
    huge = virtual.scaled_profile([_traj(5, longest)] * 16, cfg, name="huge")  # a TP-1 cache cannot hold one
    assert not math.isfinite(planner.rollout_time(small.rollout.instances, huge))
    strict = ReplanGate(min_relative_gain=10.0)  # a gate that would refuse any ordinary change
    candidate, decision = virtual.replan_rollout(planner, small, huge, strict, 10)
    assert decision.apply and decision.reason == "the current instance mix cannot hold the new lengths"
    assert math.isfinite(planner.rollout_time(candidate.rollout.instances, huge))


def test_real_bucket_limits_stay_strictly_increasing_after_scaling_down() -> None:
    base = RunConfig()
    plan = virtual.virtual_planner(base).plan(virtual.prior_profile(base, [5, 6, 6, 5]))
    cfg = attrs.evolve(base, virtual=attrs.evolve(base.virtual, token_scale=1000.0))
    groups = (
        InstanceGroup(tp=1, count=1, max_tokens=1500.0),  # 1 real token
        InstanceGroup(tp=1, count=1, max_tokens=1800.0),  # also 1: raised to 2
        InstanceGroup(tp=2, count=1, max_tokens=1900.0),  # also 1: raised to 3
        InstanceGroup(tp=2, count=1, max_tokens=math.inf),
    )
    tight = attrs.evolve(plan, rollout=attrs.evolve(plan.rollout, num_gpus=6, instances=groups))
    assert [b.max_tokens for b in virtual.real_buckets(tight, cfg)] == [1.0, 2.0, 3.0, math.inf]
    assert [b.tp for b in virtual.real_buckets(tight, cfg)] == [1, 1, 2, 2]
    summary = virtual.plan_summary(tight, cfg)
    assert summary["buckets_real_tokens"] == [1.0, 2.0, 3.0, None]
    assert summary["rollout"]["instances"][-1] == {"tp": 2, "count": 1, "max_tokens": None}
    assert summary["rollout"]["instances"][0] == {"tp": 1, "count": 1, "max_tokens": 1500.0}
    t = tight.train
    assert summary["train"] == {"gpus": t.num_gpus, "tp": t.tp, "pp": t.pp, "dp": t.dp, "time_s": t.time_s}
    assert summary["rollout"]["gpus"] == tight.rollout.num_gpus and summary["makespan_s"] == tight.makespan_s


def test_a_bucket_of_a_degree_with_no_instance_placed_maps_to_no_instance() -> None:
    cfg = RunConfig()
    planner, cluster = virtual.virtual_planner(cfg), virtual.virtual_cluster(cfg)
    plan = planner.plan(virtual.prior_profile(cfg, [5, 6, 6, 5]))
    placement = place(plan, cluster)
    tps = {g.tp for g in plan.rollout.instances}
    missing = 2 if 2 not in tps else 1
    extra = InstanceGroup(tp=missing, count=1, max_tokens=math.inf)
    groups = tuple(attrs.evolve(g, max_tokens=1000.0 * (i + 1)) for i, g in enumerate(plan.rollout.instances))
    wider = attrs.evolve(plan, rollout=attrs.evolve(plan.rollout, num_gpus=99, instances=(*groups, extra)))
    mapping = virtual.bucket_instances(wider, placement)
    assert mapping[len(groups)] == []  # nothing of that degree was placed
    assert sum(len(v) for v in mapping.values()) == sum(g.count for g in groups)


def test_a_step_record_accounts_for_the_orchestrator_wall_time() -> None:
    cfg = RunConfig()
    result = SimpleNamespace(step=3, version=4, loss=0.25, start=100.0, end=112.5)
    records = {1: _traj(5, 12, version=3), 2: _traj(6, 12, version=2)}
    info = {
        "plan": {"makespan_s": 1.0},
        "decisions": [{"kind": "x"}],
        "expected": 3,
        "retried": 1,
        "requeued": 2,
        "rollout_window_s": [90.0, 110.0],
        "workers": {"rollout-tp1-0": {"busy_s": 10.0}},
        "hybrids": ("hybrid-0",),
    }
    main = {"engine": 4.0, "tools": 1.0, "train_wait": 2.0, "weights": 0.5, "switching": 0.5, "planning": 0.25}
    push = {"version": 4}
    rec = step_record(cfg, result, info, records, list(records.values()), 1, push, main=main, wall=9.0)
    assert (rec["step"], rec["policy_version"], rec["weight_version"], rec["loss"]) == (3, 3, 4, 0.25)
    assert rec["max_staleness"] == cfg.max_staleness
    assert rec["staleness"] == {"0": 1, "1": 1}  # trained on version 3: turns of versions 3 and 2
    assert rec["trajectories"] == {
        "expected": 3,
        "finished": 2,
        "lost": 1,
        "duplicated": 1,
        "retried": 1,
        "requeued": 2,
        "truncated": 0,
    }
    assert rec["train_window_s"] == [100.0, 112.5] and rec["rollout_window_s"] == [90.0, 110.0]
    assert rec["phases_s"]["rollout"] == 20.0 and rec["phases_s"]["train"] == 12.5
    assert rec["workers"]["train-0"] == {"train_s": 12.5}
    assert rec["workers"]["hybrid-0"] == {"train_s": 12.5, "hybrid": True}
    assert rec["orchestration"] == {
        "wall_s": 9.0,
        "overhead_s": 1.0,  # 9 s less the 8 s spent in engines, tools, training waits, weights and switching
        "planning_s": 0.25,
        "routing_s": 0.0,
        "records_s": 0.0,
        "checkpoint_s": 0.0,
    }
    assert rec["weights"] == push and rec["mean_reward"] == 1.0 and rec["plan"] == info["plan"]
    no_hybrids = {k: v for k, v in info.items() if k != "hybrids"}  # a run without the elastic pool
    late = SimpleNamespace(step=3, version=4, loss=0.25, start=100.123456, end=112.987654)
    empty = step_record(cfg, late, no_hybrids, {}, [], 0, push, main={}, wall=0.0)
    assert empty["mean_reward"] == 0.0 and empty["staleness"] == {} and "hybrid-0" not in empty["workers"]
    assert empty["train_window_s"] == [100.1235, 112.9877]  # to 0.1 ms
