"""The join state machine of one elastic hybrid worker, as pure data.

A hybrid worker serves rollout until the controller borrows it for training. It then moves through
``REQUESTED -> FETCHING_STATE -> PLACEHOLDER -> ACTIVE``: it fetches a versioned snapshot of model and optimizer
state while the core keeps training, replays the reduced gradients of the steps it missed while contributing
placeholders (exact zeros that are not counted), and contributes real gradients only once it is bitwise equal to
the core. ``LEAVE`` from ``ACTIVE`` and ``CANCEL`` from any joining state hand the worker straight back to rollout;
``FAIL`` is legal from every live state (the worker died or timed out) and ``RECOVER`` returns a failed worker to
rollout once it has been restarted.

Every transition is recorded as a :class:`Transition` value (worker, step, from, to, event, why); an illegal one
raises :class:`IllegalTransition`, which names the worker, its state, the event and the events that would be legal.
"""

from __future__ import annotations

import collections
import logging
from enum import StrEnum

import attrs

log = logging.getLogger(__name__)


class JoinState(StrEnum):
    """Where a hybrid worker is on its way into (or out of) training."""

    ROLLOUT = "rollout"  # serving rollout; not part of training
    REQUESTED = "requested"  # borrowed for training; rollout instance being stopped, side channel being opened
    FETCHING_STATE = "fetching_state"  # receiving the versioned model + optimizer snapshot
    PLACEHOLDER = (
        "placeholder"  # state restored; replaying missed steps, contributing placeholders (zeros, not counted)
    )
    ACTIVE = "active"  # bitwise equal to the core; contributes real gradients
    FAILED = "failed"  # died or timed out; the core proceeds without it


class JoinEvent(StrEnum):
    """What moves a worker between :class:`JoinState` values."""

    REQUEST = "request"
    START_FETCH = "start_fetch"
    RESTORED = "restored"
    CAUGHT_UP = "caught_up"
    LEAVE = "leave"
    CANCEL = "cancel"
    FAIL = "fail"
    RECOVER = "recover"


S, E = JoinState, JoinEvent

#: The whole transition table: (state, event) -> next state. Anything not listed is illegal.
TRANSITIONS: dict[tuple[JoinState, JoinEvent], JoinState] = {
    (S.ROLLOUT, E.REQUEST): S.REQUESTED,
    (S.REQUESTED, E.START_FETCH): S.FETCHING_STATE,
    (S.FETCHING_STATE, E.RESTORED): S.PLACEHOLDER,
    (S.PLACEHOLDER, E.CAUGHT_UP): S.ACTIVE,
    (S.ACTIVE, E.LEAVE): S.ROLLOUT,
    (S.REQUESTED, E.CANCEL): S.ROLLOUT,
    (S.FETCHING_STATE, E.CANCEL): S.ROLLOUT,
    (S.PLACEHOLDER, E.CANCEL): S.ROLLOUT,
    (S.ROLLOUT, E.FAIL): S.FAILED,
    (S.REQUESTED, E.FAIL): S.FAILED,
    (S.FETCHING_STATE, E.FAIL): S.FAILED,
    (S.PLACEHOLDER, E.FAIL): S.FAILED,
    (S.ACTIVE, E.FAIL): S.FAILED,
    (S.FAILED, E.RECOVER): S.ROLLOUT,
}

#: States in which the worker belongs to training (it holds a side channel to its paired core replica).
TRAINING_STATES = frozenset({S.REQUESTED, S.FETCHING_STATE, S.PLACEHOLDER, S.ACTIVE})


class IllegalTransition(RuntimeError):
    """An event that the transition table does not allow from the worker's current state."""

    def __init__(self, *, worker: str, state: JoinState, event: JoinEvent, step: int) -> None:
        legal = sorted(e.value for (s, e) in TRANSITIONS if s == state)
        super().__init__(
            f"worker {worker!r} at step {step}: event {event.value!r} is illegal in state {state.value!r}; "
            f"legal events there: {legal}"
        )
        self.worker, self.state, self.event, self.step = worker, state, event, step


@attrs.frozen(kw_only=True)
class Transition:
    """One logged state change: which worker, at which training step, from where to where, and why."""

    worker: str
    step: int
    src: JoinState
    dst: JoinState
    event: JoinEvent
    why: str


def next_state(state: JoinState, event: JoinEvent, *, worker: str, step: int) -> JoinState:
    """The state after ``event``, or :class:`IllegalTransition`."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(worker=worker, state=state, event=event, step=step) from None


class WorkerStates:
    """The join states of a set of workers plus the log of every transition (a list of :class:`Transition`).

    Unknown workers start in ``ROLLOUT``. ``apply`` is the only way to change a state. ``log_limit`` bounds the
    log (oldest records drop first) for long-running processes; None keeps everything.
    """

    def __init__(self, *, log_limit: int | None = None) -> None:
        self._states: dict[str, JoinState] = {}
        self.log: collections.deque[Transition] = collections.deque(maxlen=log_limit)

    def state(self, worker: str) -> JoinState:
        return self._states.get(worker, JoinState.ROLLOUT)

    def apply(self, worker: str, event: JoinEvent, *, step: int, why: str) -> Transition:
        src = self.state(worker)
        dst = next_state(src, event, worker=worker, step=step)
        self._states[worker] = dst
        record = Transition(worker=worker, step=step, src=src, dst=dst, event=event, why=why)
        self.log.append(record)
        log.info("elastic: %s step=%d %s -> %s (%s): %s", worker, step, src, dst, event, why)
        return record

    def in_state(self, state: JoinState) -> tuple[str, ...]:
        return tuple(sorted(w for w, s in self._states.items() if s == state))
