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
