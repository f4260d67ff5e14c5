"""The elastic controller: plan diffs in, decisions out (pure logic, no torch).

Given the current :class:`~libra.spec.placement.Placement` and a new one (from the planner's ``place``), or an
explicit borrow/release request, the controller returns the decisions that move from one to the other:

- core training replicas (``Pool.CORE_TRAIN``) are never rebuilt: a plan that changes them raises
  :class:`CoreTopologyChange`;
- core rollout instances that appear, disappear or change their TP/GPUs are started/stopped;
- a hybrid worker (``Pool.HYBRID``) whose role turns from rollout instance into train replica is borrowed
  (``StopInstance`` then ``JoinTraining`` paired with the least-loaded core replica); the reverse releases it
  (``LeaveTraining`` if active, ``CancelJoin`` if still joining, then ``StartInstance``).

Runtime progress comes back through :meth:`ElasticController.on_event` (fetch started, state restored, caught up,
failed, recovered), which drives the join state machine of :mod:`libra.elastic.states`; every transition is logged
in ``controller.states.log``.
"""

from __future__ import annotations

import logging

from libra.elastic.decisions import CancelJoin, Decision, JoinTraining, LeaveTraining, StartInstance, StopInstance
from libra.elastic.states import TRAINING_STATES, JoinEvent, JoinState, Transition, WorkerStates, next_state
from libra.spec.placement import Placement, Pool, Role, WorkerPlacement

log = logging.getLogger(__name__)


class CoreTopologyChange(ValueError):
    """A new plan changes the core training pool, which is fixed for the whole run."""


class UnknownWorker(KeyError):
    """A borrow/release/event names a worker that is not in the current placement (or not in the hybrid pool)."""


def _check_is_placement(placement: object) -> None:
    if not isinstance(placement, Placement):
        raise TypeError(f"a plan is a libra.spec.placement.Placement, got {type(placement).__name__}: {placement!r}")


def _check_exclusive(placement: Placement) -> None:
    _check_is_placement(placement)
    shared = placement.shared_gpus()
    if shared:
        g, names = next(iter(shared.items()))
        raise ValueError(f"GPU {g} is placed under several workers {list(names)}: a placement holds each GPU once")


class ElasticController:
    """Keeps the current placement, the join state of every hybrid worker and its paired core replica."""

    def __init__(self, *, placement: Placement) -> None:
        _check_exclusive(placement)
        self.placement = placement
        self.states = WorkerStates()
        self.pairs: dict[str, str] = {}  # hybrid worker -> paired core replica, while in a training state
        self._core_replicas = tuple(
            sorted(w.name for w in placement.workers if w.pool == Pool.CORE_TRAIN and w.role == Role.TRAIN_REPLICA)
        )
        if not self._core_replicas:
            raise CoreTopologyChange("placement has no core training replica (pool core_train, role train_replica)")
        for w in placement.workers:
            if w.pool == Pool.HYBRID and w.role == Role.TRAIN_REPLICA:
                raise ValueError(
                    f"initial placement puts hybrid worker {w.name!r} in training; hybrids start as rollout and are "
                    "borrowed through the controller so that they join with a snapshot"
                )

    # -- plan diffs -------------------------------------------------------------------------------------------

    def apply_plan(self, new: Placement, *, step: int, why: str) -> tuple[Decision, ...]:
        """Decisions that turn the current placement into ``new``; the controller then holds ``new``. A plan it
        cannot carry out raises before anything changes (no state, pairing or placement is touched)."""
        _check_is_placement(new)
        old_by, new_by = self.placement.by_name(), new.by_name()
        self._check_plan(old_by, new_by, step=step)
        decisions: list[Decision] = []
        for name in sorted(set(old_by) | set(new_by)):
            old, cur = old_by.get(name), new_by.get(name)
            if old is not None and old.pool == Pool.CORE_TRAIN:
                continue
            was_train = old is not None and old.role == Role.TRAIN_REPLICA
            is_train = cur is not None and cur.role == Role.TRAIN_REPLICA
            if not was_train and is_train:
                assert cur is not None
                if old is not None:
                    decisions.append(StopInstance(worker=name, step=step, why=f"borrowed for training: {why}"))
                decisions.append(self._join(cur, step=step, why=why))
            elif was_train and not is_train:
                decisions.extend(self._release(name, step=step, why=why))
                if cur is not None:
                    decisions.append(self._start(cur, step=step, why=f"back to rollout: {why}"))
            elif not was_train:  # rollout in both (or in the one plan that has it)
                if old is not None and (cur is None or (old.tp, old.gpu_ids) != (cur.tp, cur.gpu_ids)):
                    decisions.append(StopInstance(worker=name, step=step, why=why))
                if cur is not None and (old is None or (old.tp, old.gpu_ids) != (cur.tp, cur.gpu_ids)):
                    decisions.append(self._start(cur, step=step, why=why))
        self.placement = new
        return tuple(decisions)

    def borrow(self, worker: str, *, step: int, why: str) -> tuple[Decision, ...]:
        """Explicitly borrow hybrid rollout worker ``worker`` for training (same as a plan that flips its role)."""
        w = self._hybrid(worker)
        if w.role == Role.TRAIN_REPLICA:
            raise ValueError(f"worker {worker!r} is already borrowed (state {self.states.state(worker).value!r})")
        return self.apply_plan(self._with_role(worker, Role.TRAIN_REPLICA), step=step, why=why)

    def release(self, worker: str, *, step: int, why: str) -> tuple[Decision, ...]:
        """Explicitly hand hybrid ``worker`` back to rollout: leave at once if active, cancel if still joining."""
        w = self._hybrid(worker)
        if w.role != Role.TRAIN_REPLICA:
            raise ValueError(f"worker {worker!r} is not in training (state {self.states.state(worker).value!r})")
        return self.apply_plan(self._with_role(worker, Role.ROLLOUT_INSTANCE), step=step, why=why)

    # -- runtime events ---------------------------------------------------------------------------------------

    def on_event(self, worker: str, event: JoinEvent, *, step: int, why: str) -> tuple[Decision, ...]:
        """Record runtime progress of a join (START_FETCH, RESTORED, CAUGHT_UP, FAIL, RECOVER).

        A failed worker leaves training at once (its pairing is dropped, the plan's view of it becomes rollout);
        a recovered one is started as a rollout instance again.
        """
        if event in (JoinEvent.REQUEST, JoinEvent.LEAVE, JoinEvent.CANCEL):
            raise ValueError(f"event {event.value!r} comes from borrow()/release()/apply_plan(), not on_event()")
        w = self._hybrid(worker)
        self.states.apply(worker, event, step=step, why=why)
        if event == JoinEvent.FAIL:
            self.pairs.pop(worker, None)
            self.placement = self._with_role(worker, Role.ROLLOUT_INSTANCE)
            return ()
        if event == JoinEvent.RECOVER:
            return (self._start(w, step=step, why=f"recovered: {why}"),)
        return ()

    def observe(self, transition: Transition) -> tuple[Decision, ...]:
        """Mirror a transition that the runtime (a :class:`~libra.elastic.core.CoreExchange`) logged.

        Wire it as ``CoreExchange(on_transition=lambda t: executor.execute_all(controller.observe(t)))``.
        Progress and failures (START_FETCH, RESTORED, CAUGHT_UP, FAIL, RECOVER) go through :meth:`on_event`;
        REQUEST is the runtime's echo of a borrow and is ignored; a LEAVE/CANCEL that the controller did not order
        (the hybrid left by itself) hands the worker back to rollout. A transition the controller already holds is
        ignored, and so is one that starts from another state than the controller's (a stale echo; logged), so
        observing is idempotent.
        """
        worker, event = transition.worker, transition.event
        state = self.states.state(worker)
        if worker not in self.placement.by_name() or state == transition.dst:
            return ()
        if event != JoinEvent.FAIL and state != transition.src:
            log.warning("elastic: ignoring stale runtime transition %s (controller holds %s)", transition, state)
            return ()
        if event == JoinEvent.REQUEST:
            return ()
        if event in (JoinEvent.LEAVE, JoinEvent.CANCEL):
            if self.states.state(worker) not in TRAINING_STATES:
                return ()
            decisions = self.release(worker, step=transition.step, why=f"runtime: {transition.why}")
            return tuple(d for d in decisions if isinstance(d, StartInstance))
        return self.on_event(worker, event, step=transition.step, why=transition.why)

    # -- helpers ----------------------------------------------------------------------------------------------

    def _join(self, w: WorkerPlacement, *, step: int, why: str) -> JoinTraining:
        load = {c: 0 for c in self._core_replicas}
        for core in self.pairs.values():
            load[core] += 1
        paired = min(self._core_replicas, key=lambda c: (load[c], c))
        self.states.apply(w.name, JoinEvent.REQUEST, step=step, why=why)
        self.pairs[w.name] = paired
        return JoinTraining(worker=w.name, gpu_ids=w.gpu_ids, paired_core=paired, step=step, why=why)

    def _release(self, name: str, *, step: int, why: str) -> tuple[Decision, ...]:
        state = self.states.state(name)
        paired = self.pairs.pop(name, "")
        if state == JoinState.FAILED:
            return ()
        if state == JoinState.ACTIVE:
            self.states.apply(name, JoinEvent.LEAVE, step=step, why=why)
            return (LeaveTraining(worker=name, paired_core=paired, step=step, why=why),)
        self.states.apply(name, JoinEvent.CANCEL, step=step, why=why)
        return (CancelJoin(worker=name, paired_core=paired, step=step, why=why),)

    @staticmethod
    def _start(w: WorkerPlacement, *, step: int, why: str) -> StartInstance:
        return StartInstance(worker=w.name, tp=w.tp, gpu_ids=w.gpu_ids, step=step, why=why)

    def _hybrid(self, worker: str) -> WorkerPlacement:
        w = self.placement.by_name().get(worker)
        if w is None or w.pool != Pool.HYBRID:
            hybrids = sorted(x.name for x in self.placement.workers if x.pool == Pool.HYBRID)
            raise UnknownWorker(f"{worker!r} is not a hybrid worker of the current placement; hybrids: {hybrids}")
        return w

    def _with_role(self, worker: str, role: Role) -> Placement:
        import attrs

        return Placement(
            workers=tuple(attrs.evolve(w, role=role) if w.name == worker else w for w in self.placement.workers)
        )

    def _check_plan(self, old_by: dict[str, WorkerPlacement], new_by: dict[str, WorkerPlacement], *, step: int) -> None:
        """What `apply_plan` refuses: a change to the core training pool, training outside the hybrid pool, a
        training hybrid moved to other GPUs, a join that the worker's state does not allow."""
        self._check_core_unchanged(old_by, new_by)
        _check_exclusive(Placement(workers=tuple(new_by.values())))
        for name, cur in sorted(new_by.items()):
            old = old_by.get(name)
            if cur.role != Role.TRAIN_REPLICA or (old is not None and old.pool == Pool.CORE_TRAIN):
                continue
            if cur.pool != Pool.HYBRID:
                raise CoreTopologyChange(f"worker {name!r} would train in pool {cur.pool.value!r}; only hybrids join")
            if old is not None and old.role == Role.TRAIN_REPLICA:
                if (old.tp, old.gpu_ids) != (cur.tp, cur.gpu_ids):  # a replica's GPUs hold its state
                    raise ValueError(
                        f"worker {name!r} trains on GPUs {old.gpu_ids} (TP {old.tp}); the new plan puts it on "
                        f"{cur.gpu_ids} (TP {cur.tp}): release it first"
                    )
            else:
                next_state(self.states.state(name), JoinEvent.REQUEST, worker=name, step=step)

    @staticmethod
    def _check_core_unchanged(old_by: dict[str, WorkerPlacement], new_by: dict[str, WorkerPlacement]) -> None:
        old_core = {n: w for n, w in old_by.items() if w.pool == Pool.CORE_TRAIN}
        new_core = {n: w for n, w in new_by.items() if w.pool == Pool.CORE_TRAIN}
        if old_core != new_core:
            changed = sorted(n for n in set(old_core) | set(new_core) if old_core.get(n) != new_core.get(n))
            raise CoreTopologyChange(f"the core training pool is fixed for the run; the new plan changes {changed}")
