"""The elastic controller: plan diffs in, decisions (attrs values) out; runtime events drive the state machine."""

from __future__ import annotations

import subprocess
import sys

import attrs
import pytest

from libra.elastic import (
    CancelJoin,
    CoreTopologyChange,
    DispatchExecutor,
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
    UnhandledDecision,
    UnknownWorker,
    WorkerPlacement,
)


def W(name, role, pool, gpus, tp=1):  # noqa: N802
    return WorkerPlacement(name=name, role=role, tp=tp, gpu_ids=tuple(gpus), pool=pool)


BASE = Placement(
    workers=(
        W("train-0", Role.TRAIN_REPLICA, Pool.CORE_TRAIN, [0, 1], tp=2),
        W("train-1", Role.TRAIN_REPLICA, Pool.CORE_TRAIN, [2, 3], tp=2),
        W("rollout-0", Role.ROLLOUT_INSTANCE, Pool.CORE_ROLLOUT, [4, 5], tp=2),
        W("hybrid-0", Role.ROLLOUT_INSTANCE, Pool.HYBRID, [6]),
        W("hybrid-1", Role.ROLLOUT_INSTANCE, Pool.HYBRID, [7]),
    )
)


def with_role(p: Placement, name: str, role: Role) -> Placement:
    return Placement(workers=tuple(attrs.evolve(w, role=role) if w.name == name else w for w in p.workers))


def test_plan_that_trains_a_hybrid_borrows_it_paired_with_least_loaded_core():
    c = ElasticController(placement=BASE)
    d = c.apply_plan(with_role(BASE, "hybrid-0", Role.TRAIN_REPLICA), step=5, why="rollout shrank")
    assert d == (
        StopInstance(worker="hybrid-0", step=5, why="borrowed for training: rollout shrank"),
        JoinTraining(worker="hybrid-0", gpu_ids=(6,), paired_core="train-0", step=5, why="rollout shrank"),
    )
    d2 = c.borrow("hybrid-1", step=6, why="more")
    assert d2[-1].paired_core == "train-1"  # train-0 already has a hybrid
    assert c.states.state("hybrid-0") == JoinState.REQUESTED


def test_join_progress_then_release_leaves_at_once_and_restarts_rollout():
    c = ElasticController(placement=BASE)
    c.borrow("hybrid-0", step=1, why="x")
    for event in (JoinEvent.START_FETCH, JoinEvent.RESTORED, JoinEvent.CAUGHT_UP):
        assert c.on_event("hybrid-0", event, step=2, why="runtime") == ()
    assert c.states.state("hybrid-0") == JoinState.ACTIVE
    d = c.release("hybrid-0", step=9, why="rollout grew")
    assert d == (
        LeaveTraining(worker="hybrid-0", paired_core="train-0", step=9, why="rollout grew"),
        StartInstance(worker="hybrid-0", tp=1, gpu_ids=(6,), step=9, why="back to rollout: rollout grew"),
    )
    assert c.states.state("hybrid-0") == JoinState.ROLLOUT and "hybrid-0" not in c.pairs
    assert [(t.worker, t.step, t.dst.value) for t in c.states.log][-1] == ("hybrid-0", 9, "rollout")


def test_release_while_joining_cancels():
    c = ElasticController(placement=BASE)
    c.borrow("hybrid-1", step=1, why="x")
    c.on_event("hybrid-1", JoinEvent.START_FETCH, step=1, why="")
    d = c.release("hybrid-1", step=2, why="changed mind")
    assert isinstance(d[0], CancelJoin) and isinstance(d[1], StartInstance)


def test_core_training_pool_is_never_rebuilt():
    c = ElasticController(placement=BASE)
    changed = Placement(
        workers=tuple(attrs.evolve(w, gpu_ids=(0,), tp=1) if w.name == "train-1" else w for w in BASE.workers)
    )
    with pytest.raises(CoreTopologyChange, match="train-1"):
        c.apply_plan(changed, step=1, why="")
    with pytest.raises(CoreTopologyChange):
        c.apply_plan(with_role(BASE, "rollout-0", Role.TRAIN_REPLICA), step=1, why="")


def test_core_rollout_changes_restart_instances():
    c = ElasticController(placement=BASE)
    new = Placement(
        workers=tuple(attrs.evolve(w, tp=1, gpu_ids=(4,)) if w.name == "rollout-0" else w for w in BASE.workers)
        + (W("rollout-9", Role.ROLLOUT_INSTANCE, Pool.CORE_ROLLOUT, [5]),)
    )
    d = c.apply_plan(new, step=3, why="mix")
    assert [type(x).__name__ for x in d] == ["StopInstance", "StartInstance", "StartInstance"]
    assert c.apply_plan(new, step=4, why="same") == ()


def test_failure_drops_the_pairing_and_needs_recover_before_a_new_borrow():
    c = ElasticController(placement=BASE)
    c.borrow("hybrid-0", step=1, why="x")
    c.on_event("hybrid-0", JoinEvent.START_FETCH, step=1, why="")
    assert c.on_event("hybrid-0", JoinEvent.FAIL, step=2, why="side channel timed out") == ()
    assert "hybrid-0" not in c.pairs and c.placement.by_name()["hybrid-0"].role == Role.ROLLOUT_INSTANCE
    with pytest.raises(IllegalTransition):
        c.borrow("hybrid-0", step=3, why="again")
    d = c.on_event("hybrid-0", JoinEvent.RECOVER, step=4, why="restarted")
    assert d == (StartInstance(worker="hybrid-0", tp=1, gpu_ids=(6,), step=4, why="recovered: restarted"),)
    assert isinstance(c.borrow("hybrid-0", step=5, why="again")[-1], JoinTraining)


def test_bad_requests_are_errors():
    c = ElasticController(placement=BASE)
    with pytest.raises(UnknownWorker):
        c.borrow("train-0", step=0, why="")
    with pytest.raises(ValueError, match="not in training"):
        c.release("hybrid-0", step=0, why="")
    with pytest.raises(IllegalTransition):
        c.on_event("hybrid-0", JoinEvent.CAUGHT_UP, step=0, why="")
    with pytest.raises(ValueError, match="borrow"):
        c.on_event("hybrid-0", JoinEvent.LEAVE, step=0, why="")
    with pytest.raises(ValueError, match="hybrids start as rollout"):
        ElasticController(placement=with_role(BASE, "hybrid-0", Role.TRAIN_REPLICA))


def test_dispatch_executor_runs_handlers_and_refuses_unknown_decisions():
    seen = []
    ex = DispatchExecutor({StopInstance: seen.append, JoinTraining: seen.append})
    c = ElasticController(placement=BASE)
    ex.execute_all(c.borrow("hybrid-0", step=0, why="x"))
    assert [type(d) for d in seen] == [StopInstance, JoinTraining] and ex.done == seen
    with pytest.raises(UnhandledDecision, match="StartInstance"):
        ex.execute(StartInstance(worker="a", tp=1, gpu_ids=(0,), step=0, why=""))


def test_pure_parts_import_without_torch():
    code = "import sys, libra.elastic; assert 'torch' not in sys.modules, 'libra.elastic imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _t(worker, step, src, dst, event, why="rt"):
    return Transition(worker=worker, step=step, src=src, dst=dst, event=event, why=why)


def test_observe_mirrors_runtime_transitions_idempotently():
    S = JoinState  # noqa: N806
    c = ElasticController(placement=BASE)
    c.borrow("hybrid-0", step=1, why="x")
    runtime = [
        _t("hybrid-0", 1, S.ROLLOUT, S.REQUESTED, JoinEvent.REQUEST),
        _t("hybrid-0", 1, S.REQUESTED, S.FETCHING_STATE, JoinEvent.START_FETCH),
        _t("hybrid-0", 2, S.FETCHING_STATE, S.PLACEHOLDER, JoinEvent.RESTORED),
        _t("hybrid-0", 3, S.PLACEHOLDER, S.ACTIVE, JoinEvent.CAUGHT_UP),
    ]
    for tr in runtime + runtime:  # twice: the second pass changes nothing
        assert c.observe(tr) == ()
    assert c.states.state("hybrid-0") == S.ACTIVE
    # the hybrid left by itself: back to rollout, its instance restarted
    d = c.observe(_t("hybrid-0", 7, S.ACTIVE, S.ROLLOUT, JoinEvent.LEAVE, "hybrid left"))
    assert d == (
        StartInstance(worker="hybrid-0", tp=1, gpu_ids=(6,), step=7, why="back to rollout: runtime: hybrid left"),
    )
    assert c.states.state("hybrid-0") == S.ROLLOUT and "hybrid-0" not in c.pairs
    # a LEAVE the controller ordered itself is not applied twice
    c.borrow("hybrid-0", step=8, why="again")
    c.release("hybrid-0", step=9, why="done")
    assert c.observe(_t("hybrid-0", 9, S.REQUESTED, S.ROLLOUT, JoinEvent.CANCEL)) == ()


def test_observe_failure_from_runtime():
    c = ElasticController(placement=BASE)
    c.borrow("hybrid-1", step=1, why="x")
    c.observe(_t("hybrid-1", 1, JoinState.REQUESTED, JoinState.FETCHING_STATE, JoinEvent.START_FETCH))
    assert c.observe(_t("hybrid-1", 2, JoinState.FETCHING_STATE, JoinState.FAILED, JoinEvent.FAIL, "timeout")) == ()
    assert c.states.state("hybrid-1") == JoinState.FAILED and c.states.log[-1].why == "timeout"
