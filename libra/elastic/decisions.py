"""Decisions of the elastic controller, as frozen values that an executor carries out (and a test can replay).

Each decision names the worker it is about, the training step at which it was taken and why. Executors dispatch
on the type (see :mod:`libra.elastic.executor`).
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class StartInstance:
    """Start a rollout instance of tensor-parallel degree ``tp`` on ``gpu_ids`` of ``worker``."""

    worker: str
    tp: int
    gpu_ids: tuple[int, ...]
    step: int
    why: str


@attrs.frozen(kw_only=True)
class StopInstance:
    """Stop the rollout instance of ``worker`` (its in-flight requests are migrated or re-queued by the router)."""

    worker: str
    step: int
    why: str


@attrs.frozen(kw_only=True)
class JoinTraining:
    """Start the non-blocking join of hybrid ``worker`` as one extra replica, paired with core replica
    ``paired_core`` (whose side channel it uses and whose snapshot it fetches)."""

    worker: str
    gpu_ids: tuple[int, ...]
    paired_core: str
    step: int
    why: str


@attrs.frozen(kw_only=True)
class LeaveTraining:
    """Detach an active hybrid replica at once; the core's next step simply has one replica fewer."""

    worker: str
    paired_core: str
    step: int
    why: str


@attrs.frozen(kw_only=True)
class CancelJoin:
    """Abandon a join that has not reached ``ACTIVE`` (drop the snapshot transfer and the side channel)."""

    worker: str
    paired_core: str
    step: int
    why: str


Decision = StartInstance | StopInstance | JoinTraining | LeaveTraining | CancelJoin
