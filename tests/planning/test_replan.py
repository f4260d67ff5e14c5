"""The replan gate applies a candidate only when its saving over the horizon pays for reconfiguration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libra.planning import ReplanGate
from libra.spec import InstanceGroup, Plan, RolloutConfig, TrainConfig


def _plan(train_gpus: int, makespan: float, mix=((1, 8),)) -> Plan:
    rollout_gpus = sum(tp * c for tp, c in mix)
    groups = tuple(InstanceGroup(tp=tp, count=c, max_tokens=1000.0 * (i + 1)) for i, (tp, c) in enumerate(mix))
    return Plan(
        train=TrainConfig(num_gpus=train_gpus, tp=1, pp=1, dp=train_gpus, time_s=makespan),
        rollout=RolloutConfig(num_gpus=rollout_gpus, time_s=makespan, instances=groups),
        makespan_s=makespan,
    )


def test_applies_when_saving_exceeds_cost() -> None:
    gate = ReplanGate()
    current, candidate = _plan(8, 100.0), _plan(4, 80.0, mix=((1, 8), (4, 1)))
    d = gate.decide(current=current, candidate=candidate, horizon_steps=10)
    assert d.apply and d.saving_s == pytest.approx(200.0) and d.cost_s == pytest.approx(10.8)
    assert d.gpus_to_rollout == 4 and d.gpus_to_training == 0


def test_rejects_small_relative_gain_and_short_horizons() -> None:
    gate = ReplanGate()
    current = _plan(8, 100.0)
    small = gate.decide(current=current, candidate=_plan(4, 97.0, mix=((1, 12),)), horizon_steps=100)
    assert not small.apply and "threshold" in small.reason
    short = gate.decide(current=current, candidate=_plan(4, 90.0, mix=((1, 12),)), horizon_steps=1)
    assert not short.apply and "does not cover" in short.reason


def test_uses_the_drifted_makespan_of_the_current_plan() -> None:
    gate = ReplanGate()
    current, candidate = _plan(8, 100.0), _plan(8, 100.0, mix=((2, 4),))
    stale = gate.decide(current=current, candidate=candidate, horizon_steps=10)
    drifted = gate.decide(current=current, candidate=candidate, horizon_steps=10, current_makespan_s=150.0)
    assert not stale.apply and drifted.apply


def test_moving_gpus_into_training_costs_less_with_a_nonblocking_elastic_join() -> None:
    current, candidate = _plan(4, 100.0, mix=((1, 8),)), _plan(8, 90.0, mix=((1, 4),))
    blocking = ReplanGate().reconfiguration_cost(current, candidate)[0]
    elastic = ReplanGate(nonblocking_join=True).reconfiguration_cost(current, candidate)[0]
    assert blocking == pytest.approx(10.8 + 8.0) and elastic == pytest.approx(10.8)


@given(cur=st.floats(1, 1e4), new=st.floats(1, 1e4), horizon=st.integers(1, 100))
def test_decision_is_consistent_with_its_own_numbers(cur: float, new: float, horizon: int) -> None:
    gate = ReplanGate()
    d = gate.decide(current=_plan(8, cur), candidate=_plan(4, new, mix=((1, 12),)), horizon_steps=horizon)
    assert d.apply == (d.saving_s > d.cost_s and (cur - new) / cur >= gate.min_relative_gain)


def _variant(train_gpus: int, mix, idle: int = 0, tp: int = 1, makespan: float = 100.0) -> Plan:
    plan = _plan(train_gpus, makespan, mix)
    train = TrainConfig(num_gpus=train_gpus, tp=tp, pp=1, dp=train_gpus // tp, time_s=makespan)
    rollout = RolloutConfig(num_gpus=plan.rollout.num_gpus + idle, time_s=makespan, instances=plan.rollout.instances)
    return Plan(train=train, rollout=rollout, makespan_s=makespan)


_VARIANTS = [
    _variant(8, ((1, 8),)),
    _variant(8, ((1, 8),), idle=1),  # one more rollout GPU, same instances
    _variant(9, ((1, 8),)),  # one more training GPU
    _variant(8, ((1, 8),), tp=2),  # same GPUs, another training layout
    _variant(4, ((1, 8), (4, 1))),
    _variant(8, ((2, 4),)),
    _variant(7, ((1, 9),)),
]


@pytest.mark.parametrize("nonblocking", [False, True])
def test_reconfiguration_cost_follows_its_definition_on_every_pair(nonblocking: bool) -> None:
    """Written out from the module's docstring: rollout restarts when a GPU turns into rollout or the instance mix
    changes; training pays when a GPU turns into training (unless the pool joins without blocking) or the layout
    changes."""
    gate = ReplanGate(to_rollout_s=10.0, to_training_s=3.0, nonblocking_join=nonblocking)
    for current in _VARIANTS:
        for candidate in _VARIANTS:
            to_rollout = max(0, candidate.rollout.num_gpus - current.rollout.num_gpus)
            to_training = max(0, candidate.train.num_gpus - current.train.num_gpus)
            mix = lambda p: sorted((g.tp, g.count) for g in p.rollout.instances)  # noqa: E731
            expected = 0.0
            if to_rollout > 0 or mix(current) != mix(candidate):
                expected += 10.0
            layout = lambda p: (p.train.tp, p.train.pp, p.train.ep)  # noqa: E731
            if layout(current) != layout(candidate) or (to_training > 0 and not nonblocking):
                expected += 3.0
            assert gate.reconfiguration_cost(current, candidate) == (expected, to_rollout, to_training)


def test_gate_boundaries() -> None:
    gate = ReplanGate(to_rollout_s=10.0, to_training_s=3.0, min_relative_gain=0.05)
    a, b = _variant(8, ((1, 8),)), _variant(8, ((2, 4),))  # cost 10 s (mix changes)

    def decide(t_cur: float, t_new: float, horizon: int):
        return gate.decide(
            current=a, candidate=b, horizon_steps=horizon, current_makespan_s=t_cur, candidate_makespan_s=t_new
        )

    assert not decide(100.0, 100.0, 1000).apply and "not faster" in decide(100.0, 100.0, 1000).reason  # gain 0
    assert decide(5.0, 4.5, 1000).apply  # a gain of 0.5 s (10 %) that pays over the horizon
    assert decide(100.0, 95.0, 1000).apply  # exactly the 5 % threshold: enough
    tie = decide(100.0, 90.0, 1)  # saving 10 s == cost 10 s: not enough
    assert not tie.apply and "does not cover" in tie.reason
    assert decide(0.5, 0.4, 1000).apply  # sub-second steps still have a relative gain (20 %)
    zero = decide(0.0, 0.0, 10)  # no division by a zero makespan
    assert not zero.apply and zero.saving_s == 0.0
    with pytest.raises(ValueError, match="horizon_steps must be >= 1, got 0"):
        decide(100.0, 50.0, 0)


def test_a_candidate_that_does_not_fit_is_never_applied_and_an_unfit_current_plan_is_replaced() -> None:
    """Both plans infinite (neither fits the newest profile): inf - inf is NaN, which every comparison let through
    to "apply"; a current plan that no longer fits is replaced by any candidate that does, with that reason."""
    inf = float("inf")
    gate = ReplanGate()
    current, candidate = _plan(8, 100.0), _plan(4, 80.0, mix=((1, 8), (4, 1)))
    for cur in (inf, 100.0, float("nan")):
        for new in (inf, float("nan")):
            d = gate.decide(
                current=current, candidate=candidate, horizon_steps=10, current_makespan_s=cur, candidate_makespan_s=new
            )
            assert not d.apply and d.reason == "the candidate does not fit the newest profile either"
    d = gate.decide(current=current, candidate=candidate, horizon_steps=10, current_makespan_s=inf)
    assert d.apply and d.reason == "the current plan no longer fits the newest profile; the candidate takes 80.0 s"


@pytest.mark.parametrize("field", ["to_rollout_s", "to_training_s", "min_relative_gain"])
@pytest.mark.parametrize("value", [-5.0, float("nan"), float("inf"), "8", True])
def test_gate_costs_are_finite_non_negative_numbers(field: str, value) -> None:
    from libra.spec import SpecError

    with pytest.raises(SpecError, match=f"ReplanGate.{field} must be a number >= 0"):
        ReplanGate(**{field: value})
