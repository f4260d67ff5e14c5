"""The core replica's end of the side channel: :class:`CoreExchange`.

A core replica calls :meth:`CoreExchange.begin_step` before computing step ``t`` (it learns its shard of the fixed
global batch) and :meth:`CoreExchange.reduce` at the gradient hook point, in place of the data-parallel
all-reduce: reduce receives the contributions of its paired hybrid replicas (with a timeout), adds the real ones
to its own gradient, all-reduces over the core process group (created once by the caller, never here), divides by
the number of replicas that contributed real gradients and sends the result back to its hybrids. Then the caller
runs ``optimizer.step()``.

Joining is non-blocking for the core: at a step boundary a background thread packs a snapshot of version ``t``
(a copy that overlaps the forward and backward pass; ``reduce`` waits for it before the caller's optimizer step
changes the state) and, on TCP, posts its send as soon as it is packed; meanwhile the core keeps the reduced
gradients of steps ``t, t+1, ...`` so that the hybrid can replay them. The boundary that reads the hybrid's ATTACH
makes it active (after ``min_placeholder_steps`` placeholder steps, default 0, in which it contributes nothing and
receives the reduced gradient): the STEP message it gets then carries every reduced gradient it has not had, which
it replays before it computes, so it computes that step's gradient on that step's state, bitwise the core's.
``timeout_s`` bounds each wait on a hybrid: in ``reduce`` the hybrid computes its gradient while the core computes
its own, so the timeout only needs to cover the skew between them; a message that has begun to arrive within it
then has ``timeout_s`` more for its transfer (so a contribution costs the core at most twice ``timeout_s``).
Anything wrong with a contribution (timeout, closed peer, bad checksum, wrong step or version,
a gradient from a placeholder) skips it; failures detach that hybrid; the core step always completes.
A late contribution (nothing of it arrived within ``timeout_s``) is a *miss*, not a failure: the step goes on
without it, the hybrid stays attached and still receives the reduced gradient (its late message is dropped as stale
next step); only ``max_missed`` consecutive misses detach it. One slow step of a live hybrid must not remove it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from libra.elastic.exchange_records import ExchangeStats, StepRecord, _Slot
from libra.elastic.grads import (
    Mode,
    StepAssignment,
    check_backend,
    check_gradients,
    check_seconds,
    check_whole,
    flatten,
    to_device_of,
    to_host,
    trainable,
    unflatten_into,
)
from libra.elastic.groups import check_group, counts_device
from libra.elastic.pack import checksum
from libra.elastic.snapshot import PendingCapture, SnapshotError, capture
from libra.elastic.snapshot_send import SnapshotSend
from libra.elastic.states import JoinEvent, JoinState, Transition, WorkerStates
from libra.elastic.wire import (
    Kind,
    Link,
    LinkError,
    Message,
    SendHandle,
    SideChannelServer,
    arrives,
    as_bytes,
    peer_closed,
    recv_reusing,
)

log = logging.getLogger(__name__)


# Pruned replay copies kept for the next join (each the size of the gradient): a join replays the reduced gradients
# of the few steps its snapshot takes to arrive, two to four at 100M parameters here.
REPLAY_SPARES = 2


class CoreExchange:
    """Side channel of one core replica (``core_rank`` of ``num_core_replicas`` in ``core_group``).

    For a core replica with several model-parallel ranks (TP x PP), each rank runs its own exchange, with
    ``core_group`` the data-parallel group of its coordinate and ``model_parallel_group`` the replica's own ranks,
    paired with the same coordinate of every hybrid replica (all of whose ranks use one worker name): the
    coordinates then promote and detach each hybrid replica together (:meth:`_agree_across_coordinates`)."""

    def __init__(
        self,
        *,
        core_group,
        core_rank: int,
        num_core_replicas: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        timeout_s: float,
        snapshot_timeout_s: float = 60.0,
        max_catchup_steps: int = 32,
        min_placeholder_steps: int = 0,
        max_missed: int = 3,
        server: SideChannelServer | None = None,
        backend: str = "auto",
        on_transition: Callable[[Transition], None] | None = None,
        history: int = 10_000,
        reuse_snapshot_buffers: bool = True,
        model_parallel_group=None,
    ) -> None:
        num_core_replicas = check_whole("num_core_replicas", num_core_replicas, least=1)
        core_rank = check_whole("core_rank", core_rank, least=0)
        if core_rank >= num_core_replicas:
            raise ValueError(f"core_rank must be in [0, num_core_replicas={num_core_replicas}), got {core_rank}")
        check_group(core_group, core_rank, num_core_replicas)
        self._group, self.core_rank, self.num_core = core_group, core_rank, num_core_replicas
        self._model, self._optimizer = model, optimizer
        self.timeout_s = check_seconds("timeout_s", timeout_s)
        self.snapshot_timeout_s = check_seconds("snapshot_timeout_s", snapshot_timeout_s)
        self.max_catchup_steps = check_whole("max_catchup_steps", max_catchup_steps, least=0)
        self.min_placeholder_steps = check_whole("min_placeholder_steps", min_placeholder_steps, least=0)
        self.max_missed = check_whole("max_missed", max_missed, least=1)
        history = check_whole("history", history, least=1)
        backend = check_backend(backend)
        self._server, self._backend, self._on_transition = server, backend, on_transition
        self.states = WorkerStates(log_limit=history)  # bounded, like records: long runs must not grow
        self.stats = ExchangeStats()
        self.records: collections.deque[StepRecord] = collections.deque(maxlen=history)
        # connections whose JOIN is not read yet, and when each stops being waited for (a hybrid sends it as it
        # connects: a connection silent past snapshot_timeout_s is a stray, closed rather than kept for the run)
        self._pending: dict[Link, float] = {}
        # for such a connection, the workers removed while it waited, and why: its JOIN from one of them is refused
        self._removed: dict[Link, dict[str, str]] = {}
        self._slots: dict[str, _Slot] = {}
        self._replay: dict[int, torch.Tensor] = {}  # step -> reduced flat gradient, kept while a hybrid needs it
        self._assignment: StepAssignment | None = None
        self._last_step = -1  # the last step begun: what a close records (-1 before the first)
        # Buckets of the last snapshot whose sends all completed, overwritten by the next one: new memory costs a
        # page fault per 4 KiB on first touch, more than the copy itself (1.2 GB: seconds on a loaded VM).
        self.reuse_snapshot_buffers = reuse_snapshot_buffers
        # A TP x PP core replica: every rank of it runs a CoreExchange for its coordinate, paired with that
        # coordinate's rank of each hybrid replica (one worker name for all of a hybrid replica's ranks)
        self._mp_group = model_parallel_group
        self._spare_buckets: list[torch.Tensor] | None = None
        # The same for the flat gradient of every step (nothing holds it once reduce returns: its sends are
        # synchronous) and, under ``reuse_snapshot_buffers``, for up to REPLAY_SPARES pruned replay copies.
        self._flat: torch.Tensor | None = None
        self._spare_replay: list[torch.Tensor] = []
        # A replica on a GPU: messages carry host memory, so the reduced gradient is copied into page-locked host
        # memory (sent, and kept for replays from there) and each hybrid's gradient into device memory, both reused
        # (on a CPU replica these are the flat gradient and the last received blob themselves: nothing is copied)
        self._host_flat: torch.Tensor | None = None
        self._device_in: torch.Tensor | None = None
        self._counts_device = counts_device(core_group)

    def prepare(self) -> None:
        """Pack the state once now into the buckets that the first join's snapshot will be packed into, so that
        the first join touches no new memory on the core, as a later join does (the kernel zero-fills each new
        page on first touch: 0.5-1 s of the core's CPU per 1.2 GB on the 2-core VM, during the step that reads the
        JOIN). Costs one snapshot's worth of memory for the run, which ``reuse_snapshot_buffers`` keeps after a
        first join anyway. The optimizer needs its state already (call it after the first optimizer step), or the
        sizes differ and the first join packs into new memory, as without this; the same with a changed state."""
        if not self.reuse_snapshot_buffers:
            raise ValueError("prepare() keeps buckets for the first snapshot: it needs reuse_snapshot_buffers=True")
        self._spare_buckets = list(capture(self._model, self._optimizer, version=-1, backend=self._backend).buckets)

    # -- membership ---------------------------------------------------------------------------------------------

    def admit(self, link: Link) -> None:
        """Take a link whose hybrid will send JOIN (TCP links arrive through the server by themselves); one that
        sends nothing for `snapshot_timeout_s` is closed at a boundary."""
        self._pending[link] = time.monotonic() + self.snapshot_timeout_s

    def remove(self, worker: str, *, step: int, why: str) -> None:
        """Detach ``worker`` now (leave if active, cancel otherwise); it is told with a best-effort LEAVE.

        It sticks for a JOIN not read yet: a connection made before this call (waiting at the server or for its
        first boundary) whose JOIN names ``worker`` is refused with the reason (``stats.refused``, logged), so a
        worker the controller cancelled before the core read its JOIN does not join anyway. A connection made
        after it is a new join."""
        self._accept()
        for link in self._pending:
            self._removed.setdefault(link, {})[worker] = f"removed at step {step} before its JOIN was read: {why}"
        self._detach(worker, step=step, why=why)

    def _detach(self, worker: str, *, step: int, why: str) -> None:
        """Detach ``worker`` now if it has a slot (leave if active, cancel otherwise), with a best-effort LEAVE."""
        slot = self._slots.pop(worker, None)
        if slot is None:
            return
        event = JoinEvent.LEAVE if slot.state == JoinState.ACTIVE else JoinEvent.CANCEL
        self._transition(slot, event, step, why)
        self.stats.leaves += 1
        try:
            if slot.send is None or slot.send.done():
                slot.link.send(Message(kind=Kind.LEAVE, step=step, version=step, info={"why": why}), timeout=1.0)
        except LinkError:
            pass
        self._close(slot)

    @property
    def joining(self) -> int:
        """Connections and workers on their way in (JOIN not yet read, or requested/fetching state)."""
        states = (JoinState.REQUESTED, JoinState.FETCHING_STATE)
        return len(self._pending) + sum(1 for s in self._slots.values() if s.state in states)

    def join_message_waiting(self) -> bool:
        """Whether a joiner has sent something (JOIN or ATTACH) that the next :meth:`begin_step` would act on.
        Lets a caller (or a test) pace its steps; the exchange itself never waits for a joiner."""
        fetching = [s.link for s in self._slots.values() if s.state == JoinState.FETCHING_STATE]
        return any(link.poll() for link in (*self._pending, *fetching))

    def workers(self, state: JoinState | None = None) -> tuple[str, ...]:
        return tuple(sorted(w for w, s in self._slots.items() if state is None or s.state == state))

    def close(self) -> None:
        for worker in list(self._slots):
            self._detach(worker, step=self._last_step, why="exchange closed")
        for link in self._pending:
            link.close()
        self._pending.clear()
        self._removed.clear()
        self._replay.clear()
        self._spare_buckets = None
        self._flat = self._host_flat = self._device_in = None
        self._spare_replay.clear()

    # -- the step protocol --------------------------------------------------------------------------------------

    def begin_step(self, step: int) -> StepAssignment:
        """Admit joiners, serve snapshots, promote caught-up placeholders, agree on membership for ``step``."""
        step = check_whole("step", step, least=0)  # it goes on the wire: a float would fail only once hybrids are in
        self._last_step = step
        self._accept()
        self._admit_pending(step)
        self._progress_fetches(step)
        ready = [
            slot
            for slot in self._live()
            if slot.state == JoinState.PLACEHOLDER
            and slot.placeholder_steps >= self.min_placeholder_steps
            and all(s in self._replay for s in range(slot.next_replay, step))
        ]
        if self._mp_group is not None:
            ready = self._agree_across_coordinates(step, ready)
        for slot in ready:
            # the STEP message below carries the reduced gradients it has not been sent yet: it replays them
            # before it computes, so it computes this step's gradient on this step's state
            self._transition(slot, JoinEvent.CAUGHT_UP, step, "holds every reduced gradient before this step")
        active = [s for s in self._live() if s.state == JoinState.ACTIVE]
        counts = torch.zeros(self.num_core, dtype=torch.int64, device=self._counts_device)
        counts[self.core_rank] = len(active)
        torch.distributed.all_reduce(counts, group=self._group)
        num_replicas = self.num_core + int(counts.sum())
        first = self.num_core + int(counts[: self.core_rank].sum())
        index = {s.worker: first + i for i, s in enumerate(active)}
        for slot in self._live():
            slot.mode = Mode.ACTIVE if slot.worker in index else Mode.PLACEHOLDER
            replay = list(range(slot.next_replay, step))
            info = {
                "mode": slot.mode.value,
                "replica_index": index.get(slot.worker, -1),
                "num_replicas": num_replicas,
                "replay": replay,
            }
            blobs = tuple(as_bytes(self._replay[s]) for s in replay)
            if self._send(slot, Message(kind=Kind.STEP, step=step, version=step, info=info, blobs=blobs), step):
                slot.next_replay = step
        self._prune_replay()
        self._assignment = StepAssignment(
            step=step, mode=Mode.ACTIVE, replica_index=self.core_rank, num_replicas=num_replicas
        )
        return self._assignment

    def reduce(self, step: int, grads: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Mean over replicas with real gradients, written into ``grads`` (and returned). Call optimizer.step()
        afterwards. ``grads`` is this replica's gradient for ``step`` (see :mod:`libra.elastic.grads` for order)."""
        if self._assignment is None or self._assignment.step != step:
            raise RuntimeError(f"reduce({step}) without begin_step({step})")
        check_gradients(step, grads, trainable(self._model))  # before the step is used up
        flat = self._flat = flatten(grads, out=self._flat)
        count = 1
        contributors = []
        received: list[tuple[str, torch.Tensor]] = []
        waited = 0.0
        for slot in self._live():
            start = time.monotonic()
            msg = self._recv_contribution(slot, step)
            waited += time.monotonic() - start
            if msg is None:
                continue
            if msg.kind == Kind.PLACEHOLDER:
                self.stats.placeholders += 1
                continue
            expected = flat.numel() * flat.element_size()
            if (
                slot.mode != Mode.ACTIVE
                or msg.version != step
                or len(msg.blobs) != 1
                or msg.info.get("dtype") != str(flat.dtype)
                or msg.blobs[0].numel() != expected
            ):
                self.stats.skipped += 1
                continue
            received.append((slot.worker, msg.blobs[0]))  # in its slot's own inbox: no later message lands there
        if self._mp_group is not None:
            received = self._agree_on_contributions(received)
        for worker, blob in received:  # added in the order of the slots, as they were received
            # on a GPU replica through device memory reused step after step; on a CPU one the blob itself
            got = self._device_in = to_device_of(blob.view(flat.dtype), flat, out=self._device_in)
            flat += got
            count += 1
            contributors.append(worker)
            self.stats.accepted += 1
        total = torch.tensor([count], dtype=torch.int64, device=self._counts_device)
        torch.distributed.all_reduce(flat, group=self._group)
        torch.distributed.all_reduce(total, group=self._group)
        flat.div_(int(total))
        host = self._host_flat = to_host(flat, out=self._host_flat)  # ``flat`` itself on a CPU replica
        if any(s.state == JoinState.FETCHING_STATE for s in self._slots.values()):
            self._replay[step] = self._replay_copy(host)
        reduced = Message(kind=Kind.REDUCED, step=step, version=step, blobs=(as_bytes(host),))
        if len(self._live()) > 1:  # hash the reduced gradient once, not once per hybrid
            reduced = attrs.evolve(reduced, checksums=(checksum(reduced.blobs[0]),))
        for slot in self._live():
            sent = self._send(slot, reduced, step)
            if sent:
                slot.next_replay = step + 1
                if slot.state == JoinState.PLACEHOLDER:
                    slot.placeholder_steps += 1
        unflatten_into(flat, grads)
        self._wait_for_captures()
        self.records.append(
            StepRecord(
                step=step,
                num_replicas=self._assignment.num_replicas,
                num_contributed=int(total),
                hybrid_contributors=tuple(contributors),
                wait_s=waited,
            )
        )
        self._assignment = None
        return grads

    # -- internals ----------------------------------------------------------------------------------------------

    def _live(self) -> list[_Slot]:
        """Slots in the step protocol (placeholder or active), in a fixed order."""
        return [
            self._slots[w]
            for w in sorted(self._slots)
            if self._slots[w].state in (JoinState.PLACEHOLDER, JoinState.ACTIVE)
        ]

    def _accept(self) -> None:
        """Admit the connections waiting at the server (their JOINs are read at a boundary)."""
        if self._server is not None:
            for link in self._server.accept_ready():
                self.admit(link)

    def _admit_pending(self, step: int) -> None:
        still: dict[Link, float] = {}
        shared: PendingCapture | None = None  # joiners admitted at the same boundary share one snapshot
        now = time.monotonic()
        for link, until in self._pending.items():
            if not link.poll():
                if now < until:
                    still[link] = until
                else:
                    self._removed.pop(link, None)
                    link.close()
                continue
            removed = self._removed.pop(link, {})
            try:
                msg = link.recv(timeout=self.timeout_s)
            except LinkError as exc:  # a peer of another wire version says so here: the operator must see it
                log.warning("elastic: step %d dropped a connection before its JOIN: %s", step, exc)
                link.close()
                continue
            worker = str(msg.info.get("worker", ""))
            if msg.kind != Kind.JOIN or not worker:
                log.warning(
                    "elastic: step %d dropped a connection whose first frame is %s, not a named JOIN",
                    step,
                    msg.kind.name,
                )
                link.close()
                continue
            if worker in self._slots and worker not in removed:
                self._end_closed_stay(self._slots[worker], step)
            if worker in self._slots or worker in removed:
                why = removed.get(worker, f"a worker named {worker!r} is in training already")
                self._refuse(link, worker, step, why)
                continue
            slot = _Slot(worker=worker, link=link, state=self.states.state(worker))
            self._slots[worker] = slot
            if slot.state == JoinState.FAILED:
                self._transition(slot, JoinEvent.RECOVER, step, "rejoined after a failure")
            self._transition(slot, JoinEvent.REQUEST, step, "JOIN received")
            if shared is None:
                try:
                    shared = PendingCapture(
                        self._model, self._optimizer, version=step, backend=self._backend, out=self._spare_buckets
                    )
                except SnapshotError as exc:  # the core's own state cannot be packed: the joiner fails, not the step
                    self._fail(slot, step, f"snapshot v{step}: {exc}")
                    continue
                self._spare_buckets = None
            pending = shared
            slot.snapshot_version = slot.next_replay = step
            slot.send = SnapshotSend(link, pending, self.snapshot_timeout_s)
            self._transition(slot, JoinEvent.START_FETCH, step, f"snapshot v{step} ({pending.nbytes} bytes) sending")
        self._pending = still

    def _end_closed_stay(self, slot: _Slot, step: int) -> None:
        """A JOIN names a worker that still holds ``slot``: a hybrid that reconnected before the core noticed that
        its old link died. If the old link's peer has closed its end, nothing more can come on it, so the old stay
        ends here (a leave if its LEAVE waits there, else a failure) and the JOIN is a new join of that worker. At a
        boundary no contribution of the old stay is in flight (its STEP is not sent yet). A link that is still open
        (a second worker of that name, or a close not seen yet) keeps its slot, and the JOIN is refused."""
        if not peer_closed(slot.link):
            return
        left = self._leave_waiting(slot)
        if left is not None:
            self._detach(slot.worker, step=step, why=f"hybrid left: {left.info.get('why', '')}")
        else:
            self._fail(slot, step, "its side channel closed: it joined again on a new connection")

    def _refuse(self, link: Link, worker: str, step: int, why: str) -> None:
        """Refuse a JOIN: logged, counted, and the joiner told why (a best-effort LEAVE) before its link closes."""
        self.stats.refused += 1
        log.warning("elastic: step %d refused the JOIN of %s: %s", step, worker, why)
        with contextlib.suppress(LinkError):
            link.send(Message(kind=Kind.LEAVE, step=step, version=step, info={"why": why}), timeout=1.0)
        link.close()

    def _recycle(self, send: SendHandle) -> None:
        """Keep a delivered snapshot's buckets for the next one, once no send uses them any more."""
        if not (self.reuse_snapshot_buffers and isinstance(send, SnapshotSend) and send.done()):
            return
        if send.error() is not None or any(
            isinstance(s.send, SnapshotSend) and s.send.pending is send.pending for s in self._slots.values()
        ):
            return
        self._spare_buckets = list(send.pending.wait().buckets)

    def _wait_for_captures(self) -> None:
        """Snapshots still being packed read parameters and optimizer state: finish them before the caller's
        optimizer step changes those. No timeout: the pack is a local copy, and a torn snapshot must never ship
        (a failed pack is reported by the send handle and fails its slot at the next begin_step)."""
        for slot in list(self._slots.values()):
            if isinstance(slot.send, SnapshotSend):
                with contextlib.suppress(Exception):
                    slot.send.wait_safe()
                slot.send.start()

    def _progress_fetches(self, step: int) -> None:
        for slot in [s for s in self._slots.values() if s.state == JoinState.FETCHING_STATE]:
            assert slot.send is not None
            if isinstance(slot.send, SnapshotSend):
                slot.send.start()  # normally already posted at the end of reduce
            if slot.send.error() is not None:
                self._fail(slot, step, f"snapshot send failed: {slot.send.error()}")
            elif step - slot.snapshot_version > self.max_catchup_steps:
                self._fail(slot, step, f"still fetching after {self.max_catchup_steps} steps")
            elif slot.link.poll():
                try:
                    msg = slot.link.recv(timeout=self.timeout_s)
                except LinkError as exc:
                    self._fail(slot, step, f"attach: {exc}")
                    continue
                if msg.kind != Kind.ATTACH or msg.version != slot.snapshot_version:
                    self._fail(
                        slot, step, f"expected ATTACH v{slot.snapshot_version}, got {msg.kind.name} v{msg.version}"
                    )
                    continue
                send, slot.send = slot.send, None
                send.close()
                self._recycle(send)
                self._transition(slot, JoinEvent.RESTORED, step, f"restored snapshot v{msg.version}")

    def _recv_contribution(self, slot: _Slot, step: int) -> Message | None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if not arrives(slot.link, deadline):  # nothing of a message yet: the link is still in step
                slot.missed += 1
                self.stats.missed += 1
                if slot.missed >= self.max_missed:
                    self._fail(slot, step, f"no contribution for {slot.missed} consecutive steps (last: {step})")
                return None
            try:
                # into the memory of the last contribution: `reduce` adds it to the flat gradient before the next.
                # A message that has begun to arrive gets a whole timeout_s of its own (as on the hybrid's end): the
                # rest of the first wait could be a moment, and a live hybrid late by that is not a dead one
                msg = recv_reusing(slot.link, slot.inbox, timeout=self.timeout_s)
            except LinkError as exc:
                self._fail(slot, step, f"no contribution for step {step}: {exc}")
                return None
            if msg.kind == Kind.LEAVE:
                self._detach(slot.worker, step=step, why=f"hybrid left: {msg.info.get('why', '')}")
                return None
            if msg.kind in (Kind.GRAD, Kind.PLACEHOLDER) and msg.step < step:
                self.stats.skipped += 1  # stale: a contribution for a step the core already finished
                continue
            if msg.kind not in (Kind.GRAD, Kind.PLACEHOLDER) or msg.step != step:
                self._fail(slot, step, f"protocol: got {msg.kind.name} for step {msg.step} during step {step}")
                return None
            slot.missed = 0
            return msg

    def _send(self, slot: _Slot, msg: Message, step: int) -> bool:
        try:
            slot.link.send(msg, timeout=self.timeout_s)
            return True
        except LinkError as exc:
            left = self._leave_waiting(slot)
            if left is not None:  # it left between two steps: a leave, not a failure
                self._detach(slot.worker, step=step, why=f"hybrid left: {left.info.get('why', '')}")
            else:
                self._fail(slot, step, f"send {msg.kind.name}: {exc}")
            return False

    def _leave_waiting(self, slot: _Slot) -> Message | None:
        """The LEAVE a hybrid sent before it closed its end, if it is still to be read. A hybrid that leaves between
        two steps closes its link after its best-effort LEAVE, so the core's next send to it can fail (at once on a
        local socket) before the core reads that LEAVE in ``reduce``; late contributions before it are dropped."""
        with contextlib.suppress(LinkError):
            while slot.link.poll():
                msg = slot.link.recv(timeout=self.timeout_s)
                if msg.kind == Kind.LEAVE:
                    return msg
        return None

    def _agree_across_coordinates(self, step: int, ready: list[_Slot]) -> list[_Slot]:
        """Every rank of a hybrid replica must be in one mode at every step: its model-parallel collectives need
        all of its ranks in the forward and backward pass, or none. So, over the model-parallel group: of the
        hybrids ready here, those ready at every coordinate are promoted (the others stay placeholders until they
        are), and a hybrid active here but not at every coordinate (a rank of it left or failed) is detached here
        too. A placeholder whose replica has no rank at some coordinate (never joined there, or failed and did not
        join again) is detached after ``max_catchup_steps`` such boundaries, as a joiner that never catches up is.
        Worker names identify a hybrid replica across coordinates."""
        mine = {
            "ready": sorted(s.worker for s in ready),
            "active": sorted(s.worker for s in self._live() if s.state == JoinState.ACTIVE),
            "known": sorted(self._slots),
        }
        views: list[Any] = [None] * torch.distributed.get_world_size(self._mp_group)
        torch.distributed.all_gather_object(views, mine, group=self._mp_group)
        ready_everywhere = set.intersection(*(set(v["ready"]) for v in views))
        active_everywhere = set.intersection(*(set(v["active"]) for v in views))
        known_everywhere = set.intersection(*(set(v["known"]) for v in views))
        for worker in sorted(set(mine["active"]) - active_everywhere):
            self._detach(worker, step=step, why="a rank of this hybrid replica is not active at every coordinate")
        for slot in [s for s in self._live() if s.state == JoinState.PLACEHOLDER]:
            slot.alone = 0 if slot.worker in known_everywhere else slot.alone + 1
            if slot.alone > self.max_catchup_steps:
                why = f"no rank of this hybrid replica at some coordinate for {slot.alone} steps"
                self._detach(slot.worker, step=step, why=why)
        return [s for s in ready if s.worker in ready_everywhere and s.worker in self._slots]

    def _agree_on_contributions(self, received: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Over the model-parallel group: a hybrid replica's gradient counts only where it arrived valid at every
        coordinate (a rank's late or skipped contribution leaves the others' out too), so every shard of the
        parameters is averaged over the same replicas. The ones left out count as skipped."""
        views: list[Any] = [None] * torch.distributed.get_world_size(self._mp_group)
        torch.distributed.all_gather_object(views, sorted(w for w, _ in received), group=self._mp_group)
        everywhere = set.intersection(*(set(v) for v in views))
        self.stats.skipped += sum(1 for w, _ in received if w not in everywhere)
        return [(w, blob) for w, blob in received if w in everywhere]

    def _replay_copy(self, flat: torch.Tensor) -> torch.Tensor:
        """A copy of this step's reduced gradient for a joiner's replay, in a pruned copy's memory where one fits."""
        while self._spare_replay:
            spare = self._spare_replay.pop()
            if spare.shape == flat.shape and spare.dtype == flat.dtype:
                return spare.copy_(flat)
        return flat.clone()

    def _prune_replay(self) -> None:
        needed = [s.snapshot_version for s in self._slots.values() if s.state == JoinState.FETCHING_STATE]
        keep_from = min(needed) if needed else None
        for s in [s for s in self._replay if keep_from is None or s < keep_from]:
            # every send of it is done: STEP messages are sent synchronously in begin_step, before this prune
            pruned = self._replay.pop(s)
            if self.reuse_snapshot_buffers and len(self._spare_replay) < REPLAY_SPARES:
                self._spare_replay.append(pruned)

    def _fail(self, slot: _Slot, step: int, why: str) -> None:
        self.stats.failures += 1
        self._transition(slot, JoinEvent.FAIL, step, why)
        self._slots.pop(slot.worker, None)
        self._close(slot)

    def _close(self, slot: _Slot) -> None:
        slot.link.close()
        if slot.send is not None:
            slot.send.close()
            slot.send = None

    def _transition(self, slot: _Slot, event: JoinEvent, step: int, why: str) -> None:
        record = self.states.apply(slot.worker, event, step=step, why=why)
        slot.state = record.dst
        if self._on_transition is not None:
            self._on_transition(record)
