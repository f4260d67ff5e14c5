"""The core packs a joiner's snapshot on a background thread while it trains (issue 16): the snapshot is still
the state of its version, because ``reduce`` waits for the pack before the caller's optimizer step."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from libra.elastic import snapshot as snapshot_mod  # noqa: E402
from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.grads import trainable  # noqa: E402
from libra.elastic.snapshot import Snapshot, state_digest  # noqa: E402
from libra.elastic.wire import Kind, LinkError, Message, TcpLink  # noqa: E402
from tests.limits import scaled  # noqa: E402


class _AttachHeld(TcpLink):
    """A hybrid's end of a link that holds its ATTACH until ``release`` is set, so that the core reads it at the
    boundary the test paces. Without it, on a busy machine a tiny state can be packed, sent, restored and attached
    before the core's own boundary that read the JOIN has checked its fetches. That boundary then reads the ATTACH
    itself, and a test waiting for it at the next one waited forever (seen in CI)."""

    release: threading.Event

    def send(self, msg: Message, *, timeout: float) -> None:
        if msg.kind == Kind.ATTACH:
            assert self.release.wait(scaled(60)), "the test never released the ATTACH"
        super().send(msg, timeout=timeout)


def _link(sock: socket.socket, release: threading.Event | None = None) -> TcpLink:
    """A link over one end of an AF_UNIX socketpair (skipping the TCP_NODELAY of __init__); with ``release``, one
    that holds its ATTACH until the event is set (`_AttachHeld`)."""
    link = TcpLink.__new__(TcpLink if release is None else _AttachHeld)
    link._sock, link._fault, link._send_lock, link.backend = sock, (lambda _: None), threading.Lock(), "auto"
    if isinstance(link, _AttachHeld):
        link.release = release
    return link


def test_snapshot_packed_during_the_step_is_the_state_of_its_version(group, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    expected = state_digest(model, opt)  # version 0: the state at begin_step(0)
    # Hold the background pack until the caller has called reduce (and would run its optimizer step).
    started, gate = threading.Event(), threading.Event()
    real = snapshot_mod._capture_tensors

    def held(*args):
        started.set()
        gate.wait(scaled(30))
        return real(*args)

    monkeypatch.setattr(snapshot_mod, "_capture_tensors", held)
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    hybrid = _link(hybrid_end)
    hybrid.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": "h"}), timeout=scaled(5))
    received: dict = {}
    reader = threading.Thread(target=lambda: received.update(msg=hybrid.recv(timeout=scaled(60))))
    reader.start()

    core.begin_step(0)
    assert started.wait(scaled(30))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # changes BatchNorm statistics during the pack
    threading.Timer(0.2, gate.set).start()  # if reduce did not wait, the optimizer step below would race the pack
    core.reduce(0, [p.grad for p in trainable(model)])
    opt.step()
    assert state_digest(model, opt) != expected
    reader.join(scaled(60))
    snap = Snapshot.from_message(received["msg"])
    assert snap.version == 0 and snap.verified and snap.checksums == expected
    core.close()
    hybrid.close()


def test_the_next_snapshot_reuses_the_buckets_of_a_delivered_one(group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # Adam state exists, so both snapshots have the same layout
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    hybrids, snaps, buckets = [], [], []

    def join(worker: str) -> None:
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        hybrid = _link(hybrid_end)
        hybrids.append(hybrid)
        hybrid.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": worker}), timeout=scaled(5))

    def placeholder(hybrid: TcpLink) -> None:
        """An attached hybrid that answers every STEP with a placeholder, until the link closes."""
        try:
            while True:
                msg = hybrid.recv(timeout=scaled(60))
                if msg.kind == Kind.STEP:
                    hybrid.send(Message(kind=Kind.PLACEHOLDER, step=msg.step, version=msg.step), timeout=scaled(5))
                elif msg.kind == Kind.LEAVE:
                    return
        except LinkError:
            return

    def step(t: int) -> None:
        core.begin_step(t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        core.reduce(t, [p.grad for p in trainable(model)])
        opt.step()

    for worker, t in (("h1", 0), ("h2", 2)):
        join(worker)
        expected = state_digest(model, opt)
        step(t)
        buckets.append([b.data_ptr() for b in core._slots[worker].send.pending.wait().buckets])
        snap = Snapshot.from_message(hybrids[-1].recv(timeout=scaled(30)))
        assert snap.version == t and snap.checksums == expected
        snaps.append(snap)
        hybrids[-1].send(Message(kind=Kind.ATTACH, step=t, version=t), timeout=scaled(5))
        threading.Thread(target=placeholder, args=(hybrids[-1],), daemon=True).start()
        while not core.join_message_waiting():
            threading.Event().wait(0.01)
        step(t + 1)  # reads the ATTACH: the snapshot is delivered, its buckets become spare
        assert core._spare_buckets is not None
    assert buckets[1] == buckets[0]  # the second snapshot was packed into the first one's memory
    core.close()
    for h in hybrids:
        h.close()


def test_the_flat_gradient_and_replay_copies_live_in_reused_memory_and_replay_the_reduced_values(group):
    """Every step's flat gradient is flattened into the last one's tensor, and a later join's replay copies go
    into pruned copies (new memory this size costs more in page faults than the copy). What a joiner replays is
    still each step's reduced gradient: a replay copy that aliased the live flat buffer, or a spare handed out while
    still needed, would replay another step's values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    reduced: dict[int, torch.Tensor] = {}
    flats, copies = [], {}  # the tensors themselves (held, so a new one can never reuse an old one's identity)
    links = []

    def step(t: int) -> None:
        core.begin_step(t)
        g = torch.Generator().manual_seed(t)  # a different batch, so a different gradient, every step
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = core.reduce(t, [p.grad for p in trainable(model)])
        reduced[t] = torch.cat([gr.reshape(-1) for gr in grads]).clone()
        flats.append(core._flat)
        copies.update(core._replay)
        opt.step()

    def placeholder_once(hybrid: TcpLink, got: dict) -> None:
        got["step"] = hybrid.recv(timeout=scaled(30))
        hybrid.send(Message(kind=Kind.PLACEHOLDER, step=got["step"].step, version=got["step"].step), timeout=5)
        got["reduced"] = hybrid.recv(timeout=scaled(30))

    def join_and_replay(worker: str, t: int) -> dict[int, torch.Tensor]:
        """JOIN before step t; the snapshot arrives and the ATTACH is held back two steps, so steps t..t+2 are
        kept for replay; returns what the STEP message of step t + 3, which attaches the hybrid, replays."""
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        hybrid = _link(hybrid_end)
        links.append(hybrid)
        hybrid.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": worker}), timeout=scaled(5))
        step(t)
        assert hybrid.recv(timeout=scaled(30)).kind == Kind.SNAPSHOT
        step(t + 1)
        step(t + 2)
        hybrid.send(Message(kind=Kind.ATTACH, step=t, version=t), timeout=scaled(5))
        while not core.join_message_waiting():
            threading.Event().wait(0.01)
        got: dict = {}
        answer = threading.Thread(target=placeholder_once, args=(hybrid, got), daemon=True)
        answer.start()
        step(t + 3)
        answer.join(scaled(30))
        msg = got["step"]
        assert msg.kind == Kind.STEP and msg.info["replay"] == [t, t + 1, t + 2]
        core.remove(worker, step=t + 4, why="test over")
        return {s: blob.view(torch.float32).clone() for s, blob in zip(msg.info["replay"], msg.blobs)}

    first = join_and_replay("h1", 0)
    step(4)  # no joiner fetching any more: the replay copies are pruned, REPLAY_SPARES of them kept
    second = join_and_replay("h2", 5)
    for s, values in (*first.items(), *second.items()):
        assert torch.equal(values, reduced[s]), s
    assert len(flats) == 9 and all(f is flats[0] for f in flats)  # one flat tensor for all nine steps
    reused = [s for s in second if any(copies[s] is copies[r] for r in first)]
    assert reused == [5, 6]  # the second join's first two copies went into pruned ones; the third is new
    core.close()
    for link in links:
        link.close()


def test_the_snapshot_is_sent_as_soon_as_it_is_packed_not_at_the_end_of_reduce(group, monkeypatch):
    """On TCP the packing thread posts the snapshot's send itself: the transfer overlaps the rest of the core's
    forward and backward pass instead of starting after ``reduce``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    expected = state_digest(model, opt)
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    hybrid = _link(hybrid_end)
    hybrid.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": "h"}), timeout=scaled(5))
    received: dict = {}
    reader = threading.Thread(target=lambda: received.update(msg=hybrid.recv(timeout=scaled(60))))
    reader.start()
    core.begin_step(0)
    reader.join(scaled(30))  # the core is between begin_step and reduce: only the packing thread can have sent it
    assert "msg" in received
    snap = Snapshot.from_message(received["msg"])
    assert snap.version == 0 and snap.checksums == expected
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    core.reduce(0, [p.grad for p in trainable(model)])
    opt.step()
    core.close()
    hybrid.close()


def _small(warm_step: int | None = None, fused: bool = False, device: str = "cpu"):
    """A small model and its Adam; ``warm_step``: one optimizer step on that step's batch first, so Adam's state
    exists (a snapshot's layout then matches the core's). ``fused``: torch's one-kernel Adam."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused)
    if warm_step is not None:
        _grads(model, warm_step, slice(0, 8))
        opt.step()
    return model, opt


def _grads(model, t: int, part: slice) -> list:
    """The gradient of step ``t``'s batch (a different one each step) on ``part`` of it."""
    g = torch.Generator().manual_seed(t)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    for p in model.parameters():
        p.grad = None
    torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
    return [p.grad for p in trainable(model)]


def _train_hybrid(hybrid, model, opt, seen: list, indices: dict | None = None) -> None:
    """Step ``hybrid`` until the core detaches it, noting (step, mode, state digest after the step) in ``seen`` and,
    with ``indices``, step -> (mode, replica index)."""
    from libra.elastic.grads import Mode

    while (a := hybrid.begin_step()) is not None:
        if indices is not None:
            indices[a.step] = (a.mode.value, a.replica_index)
        g = (
            _grads(model, a.step, a.shard(8))
            if a.mode == Mode.ACTIVE
            else [torch.zeros_like(p) for p in trainable(model)]
        )
        hybrid.reduce(a.step, g)
        for p, gr in zip(trainable(model), g, strict=True):
            p.grad = gr
        opt.step()
        seen.append((a.step, a.mode, state_digest(model, opt)))


def _core_steps(core, model, opt, steps, digests: dict, before=None) -> None:
    for t in steps:
        if before is not None:
            before(t)
        a = core.begin_step(t)
        core.reduce(t, _grads(model, t, a.shard(8)))
        opt.step()
        digests[t] = state_digest(model, opt)


class _Hybrid(threading.Thread):
    """The hybrid's side of a test on a thread of its own, keeping the error it ended with (if any) for the test's
    thread to raise at once rather than wait out its deadline."""

    def __init__(self, target) -> None:
        super().__init__(daemon=True)
        self._target_fn, self.error = target, None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:
            self.error = exc
            raise


def _until(ready, hybrid: _Hybrid, what: str = "nothing waiting for the core") -> None:
    """Wait until `ready()`, at most a scaled minute; the hybrid thread's error, if it failed first."""
    deadline = time.monotonic() + scaled(60)
    while not ready():
        if hybrid.error is not None:
            raise AssertionError(f"the hybrid's thread failed: {hybrid.error!r}") from hybrid.error
        assert time.monotonic() < deadline, f"{what} after {scaled(60):.0f} s"
        threading.Event().wait(0.01)


def _until_join_message(core, hybrid: _Hybrid) -> None:
    _until(core.join_message_waiting, hybrid, f"no JOIN or ATTACH waiting ({core.workers()})")


def _join_once(core, model, opt, hybrid, steps: int) -> tuple[list, dict]:
    """``hybrid`` (on its own thread) joins before core step 0 and trains until the core removes it after
    ``steps`` steps; returns what it saw (`_train_hybrid`) and the core's state digest after each step."""
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    joined, release, seen = threading.Event(), threading.Event(), []

    def run_hybrid() -> None:
        hybrid.join(_link(hybrid_end, release), snapshot_timeout_s=scaled(60))
        joined.set()
        _train_hybrid(hybrid, hybrid._model, hybrid._optimizer, seen)

    def before(t: int) -> None:
        if t == 1:  # snapshot v0 restored; the ATTACH goes now, so step 1 reads it
            release.set()
            assert joined.wait(scaled(60))
            _until_join_message(core, thread)

    thread = _Hybrid(run_hybrid)
    thread.start()
    _until_join_message(core, thread)  # the JOIN is in the socket before step 0 begins
    digests: dict = {}
    _core_steps(core, model, opt, range(steps), digests, before)
    core.remove("h", step=steps, why="test over")
    thread.join(scaled(60))
    return seen, digests


@pytest.mark.parametrize(("min_placeholder_steps", "fused"), [(0, False), (1, False), (0, True)])
def test_a_joiner_is_active_at_the_boundary_that_reads_its_attach_and_stays_bitwise_equal(
    group, min_placeholder_steps, fused
):
    """By default the STEP message that attaches a hybrid also promotes it: it carries the reduced gradients the
    hybrid missed, which it replays before computing, so it computes that step's gradient on that step's state.
    With ``min_placeholder_steps=1`` it is a placeholder for one step first. Either way every later state is
    bitwise the core's, and the core counts the hybrid's gradient from the step it is active."""
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica

    model, opt = _small(fused=fused)
    extra = {} if min_placeholder_steps == 0 else {"min_placeholder_steps": min_placeholder_steps}
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30), **extra
    )
    h_model, h_opt = _small(fused=fused)
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen, digests = _join_once(core, model, opt, hybrid, 4)
    first_active = 1 + min_placeholder_steps
    assert [(s, m) for s, m, _ in seen] == [
        (t, Mode.ACTIVE if t >= first_active else Mode.PLACEHOLDER) for t in (1, 2, 3)
    ]
    assert all(d == digests[s] for s, _, d in seen)  # bitwise the core's after every step
    counted = {r.step: r.num_contributed for r in core.records}
    assert counted == {t: 2 if t >= first_active else 1 for t in range(4)}
    core.close()


@pytest.mark.parametrize("fused", [False, True])
def test_a_hybrid_that_joins_again_receives_the_snapshot_into_the_memory_its_state_lives_in(group, fused):
    """The second join of a hybrid receives its snapshot straight into the buckets of the first (the model's and
    the optimizer's memory since then): no new memory, and the state is still bitwise the core's. With the fused
    Adam too, whose one kernel then steps tensors that are views of the buckets."""
    from libra.elastic.hybrid import HybridReplica

    model, opt = _small(warm_step=-1, fused=fused)  # Adam's state exists, so both snapshots have the same layout
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    h_model, h_opt = _small(fused=fused)
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    links: queue.Queue = queue.Queue()  # the hybrid may be detached before the core admits its next link
    joined, seen, memory, in_place = [threading.Event(), threading.Event()], [], [], []
    releases = [threading.Event(), threading.Event()]  # each join's ATTACH goes when its step is near
    unused_releases = iter(releases)

    def run_hybrid() -> None:
        for n in range(2):
            hybrid.join(links.get(timeout=scaled(60)), snapshot_timeout_s=scaled(60))
            memory.append(([b.data_ptr() for b in hybrid._kept], [p.data_ptr() for p in h_model.parameters()]))
            in_place.append(hybrid.in_place)
            joined[n].set()
            _train_hybrid(hybrid, h_model, h_opt, seen)

    def admit() -> None:
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        links.put(_link(hybrid_end, next(unused_releases)))

    def before(t: int) -> None:
        if t in (1, 4):
            releases[t // 4].set()
            assert joined[t // 4].wait(scaled(60))
            _until_join_message(core, thread)
        if t == 3:
            core.remove("h", step=3, why="released")
            admit()
            _until_join_message(core, thread)

    admit()
    thread = _Hybrid(run_hybrid)
    thread.start()
    _until_join_message(core, thread)
    digests: dict = {}
    _core_steps(core, model, opt, range(6), digests, before)
    core.remove("h", step=6, why="test over")
    thread.join(scaled(60))
    assert [s for s, _, _ in seen] == [1, 2, 4, 5]
    assert all(d == digests[s] for s, _, d in seen)
    (first_buckets, first_params), (second_buckets, second_params) = memory
    assert second_buckets == first_buckets and second_params == first_params
    buckets = len(first_buckets)
    assert in_place == [(0, buckets), (buckets, buckets)]  # (the first join, not prepared, into new memory)
    core.close()


def test_a_prepared_hybrid_receives_its_first_snapshot_into_the_buckets_it_prepared(group):
    """``prepare`` lays the hybrid's state out in buckets (the parameters live in them at once), and the first join
    receives into those: the same memory before and after, the same state as the core's."""
    from libra.elastic.hybrid import HybridReplica

    model, opt = _small(warm_step=-1)
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    h_model, h_opt = _small(warm_step=-2)  # a different state, with Adam's state in place (so the sizes match)
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    hybrid.prepare()
    prepared = [b.data_ptr() for b in hybrid._kept]
    spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in hybrid._kept]
    assert all(any(lo <= p.data_ptr() < hi for lo, hi in spans) for p in h_model.parameters())
    seen, digests = _join_once(core, model, opt, hybrid, 3)
    assert [b.data_ptr() for b in hybrid._kept] == prepared
    assert hybrid.in_place == (len(prepared), len(prepared))
    hybrid.prepare()  # the state lives in the buckets already: nothing to lay out again
    assert [b.data_ptr() for b in hybrid._kept] == prepared
    assert [s for s, _, _ in seen] == [1, 2] and all(d == digests[s] for s, _, d in seen)
    core.close()


def test_a_prepared_core_packs_its_first_snapshot_into_the_buckets_it_prepared(group):
    """``CoreExchange.prepare`` packs the state once into buckets kept for the first snapshot: the first join packs
    into that memory (the delivered snapshot's buckets, kept for the next, are the prepared ones), and the joiner's
    state is the core's after every step. Without ``reuse_snapshot_buffers`` there is nowhere to keep them."""
    from libra.elastic.hybrid import HybridReplica

    model, opt = _small(warm_step=-1)
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    core.prepare()
    prepared = [b.data_ptr() for b in core._spare_buckets or ()]
    assert prepared
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen, digests = _join_once(core, model, opt, hybrid, 3)
    assert [b.data_ptr() for b in core._spare_buckets or ()] == prepared
    assert [s for s, _, _ in seen] == [1, 2] and all(d == digests[s] for s, _, d in seen)
    core.close()
    core.reuse_snapshot_buffers = False
    with pytest.raises(ValueError, match="reuse_snapshot_buffers"):
        core.prepare()


def test_gradients_are_received_into_the_memory_of_the_last_one_on_both_ends(group, monkeypatch):
    """Every step the core receives the hybrid's gradient and the hybrid the reduced one (100M parameters: 400 MB
    each): both land in the memory the last one landed in (`ReusedBlobs`), not in new memory, and every state is
    still the core's. The spy keeps every received blob alive, so new memory could not reuse an old address."""
    from libra.elastic.hybrid import HybridReplica

    received: dict[Kind, list] = {Kind.GRAD: [], Kind.REDUCED: []}
    real = TcpLink.recv

    def spy(self, *, timeout, into=None):
        msg = real(self, timeout=timeout, into=into)
        if msg.kind in received:
            received[msg.kind].append(msg.blobs)  # kept alive
        return msg

    monkeypatch.setattr(TcpLink, "recv", spy)
    model, opt = _small()
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen, digests = _join_once(core, model, opt, hybrid, 5)
    assert [s for s, _, _ in seen] == [1, 2, 3, 4] and all(d == digests[s] for s, _, d in seen)
    for kind in (Kind.GRAD, Kind.REDUCED):
        memory = {blob.untyped_storage().data_ptr() for blobs in received[kind] for blob in blobs}
        assert len(received[kind]) >= 3 and len(memory) == 1, (kind, len(received[kind]), len(memory))
    core.close()


def test_with_a_model_parallel_group_hybrids_take_replica_indices_in_name_order(group):
    """The ranks of one hybrid replica join their coordinates in whatever order their JOINs arrive there, so that
    every coordinate gives a hybrid replica the same shard of the batch, the replica indices follow the worker names
    (`CoreExchange._live` is in name order), not the order of arrival: ``b`` arrives and is promoted first, yet ``a``
    takes index 1 once both are active (the core is 0)."""
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.states import JoinState

    model, opt = _small()
    core = CoreExchange(
        core_group=group,
        core_rank=0,
        num_core_replicas=1,
        model=model,
        optimizer=opt,
        timeout_s=scaled(30),
        model_parallel_group=group,
    )
    a_release, indices, threads = threading.Event(), {"a": {}, "b": {}}, []
    for name in ("b", "a"):
        h_model, h_opt = _small()
        hybrid = HybridReplica(worker=name, model=h_model, optimizer=h_opt, timeout_s=scaled(30))
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        link = _link(hybrid_end, a_release if name == "a" else None)

        def run(hybrid=hybrid, link=link, name=name, h_model=h_model, h_opt=h_opt) -> None:
            hybrid.join(link, snapshot_timeout_s=scaled(60))
            _train_hybrid(hybrid, h_model, h_opt, [], indices[name])

        threads.append(_Hybrid(run))
        threads[-1].start()
    both_active_at = None
    for t in range(40):
        if "b" in core.workers(JoinState.ACTIVE):
            a_release.set()  # a's ATTACH goes only once b is active
        deadline = time.monotonic() + scaled(30)
        while core.joining + len(core.workers(JoinState.PLACEHOLDER)) and not core.join_message_waiting():
            assert time.monotonic() < deadline and not any(th.error for th in threads), [th.error for th in threads]
            threading.Event().wait(0.005)
        a = core.begin_step(t)
        core.reduce(t, _grads(model, t, a.shard(8)))
        opt.step()
        if both_active_at is None and len(core.workers(JoinState.ACTIVE)) == 2:
            both_active_at = t
        if both_active_at is not None and t >= both_active_at + 2:
            break
    assert both_active_at is not None
    first_b = min(s for s, (m, _) in indices["b"].items() if m == "active")
    first_a = min(s for s, (m, _) in indices["a"].items() if m == "active")
    assert first_b < first_a and indices["b"][first_b][1] == 1  # alone first, b is replica 1
    for s in range(first_a, t + 1):
        assert indices["a"][s] == ("active", 1) and indices["b"][s] == ("active", 2), s
    core.close()
    for th in threads:
        th.join(scaled(30))
