"""The elastic controller's decisions worked out by hand, field by field (scripts/mutation.sh elastic_control).

The tests of test_elastic_controller.py check the decisions' kinds and order; these pin every field a decision
carries (worker, step, why, GPUs, paired core), the names that errors and logs give, and plans whose worker names
sort in an order the other tests never use (a core replica before the hybrids)."""

from __future__ import annotations

import logging

import attrs
import pytest

from libra.elastic import (
    CancelJoin,
    CoreTopologyChange,
    ElasticController,
    IllegalTransition,
    JoinEvent,
    JoinState,
    JoinTraining,
    LeaveTraining,
    Placement,
    Pool,
    Role,
    StartInstance,
    StopInstance,
    Transition,
    UnknownWorker,
    WorkerPlacement,
)
from libra.elastic.states import WorkerStates

R, T = Role.ROLLOUT_INSTANCE, Role.TRAIN_REPLICA


def W(name, role, pool, gpus, tp=1):  # noqa: N802
    return WorkerPlacement(name=name, role=role, tp=tp, gpu_ids=tuple(gpus), pool=pool)


# the core replicas sort first here, the hybrids last (test_elastic_controller.py's names sort the other way)
BASE = Placement(
    workers=(
        W("a-core-0", T, Pool.CORE_TRAIN, [0, 1], tp=2),
        W("a-core-1", T, Pool.CORE_TRAIN, [2, 3], tp=2),
        W("m-roll-0", R, Pool.CORE_ROLLOUT, [4, 5], tp=2),
        W("m-roll-1", R, Pool.CORE_ROLLOUT, [6]),
        W("z-hyb-0", R, Pool.HYBRID, [7]),
        W("z-hyb-1", R, Pool.HYBRID, [8]),
        W("z-hyb-2", R, Pool.HYBRID, [9]),
        W("z-hyb-3", R, Pool.HYBRID, [10]),
    )
)


def changed(p: Placement, **by_name: dict) -> Placement:
    """`p` with the named workers' fields replaced (None: the worker removed)."""
    out = []
    for w in p.workers:
        if w.name not in by_name:
            out.append(w)
        elif by_name[w.name] is not None:
            out.append(attrs.evolve(w, **by_name[w.name]))
    return Placement(workers=tuple(out))


def test_a_hybrid_named_after_the_core_replicas_is_still_borrowed():
    c = ElasticController(placement=BASE)
    d = c.apply_plan(changed(BASE, **{"z-hyb-2": {"role": T}}), step=4, why="w")
    assert d == (
        StopInstance(worker="z-hyb-2", step=4, why="borrowed for training: w"),
        JoinTraining(worker="z-hyb-2", gpu_ids=(9,), paired_core="a-core-0", step=4, why="w"),
    )
    assert c.pairs == {"z-hyb-2": "a-core-0"}
    assert c.states.in_state(JoinState.REQUESTED) == ("z-hyb-2",)


def test_a_core_rollout_diff_worked_out_field_by_field():
    c = ElasticController(placement=BASE)
    new = Placement(
        workers=changed(BASE, **{"m-roll-0": {"tp": 1, "gpu_ids": (4,)}, "m-roll-1": None}).workers
        + (W("m-roll-2", R, Pool.CORE_ROLLOUT, [5]), W("m-roll-3", R, Pool.CORE_ROLLOUT, [6]))
    )
    d = c.apply_plan(new, step=12, why="new mix")
    assert d == (
        StopInstance(worker="m-roll-0", step=12, why="new mix"),  # changed: stopped, then started as it is now
        StartInstance(worker="m-roll-0", tp=1, gpu_ids=(4,), step=12, why="new mix"),
        StopInstance(worker="m-roll-1", step=12, why="new mix"),  # gone: stopped only
        StartInstance(worker="m-roll-2", tp=1, gpu_ids=(5,), step=12, why="new mix"),  # new: started only
        StartInstance(worker="m-roll-3", tp=1, gpu_ids=(6,), step=12, why="new mix"),
    )
    assert c.placement == new
    # the same TP on other GPUs is a change too; the same TP on the same GPUs is none
    moved = changed(new, **{"m-roll-2": {"gpu_ids": (11,)}})
    assert c.apply_plan(moved, step=13, why="gpus") == (
        StopInstance(worker="m-roll-2", step=13, why="gpus"),
        StartInstance(worker="m-roll-2", tp=1, gpu_ids=(11,), step=13, why="gpus"),
    )
    assert c.apply_plan(moved, step=14, why="same") == ()


def test_a_plan_the_controller_cannot_carry_out_changes_nothing():
    c = ElasticController(placement=BASE)
    c.borrow("z-hyb-3", step=1, why="x")
    borrowed = c.placement
    assert c.apply_plan(borrowed, step=2, why="same") == ()  # still training, same GPUs: nothing to do
    log, pairs = list(c.states.log), dict(c.pairs)
    # z-hyb-0 (borrowed by this plan, and first by name) must not be left half-joined when z-hyb-3's move is refused
    move = changed(borrowed, **{"z-hyb-0": {"role": T}, "z-hyb-3": {"gpu_ids": (12,)}})
    with pytest.raises(
        ValueError, match=r"^worker 'z-hyb-3' trains on GPUs \(10,\) \(TP 1\); the new plan puts it on \(12,\)"
    ):
        c.apply_plan(move, step=3, why="move")
    assert list(c.states.log) == log and c.pairs == pairs and c.placement == borrowed
    c.on_event("z-hyb-2", JoinEvent.FAIL, step=3, why="died")  # a failed worker cannot join before it recovers
    log, pairs = list(c.states.log), dict(c.pairs)
    with pytest.raises(IllegalTransition, match="'z-hyb-2' at step 4: event 'request' is illegal in state 'failed'"):
        c.apply_plan(changed(c.placement, **{"z-hyb-0": {"role": T}, "z-hyb-2": {"role": T}}), step=4, why="both")
    with pytest.raises(CoreTopologyChange, match="'m-roll-1' would train"):
        c.apply_plan(changed(c.placement, **{"z-hyb-0": {"role": T}, "m-roll-1": {"role": T}}), step=4, why="both")
    assert c.placement.by_name()["z-hyb-3"] == borrowed.by_name()["z-hyb-3"]
    assert c.placement.by_name()["z-hyb-0"].role == R and c.states.state("z-hyb-0") == JoinState.ROLLOUT
    assert list(c.states.log) == log and c.pairs == pairs


def test_joins_pair_with_the_least_loaded_core_replica_then_by_name():
    c = ElasticController(placement=BASE)
    paired = [c.borrow(f"z-hyb-{i}", step=i, why="more")[-1].paired_core for i in range(4)]
    assert paired == ["a-core-0", "a-core-1", "a-core-0", "a-core-1"]
    c.release("z-hyb-1", step=5, why="back")  # a-core-1 now has one, a-core-0 two
    c.release("z-hyb-3", step=5, why="back")  # a-core-1 none
    assert c.borrow("z-hyb-1", step=6, why="again")[-1].paired_core == "a-core-1"
    assert c.borrow("z-hyb-3", step=6, why="again")[-1].paired_core == "a-core-1"  # 2 against 1


def test_every_release_and_event_carries_its_step_and_why():
    c = ElasticController(placement=BASE)
    c.borrow("z-hyb-0", step=3, why="borrow")
    c.borrow("z-hyb-1", step=3, why="borrow")
    assert c.on_event("z-hyb-0", JoinEvent.START_FETCH, step=4, why="fetch") == ()
    assert c.release("z-hyb-0", step=5, why="cancel it") == (
        CancelJoin(worker="z-hyb-0", paired_core="a-core-0", step=5, why="cancel it"),
        StartInstance(worker="z-hyb-0", tp=1, gpu_ids=(7,), step=5, why="back to rollout: cancel it"),
    )
    for event in (JoinEvent.START_FETCH, JoinEvent.RESTORED, JoinEvent.CAUGHT_UP):
        c.on_event("z-hyb-1", event, step=6, why=event.value)
    assert c.release("z-hyb-1", step=7, why="leave") == (
        LeaveTraining(worker="z-hyb-1", paired_core="a-core-1", step=7, why="leave"),
        StartInstance(worker="z-hyb-1", tp=1, gpu_ids=(8,), step=7, why="back to rollout: leave"),
    )
    assert [(t.worker, t.step, t.src.value, t.dst.value, t.event.value, t.why) for t in c.states.log] == [
        ("z-hyb-0", 3, "rollout", "requested", "request", "borrow"),
        ("z-hyb-1", 3, "rollout", "requested", "request", "borrow"),
        ("z-hyb-0", 4, "requested", "fetching_state", "start_fetch", "fetch"),
        ("z-hyb-0", 5, "fetching_state", "rollout", "cancel", "cancel it"),
        ("z-hyb-1", 6, "requested", "fetching_state", "start_fetch", "start_fetch"),
        ("z-hyb-1", 6, "fetching_state", "placeholder", "restored", "restored"),
        ("z-hyb-1", 6, "placeholder", "active", "caught_up", "caught_up"),
        ("z-hyb-1", 7, "active", "rollout", "leave", "leave"),
    ]
    assert c.pairs == {}
    assert {w.name: w.role for w in c.placement.workers if w.pool == Pool.HYBRID} == dict.fromkeys(
        ("z-hyb-0", "z-hyb-1", "z-hyb-2", "z-hyb-3"), R
    )


def test_a_failure_observed_from_the_runtime_is_logged_at_its_step():
    c = ElasticController(placement=BASE)
    c.borrow("z-hyb-2", step=1, why="x")
    t = Transition(
        worker="z-hyb-2", step=8, src=JoinState.REQUESTED, dst=JoinState.FAILED, event=JoinEvent.FAIL, why="died"
    )
    assert c.observe(t) == ()
    assert c.states.log[-1] == t
    assert c.pairs == {} and c.placement.by_name()["z-hyb-2"].role == R
    assert c.states.in_state(JoinState.FAILED) == ("z-hyb-2",)


def test_observe_ignores_a_worker_outside_the_placement_and_warns_of_a_stale_one(caplog):
    c = ElasticController(placement=BASE)
    ghost = Transition(
        worker="nobody", step=1, src=JoinState.ROLLOUT, dst=JoinState.FAILED, event=JoinEvent.FAIL, why=""
    )
    assert c.observe(ghost) == () and list(c.states.log) == []
    c.borrow("z-hyb-0", step=1, why="x")
    stale = Transition(
        worker="z-hyb-0", step=2, src=JoinState.PLACEHOLDER, dst=JoinState.ACTIVE, event=JoinEvent.CAUGHT_UP, why=""
    )
    with caplog.at_level(logging.WARNING, logger="libra.elastic.controller"):
        assert c.observe(stale) == ()
    assert c.states.state("z-hyb-0") == JoinState.REQUESTED
    (record,) = [r for r in caplog.records if r.name == "libra.elastic.controller"]
    assert record.getMessage() == f"elastic: ignoring stale runtime transition {stale} (controller holds requested)"


def test_errors_name_what_is_wrong():
    c = ElasticController(placement=BASE)
    with pytest.raises(UnknownWorker) as e:
        c.borrow("m-roll-0", step=0, why="")
    assert e.value.args[0] == (
        "'m-roll-0' is not a hybrid worker of the current placement; hybrids: ['z-hyb-0', 'z-hyb-1', 'z-hyb-2', "
        "'z-hyb-3']"
    )
    c.borrow("z-hyb-0", step=0, why="")
    with pytest.raises(ValueError, match=r"^worker 'z-hyb-0' is already borrowed \(state 'requested'\)$"):
        c.borrow("z-hyb-0", step=1, why="")
    with pytest.raises(ValueError, match=r"^worker 'z-hyb-1' is not in training \(state 'rollout'\)$"):
        c.release("z-hyb-1", step=1, why="")
    with pytest.raises(CoreTopologyChange, match=r"the new plan changes \['a-core-1'\]$"):
        c.apply_plan(changed(c.placement, **{"a-core-1": None}), step=1, why="")
    with pytest.raises(CoreTopologyChange, match=r"the new plan changes \['a-core-2'\]$"):
        extra = W("a-core-2", T, Pool.CORE_TRAIN, [11])
        c.apply_plan(Placement(workers=(*c.placement.workers, extra)), step=1, why="")
    with pytest.raises(CoreTopologyChange, match=r"^worker 'm-roll-1' would train in pool 'core_rollout'; only"):
        c.apply_plan(changed(c.placement, **{"m-roll-1": {"role": T}}), step=1, why="")
    with pytest.raises(CoreTopologyChange, match=r"^placement has no core training replica"):
        ElasticController(placement=changed(BASE, **{"a-core-0": None, "a-core-1": None}))
    c.on_event("z-hyb-2", JoinEvent.FAIL, step=1, why="died")
    with pytest.raises(ValueError, match=r"^worker 'z-hyb-2' is not in training \(state 'failed'\)$"):
        c.release("z-hyb-2", step=1, why="")
    with pytest.raises(
        ValueError,
        match=r"^initial placement puts hybrid worker 'z-hyb-3' in training; hybrids start as rollout and are "
        r"borrowed through the controller so that they join with a snapshot$",
    ):
        ElasticController(placement=changed(BASE, **{"z-hyb-3": {"role": T}}))


def test_an_illegal_transition_lists_the_legal_events_and_a_legal_one_is_logged(caplog):
    states = WorkerStates()
    with pytest.raises(IllegalTransition) as e:
        states.apply("w", JoinEvent.CAUGHT_UP, step=4, why="")
    assert str(e.value) == (
        "worker 'w' at step 4: event 'caught_up' is illegal in state 'rollout'; legal events there: ['fail', 'request']"
    )
    assert (e.value.worker, e.value.state, e.value.event, e.value.step) == (
        "w",
        JoinState.ROLLOUT,
        JoinEvent.CAUGHT_UP,
        4,
    )
    with caplog.at_level(logging.INFO, logger="libra.elastic.states"):
        states.apply("w", JoinEvent.REQUEST, step=5, why="borrowed")
    (record,) = [r for r in caplog.records if r.name == "libra.elastic.states"]
    assert record.getMessage() == "elastic: w step=5 rollout -> requested (request): borrowed"
    assert states.in_state(JoinState.REQUESTED) == ("w",) and states.in_state(JoinState.ACTIVE) == ()
