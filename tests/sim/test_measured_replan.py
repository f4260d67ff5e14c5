"""`libra` trusts what it measured: a kind of plan (one TP degree in one bucket, or several buckets) that rolled
out slower than the planner predicted is not kept on the model's word (`Libra(measured=True)`, its default; the
ablations keep the planner's word)."""

from __future__ import annotations

import pytest
from conftest import small_scenario

from libra.planning import GlobalPlanner
from libra.planning.cost import CostModel
from libra.sim import Observation, PolicyEnv, make_policy
from libra.sim.engine import profile_of
from libra.sim.policies import plan_kind
from libra.spec import SpecError

EVERY = 3  # replan every third step


def _setup(name: str = "libra", **options):
    """search-r1 on 16 GPUs, where the planner's optimum mixes TP degrees in several buckets."""
    sc = small_scenario(workload="search-r1", gpus=16, prompts=128, samples=16)
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    env = PolicyEnv(cluster=sc.cluster, cost_model=cm, rl=sc.rl, planner=planner)
    policy = make_policy(name, env, **{"replan_every": EVERY, **options})
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    policy.initial(profile)
    return policy, planner, profile


def _run(policy, planner, profile, slowdown: float):
    """`EVERY` steps whose rollout took `slowdown` times what the planner predicts for the running plan; the last
    step's decision."""
    predicted = planner.evaluate(policy.plan, profile)[1]
    decision = None
    for step in range(EVERY):
        obs = Observation(step=step, rollout_s=slowdown * predicted, train_s=1.0, profile=lambda: profile)
        decision = policy.after_step(obs)
        assert step == EVERY - 1 or decision is None
    return decision


def test_the_optimum_here_mixes_degrees() -> None:
    policy, _, _ = _setup()
    assert plan_kind(policy.plan) == "mixed"


def test_a_mixed_plan_that_ran_slower_than_predicted_gives_way_to_the_best_single_degree() -> None:
    policy, planner, profile = _setup()
    decision = _run(policy, planner, profile, slowdown=1.6)
    assert decision is not None and len(decision.allocation.rollout) == 1
    assert plan_kind(policy.plan) == "single"
    assert policy.correction("mixed") == pytest.approx(1.6)
    assert policy.correction("single") == 1.0  # not run yet: the planner's word


def test_a_mixed_plan_that_ran_as_predicted_is_kept() -> None:
    policy, planner, profile = _setup()
    before = policy.plan
    assert _run(policy, planner, profile, slowdown=1.0) is None
    assert policy.plan is before


def test_without_measurement_the_slow_mixed_plan_is_kept() -> None:
    """The ablations (and `libra` with `measured=False`) keep the planner's word: the same slow steps change
    nothing."""
    for name, options in (("libra", {"measured": False}), ("libra-cmlfq", {})):
        policy, planner, profile = _setup(name, **options)
        before = policy.plan
        assert _run(policy, planner, profile, slowdown=1.6) is None, name
        assert policy.plan is before and policy.ratios == {"single": [], "mixed": []}


def test_the_correction_is_the_median_of_the_last_replan_interval() -> None:
    policy, planner, profile = _setup()
    predicted = planner.evaluate(policy.plan, profile)[1]
    for step, slowdown in zip((9, 10, 12), (9.0, 1.1, 1.3), strict=True):  # no replan falls on these steps
        policy.after_step(Observation(step=step, rollout_s=slowdown * predicted, train_s=1.0, profile=lambda: profile))
    assert policy.correction("mixed") == pytest.approx(1.3)  # median of 9.0, 1.1, 1.3
    policy.after_step(Observation(step=13, rollout_s=1.2 * predicted, train_s=1.0, profile=lambda: profile))
    assert policy.correction("mixed") == pytest.approx(1.2)  # median of 1.1, 1.3, 1.2: the 9.0 has left


def test_a_bad_replan_interval_is_refused() -> None:
    with pytest.raises(SpecError, match="replan_every"):
        _setup(replan_every=0)


def test_a_step_is_measured_against_the_prediction_for_its_own_work() -> None:
    """With the step's own profile given (the engine gives it), the ratio is against the plan's prediction for that
    step's work, not for the window of recent steps."""
    policy, planner, profile = _setup()
    sc = small_scenario(workload="search-r1", gpus=16, prompts=128, samples=16)
    own = profile_of([sc.source.step(5)], "own", sc.rl.global_batch)  # a drifted step: another prediction
    on_own, on_window = planner.evaluate(policy.plan, own)[1], planner.evaluate(policy.plan, profile)[1]
    assert abs(on_own / on_window - 1) > 0.05
    obs = Observation(step=0, rollout_s=1.4 * on_own, train_s=1.0, profile=lambda: profile, step_profile=lambda: own)
    policy.after_step(obs)
    assert policy.correction("mixed") == pytest.approx(1.4)
