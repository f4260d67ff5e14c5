"""Properties of the simulator's run summary (`PolicyResult.summary`, where `mean_switch_s` joined it), its notes on
moving the weights (`switch_note`, `plan_note`) and the `libra` policy's measured ratio less that move
(`Libra.after_step`, `_scored`, `correction`) that mutation testing found unchecked (docs/testing.md, "Mutation
testing", 2026-12-06)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import small_scenario

from libra.planning import GlobalPlanner, ReplanGate
from libra.planning.cost import CostModel
from libra.sim import Observation, PolicyEnv, PolicyResult, Scenario, StageRecord, WorkSource, make_policy
from libra.sim.engine import profile_of, weight_sync_s
from libra.sim.policies import Libra, plan_kind
from libra.sim.report import plan_note, switch_note
from libra.spec import ClusterSpec, Plan, RLSettings, get_gpu, get_model
from libra.workloads.trace import Trajectory, Turn, write_trace

_WHERE = 'docs/sim.md, "`libra plan` against `libra simulate`"'


def _stage(step: int, start: float, end: float, **fields) -> StageRecord:
    base = dict(
        rollout_s=0.0, train_s=0.0, train_gpus=8, rollout_gpus=8, lent_gpu_s=0.0, borrowed_gpu_s=0.0, busy_gpu_s=0.0,
        available_gpu_s=0.0, tokens=0, gen_tokens=0, trajectories=0, migrations=0, migrated_tokens=0,
        rebalanced_tokens=0, reconfiguration_s=0.0, staleness=1, trained=False,
    )  # fmt: skip
    return StageRecord(step=step, start=start, end=end, **{**base, **fields})


def test_a_run_shorter_than_a_second_has_its_rates() -> None:
    """Rates over a wall time, GPU-seconds or a decode capacity under one unit are rates all the same (a tiny trace
    on a fast cluster runs in milliseconds): only a zero is left out."""
    records = (
        _stage(0, 0.0, 0.02, rollout_s=0.02, busy_gpu_s=0.16, available_gpu_s=0.32, tokens=10, gen_tokens=6,
               trajectories=4, decoded_tokens=0.3, decode_capacity_tokens=0.6, switch_s=0.01),
        _stage(1, 0.02, 0.05, rollout_s=0.03, train_s=0.02, busy_gpu_s=0.3, available_gpu_s=0.48, tokens=20,
               gen_tokens=12, trajectories=4, trained=True, decoded_tokens=0.2, decode_capacity_tokens=0.3),
    )  # fmt: skip
    s = PolicyResult(name="p", records=records, decisions=({"step": 0},), num_gpus=16).summary()
    assert s["throughput_tok_s"] == pytest.approx(30 / 0.05) and s["gen_throughput_tok_s"] == pytest.approx(18 / 0.05)
    assert s["steady_throughput_tok_s"] == pytest.approx(20 / 0.03)  # step 1 alone: 0.03 s
    assert s["gpu_idle_fraction"] == pytest.approx(1.0 - 0.46 / 0.8) and s["utilisation"] == pytest.approx(0.5 / 0.9)
    assert s["mean_step_s"] == pytest.approx(0.025) and s["mean_switch_s"] == pytest.approx(0.005)


def test_a_run_of_one_step_takes_its_wall_time_a_step() -> None:
    one = (_stage(0, 0.0, 40.0, rollout_s=40.0, available_gpu_s=640.0, tokens=5, trajectories=1, switch_s=3.0),)
    s = PolicyResult(name="p", records=one, decisions=({"step": 0},), num_gpus=16).summary()
    assert s["mean_step_s"] == 40.0 and s["mean_switch_s"] == 3.0 and s["steps"] == 1


def test_a_run_with_no_stage_has_no_rate() -> None:
    s = PolicyResult(name="p", records=(), decisions=(), num_gpus=16).summary()
    assert s["throughput_tok_s"] == s["gen_throughput_tok_s"] == s["gpu_idle_fraction"] == s["utilisation"] == 0.0
    assert s["mean_step_s"] == s["mean_switch_s"] == 0.0 and s["steady_throughput_tok_s"] is None


def test_the_switch_note_names_each_policy_once_by_its_seconds_a_step() -> None:
    """Policies that move the weights for the same tenth of a second share a group, groups in the table's order,
    one `; ` between groups; a policy that moves them for a fraction of a second is named, one that never moves them
    is not."""
    summary = {
        name: {"mean_switch_s": secs}
        for name, secs in (("a", 13.5), ("none", 0.0), ("b", 13.54), ("c", 0.25), ("d", 13.46))
    }
    assert switch_note(summary) == (
        "note: the simulated steps include moving the weights between training and rollout "
        f"(a, b, d 13.5 s a step; c 0.2 s a step), which the makespan of `libra plan` leaves out ({_WHERE})"
    )


def test_the_plan_note_gives_the_broadcast_each_asynchronous_step_waits_for() -> None:
    sc = small_scenario()
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    assert plan_note(cm) == (
        "note: the makespan is training against rollout alone; each asynchronous step also waits "
        f"{weight_sync_s(cm):.1f} s for the weight broadcast before its rollout, which `libra simulate` includes "
        f"({_WHERE})"
    )


def _libra_policy(name: str, env: PolicyEnv, **options: Any) -> Libra:
    """`make_policy` for `libra` and its ablations, typed as the `Libra` they are."""
    policy = make_policy(name, env, **options)
    assert isinstance(policy, Libra)
    return policy


def _plan(policy: Libra) -> Plan:
    """The plan the policy runs (it has one after `initial`)."""
    assert policy.plan is not None
    return policy.plan


def _libra(replan_every: int = 3):
    """`libra` on search-r1 over 16 GPUs (as test_measured_broadcast.py): its initial plan mixes TP degrees."""
    sc = small_scenario(workload="search-r1", gpus=16, prompts=128, samples=16)
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    env = PolicyEnv(cluster=sc.cluster, cost_model=cm, rl=sc.rl, planner=planner)
    policy = _libra_policy("libra", env, replan_every=replan_every)
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    policy.initial(profile)
    return policy, planner, profile, weight_sync_s(cm)


def test_before_any_measured_step_a_plan_scores_as_the_planner_evaluates_it() -> None:
    """No step measured: no correction and no move of the weights added (the score is the planner's makespan)."""
    policy, planner, profile, _ = _libra()
    assert policy._scored(policy.plan, profile) == max(planner.evaluate(policy.plan, profile))


def test_a_step_that_was_all_weight_move_is_not_measured() -> None:
    """A rollout no longer than its move of the weights measured no rollout: it adds no ratio and leaves the move
    the plans are scored with as it was."""
    policy, planner, profile, sync = _libra()
    obs = Observation(step=0, rollout_s=sync, train_s=1.0, profile=lambda: profile, switch_s=sync)
    assert policy.after_step(obs) is None
    assert policy.ratios == {"single": [], "mixed": []} and policy.switch_s == 0.0
    assert policy.correction("mixed") == 1.0


def test_the_correction_is_the_median_of_the_kinds_last_replan_every_ratios() -> None:
    """Ratios older than `replan_every` steps drop out; plans of the other kind keep 1. (Steps 0, 1, 3, 4: none of
    them ends a replan period, so the same plan runs throughout.)"""
    policy, planner, profile, sync = _libra(replan_every=3)
    predicted = planner.evaluate(policy.plan, profile)[1]
    for step, ratio in ((0, 5.0), (1, 1.1), (3, 1.2), (4, 1.4)):
        obs = Observation(step=step, rollout_s=sync + ratio * predicted, train_s=1.0, profile=lambda: profile,
                          switch_s=sync)  # fmt: skip
        assert policy.after_step(obs) is None
    assert policy.correction("mixed") == pytest.approx(1.2) and policy.correction("single") == 1.0


def _tiny_libra(tmp_path: Path, name: str = "libra", **options):
    """`libra` (or an ablation) on one step of 88 one-token trajectories over 48 A800s (test_plan_vs_sim.py's tiny
    step): its plan predicts a rollout of well under a second."""
    path = tmp_path / "tiny.jsonl"
    write_trace(
        path, [Trajectory(prompt_id=f"p-{i % 8}", prompt_tokens=1, turns=(Turn(gen_tokens=1),)) for i in range(88)]
    )
    sc = Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=22, samples_per_prompt=4),
        source=WorkSource.from_trace(path),
    )
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    env = PolicyEnv(cluster=sc.cluster, cost_model=cm, rl=sc.rl, planner=planner)
    policy = _libra_policy(name, env, **options)
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    policy.initial(profile)
    return policy, planner, profile, weight_sync_s(cm)


def test_a_rollout_shorter_than_a_second_is_measured_too(tmp_path) -> None:
    """A plan predicted at a fraction of a second, run 1.5 times slower after its broadcast, reads 1.5: the ratio is
    the rollout's however short, in any unit of time."""
    policy, planner, profile, sync = _tiny_libra(tmp_path, replan_every=5)
    predicted = planner.evaluate(policy.plan, profile)[1]
    assert 0.0 < 1.5 * predicted < 1.0
    obs = Observation(step=0, rollout_s=sync + 1.5 * predicted, train_s=1.0, profile=lambda: profile, switch_s=sync)
    assert policy.after_step(obs) is None
    assert policy.correction(plan_kind(policy.plan)) == pytest.approx(1.5)


def test_a_homogeneous_policy_that_measures_still_runs_one_degree() -> None:
    """`libra-homogeneous` told to measure: however slow its single-degree plan ran, a replan considers
    single-degree plans only (the mixed optimum is not its to take)."""
    sc = small_scenario(workload="search-r1", gpus=16, prompts=128, samples=16)
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    env = PolicyEnv(cluster=sc.cluster, cost_model=cm, rl=sc.rl, planner=planner)
    policy = _libra_policy("libra-homogeneous", env, replan_every=1, measured=True)
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    policy.initial(profile)
    assert plan_kind(_plan(policy)) == "single" and plan_kind(planner.plan(profile)) == "mixed"
    predicted = planner.evaluate(_plan(policy), profile)[1]
    sync = weight_sync_s(cm)
    obs = Observation(step=0, rollout_s=sync + 4.0 * predicted, train_s=1.0, profile=lambda: profile, switch_s=sync)
    policy.after_step(obs)
    assert policy.ratios["single"] == [pytest.approx(4.0)] and plan_kind(_plan(policy)) == "single"


def _slow_steps(policy, planner, profile, sync: float, slowdown: float, steps: int = 3):
    """`steps` steps whose rollout after the broadcast took `slowdown` times the running plan's prediction; the
    decisions."""
    predicted = planner.evaluate(policy.plan, profile)[1]
    return [
        policy.after_step(
            Observation(
                step=s, rollout_s=sync + slowdown * predicted, train_s=1.0, profile=lambda: profile, switch_s=sync
            )  # fmt: skip
        )
        for s in range(steps)
    ]


def test_a_replan_decision_is_the_gates_verdict_on_the_two_scores() -> None:
    """A mixed plan that ran 1.6x slower gives way (test_measured_replan.py); the decision applies from the next
    step, on the candidate's C-MLFQ allocation, with the reason, saving and cost of a gate built from the policy's
    own settings (the env's switch times, its gain threshold, the elastic join) on the two plans as scored."""
    policy, planner, profile, sync = _libra()
    policy = _libra_policy("libra", policy.env, replan_every=3, min_relative_gain=0.07)
    policy.initial(profile)
    before = _plan(policy)
    *quiet, decision = _slow_steps(policy, planner, profile, sync, slowdown=1.6)
    assert quiet == [None, None] and decision is not None and policy.plan is not before
    gate = ReplanGate(
        to_rollout_s=policy.env.to_rollout_s, to_training_s=policy.env.to_training_s, min_relative_gain=0.07,
        nonblocking_join=True,
    )  # fmt: skip
    verdict = gate.decide(
        current=before, candidate=_plan(policy), horizon_steps=3, current_makespan_s=policy._scored(before, profile),
        candidate_makespan_s=policy._scored(_plan(policy), profile),
    )  # fmt: skip
    assert verdict.apply and verdict.cost_s > 0.0
    assert decision.step == 3 and decision.allocation.routing == "cmlfq"
    assert (decision.reason, decision.saving_s, decision.cost_s) == (verdict.reason, verdict.saving_s, verdict.cost_s)


def test_a_candidate_the_gate_refuses_is_not_applied() -> None:
    """The same slow steps with a gain threshold no plan meets: the gate says no, and the plan stays."""
    policy, planner, profile, sync = _libra()
    policy = _libra_policy("libra", policy.env, replan_every=3, min_relative_gain=0.99)
    policy.initial(profile)
    before = _plan(policy)
    assert _slow_steps(policy, planner, profile, sync, slowdown=1.6) == [None, None, None]
    assert policy.plan is before


def test_a_policy_with_no_plan_yet_decides_nothing() -> None:
    policy, planner, profile, sync = _libra()
    fresh = _libra_policy("libra", policy.env, replan_every=1)
    obs = Observation(step=0, rollout_s=sync + 1.0, train_s=1.0, profile=lambda: profile, switch_s=sync)
    assert fresh.after_step(obs) is None and fresh.plan is None and fresh.ratios == {"single": [], "mixed": []}


@pytest.mark.parametrize(("gain", "applies"), [(0.1, True), (0.5, False)])
def test_an_ablation_replans_as_the_planner_does_with_its_own_gate_and_period(gain, applies) -> None:
    """`libra-cmlfq` (no measurement) on a newer profile that gains about 18 %: its decision is the planner's
    `replan` with the policy's gate (its gain threshold: 10 % applies, 50 % refuses) over `replan_every` steps."""
    policy, planner, profile, _ = _libra()
    policy = _libra_policy("libra-cmlfq", policy.env, replan_every=3, min_relative_gain=gain)
    policy.initial(profile)
    before = _plan(policy)
    sc = small_scenario(workload="search-r1", gpus=16, prompts=128, samples=16, seed=1)
    newer = profile_of([sc.source.step(3)], "p", sc.rl.global_batch)
    decisions = [
        policy.after_step(Observation(step=s, rollout_s=100.0, train_s=1.0, profile=lambda: newer)) for s in range(3)
    ]
    candidate, verdict = planner.replan(before, newer, gate=ReplanGate(min_relative_gain=gain), horizon_steps=3)
    assert verdict.apply is applies and decisions[:2] == [None, None]
    if not applies:
        assert decisions[2] is None and policy.plan is before
        return
    decision = decisions[2]
    assert decision is not None and _plan(policy).rollout == candidate.rollout
    assert (decision.reason, decision.saving_s, decision.cost_s) == (verdict.reason, verdict.saving_s, verdict.cost_s)


@pytest.mark.parametrize(("name", "elastic"), [("libra", True), ("libra-cmlfq", False)])
def test_the_gate_charges_the_envs_switch_times_and_the_policys_threshold(name, elastic) -> None:
    """The policy's gate prices a reconfiguration with the env's times (not the gate's defaults), its gain threshold,
    and lets a joining replica sync without blocking only in `libra`'s elastic pool."""
    policy, _, _, _ = _libra()
    env = attrs.evolve(policy.env, to_rollout_s=25.0, to_training_s=17.0)
    gate = _libra_policy(name, env, min_relative_gain=0.07).gate
    assert gate == ReplanGate(to_rollout_s=25.0, to_training_s=17.0, min_relative_gain=0.07, nonblocking_join=elastic)
