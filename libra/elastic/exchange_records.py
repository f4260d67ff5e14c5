"""What the core's side of the exchange keeps (libra/elastic/core.py): a record of each step, the counts of what
happened to contributions and joins, and the slot it holds for each hybrid."""

from __future__ import annotations

import attrs

from libra.elastic.grads import Mode
from libra.elastic.states import JoinState
from libra.elastic.wire import Link, ReusedBlobs, SendHandle

__all__ = ["ExchangeStats", "StepRecord"]


@attrs.frozen(kw_only=True)
class StepRecord:
    """What one core step did: the membership agreed at ``begin_step`` (``num_replicas``, which fixes every
    replica's shard), how many replicas contributed real gradients (the divisor), which hybrids did, and how long
    this replica waited on the side channel."""

    step: int
    num_replicas: int
    num_contributed: int
    hybrid_contributors: tuple[str, ...]
    wait_s: float


@attrs.define
class ExchangeStats:
    accepted: int = 0
    placeholders: int = 0
    skipped: int = 0  # stale step, wrong version, gradient from a placeholder, size/dtype mismatch
    missed: int = 0  # contributions that had not started to arrive within timeout_s (the hybrid stays attached)
    failures: int = 0
    leaves: int = 0
    refused: int = 0  # JOINs refused: a name already in training, or one removed before its JOIN was read


@attrs.define(eq=False)
class _Slot:
    worker: str
    link: Link
    state: JoinState
    snapshot_version: int = -1
    send: SendHandle | None = None
    next_replay: int = 0  # first step whose reduced gradient the hybrid has not been sent yet
    placeholder_steps: int = 0
    mode: Mode = Mode.PLACEHOLDER
    missed: int = 0  # consecutive steps whose contribution did not arrive in time
    alone: int = 0  # with a model-parallel group: consecutive boundaries at which some coordinate had no such worker
    inbox: ReusedBlobs = attrs.field(factory=ReusedBlobs)  # the memory its gradients are received into
