"""The join state machine: legal transitions, typed errors for illegal ones, every transition logged."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libra.elastic.states import (
    TRANSITIONS,
    IllegalTransition,
    JoinEvent,
    JoinState,
    WorkerStates,
    next_state,
)


def test_happy_path_and_leave():
    ws = WorkerStates()
    path = [JoinEvent.REQUEST, JoinEvent.START_FETCH, JoinEvent.RESTORED, JoinEvent.CAUGHT_UP, JoinEvent.LEAVE]
    for i, event in enumerate(path):
        ws.apply("h0", event, step=i, why=f"because {i}")
    assert [t.dst for t in ws.log] == [
        JoinState.REQUESTED,
        JoinState.FETCHING_STATE,
        JoinState.PLACEHOLDER,
        JoinState.ACTIVE,
        JoinState.ROLLOUT,
    ]
    assert [(t.worker, t.step, t.why) for t in ws.log][-1] == ("h0", 4, "because 4")


@pytest.mark.parametrize("state", [s for s in JoinState if s != JoinState.FAILED])
def test_failure_is_legal_from_every_live_state(state):
    assert next_state(state, JoinEvent.FAIL, worker="w", step=0) == JoinState.FAILED


@pytest.mark.parametrize("state", [JoinState.REQUESTED, JoinState.FETCHING_STATE, JoinState.PLACEHOLDER])
def test_cancel_from_every_joining_state_returns_to_rollout(state):
    assert next_state(state, JoinEvent.CANCEL, worker="w", step=0) == JoinState.ROLLOUT


def test_every_pair_outside_the_table_is_a_typed_error():
    illegal = [(s, e) for s, e in itertools.product(JoinState, JoinEvent) if (s, e) not in TRANSITIONS]
    assert len(illegal) > 20
    for state, event in illegal:
        with pytest.raises(IllegalTransition) as info:
            next_state(state, event, worker="hybrid-3", step=17)
        err = info.value
        assert (err.worker, err.state, err.event, err.step) == ("hybrid-3", state, event, 17)
        assert "hybrid-3" in str(err) and state.value in str(err) and event.value in str(err)


def test_active_cannot_skip_to_active_without_catch_up():
    ws = WorkerStates()
    ws.apply("h", JoinEvent.REQUEST, step=0, why="")
    with pytest.raises(IllegalTransition):
        ws.apply("h", JoinEvent.CAUGHT_UP, step=0, why="")
    assert ws.state("h") == JoinState.REQUESTED and len(ws.log) == 1


@given(st.lists(st.sampled_from(list(JoinEvent)), max_size=40))
def test_log_is_a_consistent_chain(events):
    ws = WorkerStates()
    applied = 0
    for step, event in enumerate(events):
        try:
            ws.apply("w", event, step=step, why="prop")
            applied += 1
        except IllegalTransition:
            pass
    assert len(ws.log) == applied
    prev = JoinState.ROLLOUT
    for t in ws.log:
        assert t.src == prev and TRANSITIONS[(t.src, t.event)] == t.dst
        prev = t.dst
    assert ws.state("w") == prev


def test_log_limit_bounds_memory():
    ws = WorkerStates(log_limit=3)
    for i in range(5):
        ws.apply("w", JoinEvent.FAIL, step=i, why="")
        ws.apply("w", JoinEvent.RECOVER, step=i, why="")
    assert len(ws.log) == 3 and ws.log[-1].step == 4
