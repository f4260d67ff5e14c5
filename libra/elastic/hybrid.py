"""The hybrid replica's end of the side channel: :class:`HybridReplica`.

A hybrid worker that the controller borrowed for training runs::

    hybrid = HybridReplica(worker="hybrid-0", model=model, optimizer=optimizer, timeout_s=5.0)
    hybrid.join(TcpLink.connect(host, port, timeout=5.0))    # JOIN, fetch + restore the snapshot, ATTACH
    while training:
        a = hybrid.begin_step()          # waits for the core's STEP; replays missed steps; None once told to leave
        if a is None: break
        grads = compute gradients on batch[a.shard(global_batch)] if a.mode == ACTIVE else zeros
        hybrid.reduce(a.step, grads)     # sends the gradient (or a placeholder), receives the reduced one into grads
        optimizer.step()
    hybrid.leave()                       # at once; the worker goes back to rollout

Its state version is the number of optimizer steps its state has taken; it is bitwise equal to the core's at every
step boundary after the snapshot is restored and the replay is done, because it applies exactly the reduced
gradients the core applied, with the same optimizer. A placeholder never sends a gradient.

``timeout_s`` bounds every wait on the core; ``begin_step`` waits through a whole core step (the core's
compute), so it should exceed the longest step; a core that stays silent for one ``timeout_s`` is waited out
up to ``max_missed`` times (a slow step is not a dead core). A longer silence, a timeout in the middle of a
message, a closed core or a protocol error marks the hybrid
``FAILED`` and raises :class:`~libra.elastic.wire.LinkError`; ``join`` again to retry.

Memory: the model and optimizer state live in the buckets of the snapshot they were restored from
(``restore(share_buckets=True)``), and a later join receives its snapshot straight into them (over TCP, where each
bucket's size matches), so a worker that joins again touches no new memory for it (:meth:`HybridReplica.prepare`
does the same for a first join). So a join that fails part way through the transfer leaves the model and
optimizer state undefined until a join succeeds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch

from libra.elastic.grads import (
    Mode,
    StepAssignment,
    check_backend,
    check_gradients,
    check_seconds,
    check_whole,
    flatten,
    set_grads,
    to_device_of,
    to_host,
    trainable,
    unflatten_into,
)
from libra.elastic.snapshot import Snapshot, capture, restore, state_tensors
from libra.elastic.states import JoinEvent, JoinState, WorkerStates
from libra.elastic.wire import (
    FaultHook,
    Kind,
    Link,
    LinkError,
    Message,
    ReusedBlobs,
    _no_fault,
    arrives,
    as_bytes,
    recv_reusing,
)


def _step_info(msg: Message) -> tuple[Mode, int, int, list[int]]:
    """A STEP message's mode, replica index, number of replicas and replayed steps (one gradient blob each), or
    LinkError: a malformed STEP is a protocol error like any other."""
    info = msg.info
    try:
        mode, index, num, replay = Mode(info["mode"]), info["replica_index"], info["num_replicas"], info["replay"]
    except (KeyError, TypeError, ValueError) as exc:
        raise LinkError(f"malformed STEP {msg.step}: {exc!r} in {info!r}") from None
    whole = all(type(v) is int for v in (index, num, *(replay if isinstance(replay, list) else [None])))
    if not whole or not isinstance(replay, list) or len(replay) != len(msg.blobs) or num < 1:
        raise LinkError(f"malformed STEP {msg.step}: {info!r} with {len(msg.blobs)} gradient(s)")
    return mode, index, num, replay


class HybridReplica:
    def __init__(
        self,
        *,
        worker: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        timeout_s: float,
        backend: str = "auto",
        fault: FaultHook = _no_fault,
        max_missed: int = 3,
    ) -> None:
        if not isinstance(worker, str) or not worker:
            raise ValueError(f"worker must be a non-empty name (the core refuses a JOIN without one), got {worker!r}")
        self.max_missed = check_whole("max_missed", max_missed, least=1)
        self.worker, self._model, self._optimizer = worker, model, optimizer
        self.timeout_s, self._backend = check_seconds("timeout_s", timeout_s), check_backend(backend)
        self._fault = fault
        self.states = WorkerStates(log_limit=10_000)
        self.version = -1
        self.mode: Mode | None = None
        self._link: Link | None = None
        self._step = -1
        self._flat: torch.Tensor | None = None  # the last step's flat gradient, reused (`grads.flatten`)
        # the memory the reduced (and replayed) gradients are received into, message after message: each is used
        # up before the next arrives
        self._inbox = ReusedBlobs()
        # A replica on a GPU: its gradient goes out through page-locked host memory and the reduced ones come in
        # through device memory, both allocated once
        self._host_flat: torch.Tensor | None = None
        self._device_in: torch.Tensor | None = None
        # the buckets of the last restored snapshot, which the model and optimizer state live in: the next join
        # receives its snapshot into them where the sizes match
        self._kept: tuple[torch.Tensor, ...] | None = None
        #: the last join's snapshot: (buckets received into the state's own memory, buckets); a first join that
        #: was not prepared receives all of them into new memory
        self.in_place: tuple[int, int] = (0, 0)

    @property
    def state(self) -> JoinState:
        return self.states.state(self.worker)

    def join(self, link: Link, *, snapshot_timeout_s: float = 60.0) -> int:
        """Announce, fetch and restore the core's snapshot, attach. Returns the restored version."""
        snapshot_timeout_s = check_seconds("snapshot_timeout_s", snapshot_timeout_s)
        if self._link is not None:  # before anything changes: the stay in progress keeps its link
            raise RuntimeError(f"hybrid {self.worker!r} is in training already (state {self.state.value}): leave first")
        if self.state == JoinState.FAILED:
            self._event(JoinEvent.RECOVER, "restarting a join")
        self._link = link
        self._event(JoinEvent.REQUEST, "joining training")
        try:
            link.send(
                Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": self.worker}), timeout=self.timeout_s
            )
            self._event(JoinEvent.START_FETCH, "JOIN sent")
            self._fault("fetching")
            kept = self._kept or ()
            reused: list[int] = []

            def into(i: int, n: int) -> torch.Tensor | None:
                # into the state's own memory since the last join: touched already, where new memory this size
                # costs more in page faults than the transfer (what was there is replaced anyway)
                if i < len(kept) and int(kept[i].numel()) == n:
                    reused.append(i)
                    return kept[i]
                return None

            msg = recv_reusing(link, into, timeout=snapshot_timeout_s)
            if msg.kind == Kind.LEAVE:  # a name in training already, or one the controller removed meanwhile
                raise LinkError(f"the core refused the join of {self.worker!r}: {msg.info.get('why', '')}")
            snapshot = Snapshot.from_message(msg)
            self.in_place = (len(reused), len(msg.blobs))
            self._fault("restoring")
            self._live_in(snapshot)
            self.version = snapshot.version
            self._event(JoinEvent.RESTORED, f"restored snapshot v{snapshot.version}")
            link.send(Message(kind=Kind.ATTACH, step=self.version, version=self.version), timeout=self.timeout_s)
        except Exception as exc:
            self._die(f"join: {exc}")
            raise
        return self.version

    def prepare(self) -> None:
        """Lay the model and optimizer state out in snapshot buckets now (one copy of the state, into new memory;
        the old memory is released), so that the first join receives its snapshot straight into memory already
        touched, as a later join does. Worth it where touching new memory is slow (page faults) and the worker
        starts well before it is borrowed. The optimizer needs its state already (after one step, say, as the
        core's has): otherwise the sizes differ and the join receives into new memory, as without this.

        Nothing is copied where the state lives in the buckets already (after a join whose layout is the state's
        own). After a stay that began from a snapshot without the optimizer's state (a core's step 0), the
        optimizer's state lives outside them: called then, as the worker goes back to rollout, it lays the state
        out again so that the next join lands in place."""
        if self._lives_in_kept():
            return
        self._live_in(capture(self._model, self._optimizer, version=self.version))

    def _lives_in_kept(self) -> bool:
        """Every tensor of the state lies in the kept buckets."""
        if not self._kept:
            return False
        spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in self._kept]
        return all(
            any(lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi for lo, hi in spans)
            for t in state_tensors(self._model, self._optimizer)
        )

    def _live_in(self, snapshot: Snapshot) -> None:
        """Restore ``snapshot`` with the model and the optimizer state living in its buckets (memory nothing else
        uses), and keep them for the next join to receive into."""
        restore(snapshot, self._model, self._optimizer, backend=self._backend, share_buckets=True)
        self._kept = snapshot.buckets

    def begin_step(self) -> StepAssignment | None:
        """Wait for the core's STEP message; replay the reduced gradients it carries; None if told to leave."""
        link = self._require_link()
        try:
            msg = self._recv(link)
            if msg.kind == Kind.LEAVE:
                self._leave_now(f"core detached us: {msg.info.get('why', '')}")
                return None
            if msg.kind != Kind.STEP:
                raise LinkError(f"expected STEP, got {msg.kind.name}")
            mode, index, num_replicas, replay = _step_info(msg)
            for i, s in enumerate(replay):
                if s != self.version:
                    raise LinkError(f"replay of step {s} but state is at version {self.version}")
                self._fault("catchup")
                grads = set_grads(self._model, self._on_device(self._gradient(msg, i)))
                del grads
                self._optimizer.step()
                self.version += 1
            if msg.step != self.version:
                raise LinkError(f"STEP {msg.step} but state is at version {self.version} after replay")
            if mode == Mode.ACTIVE and self.state == JoinState.PLACEHOLDER:
                self._event(JoinEvent.CAUGHT_UP, f"active from step {msg.step}")
            self.mode, self._step = mode, msg.step
            return StepAssignment(step=msg.step, mode=mode, replica_index=index, num_replicas=num_replicas)
        except Exception as exc:
            self._die(f"step: {exc}")
            raise

    def reduce(self, step: int, grads: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Send this step's gradient (placeholder: nothing), receive the reduced gradient into ``grads``.
        Call ``optimizer.step()`` once afterwards.

        ``grads`` must be the tensors the optimizer reads (``[p.grad for p in model.parameters() if
        p.requires_grad]``), in a placeholder step too: there, give zero tensors bound as ``p.grad`` (e.g.
        ``p.grad = torch.zeros_like(p)``), since the reduced gradient is written into them. A LEAVE from the core
        during this call raises ``LinkError`` (the worker is then back in rollout)."""
        link = self._require_link()
        if step != self._step:
            raise RuntimeError(f"reduce({step}) but the current step is {self._step}")
        self._check_grads(step, grads)  # before the step is used up: the caller can reduce the right ones then
        try:
            if self.mode == Mode.ACTIVE:
                self._flat = flatten(grads, out=self._flat)  # nothing holds it after the send
                flat = self._host_flat = to_host(self._flat, out=self._host_flat)  # itself on a CPU replica
                self._fault("active")
                link.send(
                    Message(
                        kind=Kind.GRAD,
                        step=step,
                        version=self.version,
                        info={"dtype": str(flat.dtype)},
                        blobs=(as_bytes(flat),),
                    ),
                    timeout=self.timeout_s,
                )
            else:
                self._fault("placeholder")
                link.send(Message(kind=Kind.PLACEHOLDER, step=step, version=self.version), timeout=self.timeout_s)
            msg = self._recv(link)
            if msg.kind == Kind.LEAVE:
                self._leave_now(f"core detached us: {msg.info.get('why', '')}")
                raise LinkError("detached by the core during the step")
            if msg.kind != Kind.REDUCED or msg.step != step:
                raise LinkError(f"expected REDUCED {step}, got {msg.kind.name} {msg.step}")
            unflatten_into(self._on_device(self._gradient(msg, 0)), grads)
            self.version += 1
            return grads
        except Exception as exc:
            if self._link is not None:
                self._die(f"reduce: {exc}")
            raise

    def leave(self, why: str = "released to rollout") -> None:
        """Leave at once (best-effort LEAVE to the core); the worker is back in rollout."""
        if self._link is None:
            return
        self._fault("leave")
        with contextlib.suppress(LinkError):
            self._link.send(
                Message(kind=Kind.LEAVE, step=self._step, version=self.version, info={"why": why}),
                timeout=min(self.timeout_s, 1.0),
            )
        self._leave_now(why)

    # -- internals ----------------------------------------------------------------------------------------------

    def _recv(self, link: Link) -> Message:
        """The core's next message: up to ``max_missed - 1`` silent ``timeout_s`` are waited out first."""
        for _ in range(self.max_missed - 1):
            if arrives(link, time.monotonic() + self.timeout_s):
                break
        return recv_reusing(link, self._inbox, timeout=self.timeout_s)

    def _check_grads(self, step: int, grads: Sequence[torch.Tensor]) -> None:
        """``grads`` must hold as many values as the trainable parameters, in their dtype: the reduced gradient is
        written into them as that dtype, and the core skips a gradient of another size or dtype every step."""
        check_gradients(step, grads, trainable(self._model))
        dtypes = sorted({str(g.dtype) for g in grads} - {str(self._dtype())})
        if dtypes:
            raise ValueError(f"reduce({step}): gradients of dtype {dtypes}, but the model trains in {self._dtype()}")

    def _gradient(self, msg: Message, i: int) -> torch.Tensor:
        """Blob ``i`` of ``msg`` as a flat gradient of the model's trainable parameters, or LinkError."""
        dtype, expected = self._dtype(), sum(p.numel() for p in trainable(self._model))
        blob = msg.blobs[i] if i < len(msg.blobs) else None
        if blob is None or blob.numel() != expected * dtype.itemsize:
            got = "none" if blob is None else f"{blob.numel():,} bytes"
            raise LinkError(f"{msg.kind.name} {msg.step}: gradient {i} is {got}, not {expected:,} {dtype} values")
        return blob.view(dtype)

    def _on_device(self, flat: torch.Tensor) -> torch.Tensor:
        """A received flat gradient on the device of the model's parameters (itself on a CPU replica): one copy
        into reused device memory rather than one small copy a tensor."""
        param = next(p for p in self._model.parameters() if p.requires_grad)
        self._device_in = to_device_of(flat, param, out=self._device_in)
        return self._device_in

    def _dtype(self) -> torch.dtype:
        return next(p.dtype for p in self._model.parameters() if p.requires_grad)

    def _require_link(self) -> Link:
        if self._link is None:
            raise RuntimeError(f"hybrid {self.worker!r} is not in training (state {self.state.value})")
        return self._link

    def _leave_now(self, why: str) -> None:
        event = JoinEvent.LEAVE if self.state == JoinState.ACTIVE else JoinEvent.CANCEL
        if self.state in (JoinState.REQUESTED, JoinState.FETCHING_STATE, JoinState.PLACEHOLDER, JoinState.ACTIVE):
            self._event(event, why)
        self._close()

    def _die(self, why: str) -> None:
        if self.state != JoinState.FAILED:
            self._event(JoinEvent.FAIL, why)
        self._close()

    def _close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        self.mode = None
        self._device_in = None  # device memory goes back to rollout; the page-locked host copy is kept (slow to make)

    def _event(self, event: JoinEvent, why: str) -> None:
        self.states.apply(self.worker, event, step=max(self.version, 0), why=why)
