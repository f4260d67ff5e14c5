"""The core's and the hybrid's exchange worked out by hand (scripts/mutation.sh elastic_core).

The first test plays a hybrid message by message over a socket pair, so every number the core keeps (its
statistics, its step records, its transitions, the reduced gradient) can be worked out on paper. The others drive a
real `HybridReplica` on a thread through the paths the bitwise tests do not take: a placeholder detached before it
is active, a failed join started again, a hybrid that leaves by itself, a malformed STEP."""

from __future__ import annotations

import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.core import CoreExchange, ExchangeStats  # noqa: E402
from libra.elastic.grads import Mode, to_device_of  # noqa: E402
from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.states import JoinEvent, JoinState  # noqa: E402
from libra.elastic.wire import Kind, LinkClosed, LinkError, Message, TcpLink  # noqa: E402
from tests.elastic.test_elastic_overlap import _Hybrid, _join_once, _link, _small, _until_join_message  # noqa: E402
from tests.limits import scaled  # noqa: E402


def _flat(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _exchange(group, model, opt, **kw) -> CoreExchange:
    """Core replica 0 of 1 on `group`."""
    return CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, **kw)


def _grad(step: int, values) -> Message:
    """A hybrid's GRAD for ``step`` computed on the state of that version."""
    blob = _flat(values).view(torch.uint8)
    return Message(kind=Kind.GRAD, step=step, version=step, info={"dtype": "torch.float32"}, blobs=(blob,))


def _step_msg(step: int, replay: list[int]) -> Message:
    info = {"mode": "active", "replica_index": 1, "num_replicas": 2, "replay": replay}
    return Message(kind=Kind.STEP, step=step, version=step, info=info)


def _log(states) -> list[tuple]:
    return [(t.worker, t.step, t.src.value, t.dst.value, t.why) for t in states.log]


def _core(group, **kw) -> CoreExchange:
    """An exchange over a 1x2 weight whose optimizer never moves it: only the exchange is under test."""
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return _exchange(group, model, opt, **kw)


def _played(core: CoreExchange, name: str) -> TcpLink:
    """A hand-played hybrid `name` whose JOIN waits for the core's next boundary."""
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    h = _link(hybrid_end)
    h.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": name}), timeout=scaled(30))
    return h


def _core_step(core: CoreExchange, t: int, grad) -> list[float]:
    core.begin_step(t)
    (g,) = core.reduce(t, [_flat(grad).reshape(1, 2)])
    return g.reshape(-1).tolist()


def _active_played(core: CoreExchange, name: str = "h") -> TcpLink:
    """A hand-played hybrid `name` that joined at step 0 (the core reduced [3, 5] alone), restored the snapshot and
    is active at step 1, whose boundary the core has passed: its contribution to step 1 is the next thing it sends."""
    h = _played(core, name)
    assert _core_step(core, 0, [3.0, 5.0]) == [3.0, 5.0]
    assert h.recv(timeout=scaled(5)).kind == Kind.SNAPSHOT
    h.send(Message(kind=Kind.ATTACH, step=0, version=0), timeout=scaled(5))
    core.begin_step(1)
    assert h.recv(timeout=scaled(5)).info["mode"] == "active"
    return h


def test_a_hybrid_played_message_by_message(group):
    core = _core(group, timeout_s=0.3)
    h = _played(core, "h")
    wait = scaled(30)
    # step 0: the JOIN is read, the snapshot of version 0 packed and sent; the core reduces alone
    assert _core_step(core, 0, [3.0, 5.0]) == [3.0, 5.0]
    snap = h.recv(timeout=wait)
    assert (snap.kind, snap.version) == (Kind.SNAPSHOT, 0)
    h.send(Message(kind=Kind.ATTACH, step=0, version=0), timeout=wait)
    # step 1: the ATTACH is read; the hybrid holds no reduced gradient it has not had but step 0's, which the STEP
    # carries: it is active at once, replica 1 of 2
    h.send(_grad(1, [1.0, 3.0]), timeout=wait)
    assert _core_step(core, 1, [3.0, 5.0]) == [2.0, 4.0]  # (3 + 1) / 2, (5 + 3) / 2
    step1 = h.recv(timeout=wait)
    assert (step1.kind, step1.step, step1.info) == (
        Kind.STEP,
        1,
        {"mode": "active", "replica_index": 1, "num_replicas": 2, "replay": [0]},
    )
    assert step1.blobs[0].view(torch.float32).tolist() == [3.0, 5.0]  # step 0's reduced gradient, to replay
    reduced1 = h.recv(timeout=wait)
    assert (reduced1.kind, reduced1.step, reduced1.blobs[0].view(torch.float32).tolist()) == (
        Kind.REDUCED,
        1,
        [2.0, 4.0],
    )
    # step 2: a stale GRAD (for step 1) is skipped, then nothing comes within the timeout: a miss, not a failure
    h.send(_grad(1, [9.0, 9.0]), timeout=wait)
    assert _core_step(core, 2, [3.0, 5.0]) == [3.0, 5.0]
    # steps 3 and 4: placeholders (nothing counted), then a LEAVE during step 5
    for t in (3, 4):
        h.send(Message(kind=Kind.PLACEHOLDER, step=t, version=t), timeout=wait)
        assert _core_step(core, t, [1.0, 1.0]) == [1.0, 1.0]
    h.send(Message(kind=Kind.LEAVE, step=5, version=5, info={"why": "done"}), timeout=wait)
    assert _core_step(core, 5, [1.0, 1.0]) == [1.0, 1.0]
    assert core.workers() == ()
    assert core.stats == ExchangeStats(accepted=1, placeholders=2, skipped=1, missed=1, failures=0, leaves=1)
    assert [(r.step, r.num_replicas, r.num_contributed, r.hybrid_contributors) for r in core.records] == [
        (0, 1, 1, ()),
        (1, 2, 2, ("h",)),
        (2, 2, 1, ()),
        (3, 2, 1, ()),
        (4, 2, 1, ()),
        (5, 2, 1, ()),
    ]
    assert _log(core.states) == [
        ("h", 0, "rollout", "requested", "JOIN received"),
        ("h", 0, "requested", "fetching_state", "snapshot v0 (8 bytes) sending"),  # one 1x2 float32 weight
        ("h", 1, "fetching_state", "placeholder", "restored snapshot v0"),
        ("h", 1, "placeholder", "active", "holds every reduced gradient before this step"),
        ("h", 5, "active", "rollout", "hybrid left: done"),
    ]
    h.close()
    core.close()


def test_a_join_without_a_name_or_not_a_join_is_refused(group):
    model, opt = _small()
    core = _exchange(group, model, opt, timeout_s=1)
    ends = []
    for msg in (
        Message(kind=Kind.JOIN, step=-1, version=-1, info={}),
        Message(kind=Kind.ATTACH, step=-1, version=-1, info={"worker": "x"}),
    ):
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        ends.append(_link(hybrid_end))
        ends[-1].send(msg, timeout=scaled(5))
    core.begin_step(0)
    assert core.workers() == () and list(core.states.log) == []
    for end in ends:
        with pytest.raises(LinkClosed):
            end.recv(timeout=scaled(5))
        end.close()
    core.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_max_missed_must_be_a_whole_number_of_at_least_one(group, bad):
    model, opt = _small()
    with pytest.raises(ValueError, match=rf"^max_missed must be a whole number >= 1, got {bad!r}$"):
        _exchange(group, model, opt, timeout_s=1, max_missed=bad)
    with pytest.raises(ValueError, match=rf"^max_missed must be a whole number >= 1, got {bad!r}$"):
        HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=1, max_missed=bad)


def test_a_placeholder_detached_before_it_is_active_cancels_and_says_why(group):
    model, opt = _small()
    core = _exchange(group, model, opt, timeout_s=scaled(30), min_placeholder_steps=2)
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen, _ = _join_once(core, model, opt, hybrid, 3)  # removed at step 3, before it could be active (step 3)
    assert [(s, m) for s, m, _ in seen] == [(1, Mode.PLACEHOLDER), (2, Mode.PLACEHOLDER)]
    assert core.stats.placeholders == 2 and core.stats.leaves == 1
    assert _log(hybrid.states) == [
        ("h", 0, "rollout", "requested", "joining training"),
        ("h", 0, "requested", "fetching_state", "JOIN sent"),
        ("h", 0, "fetching_state", "placeholder", "restored snapshot v0"),
        (
            "h",
            3,
            "placeholder",
            "rollout",
            "core detached us: test over",
        ),  # at version 3: two steps replayed and one taken
    ]
    assert _log(core.states)[-1] == ("h", 3, "placeholder", "rollout", "test over")
    core.close()


def test_a_failed_join_is_started_again_and_a_hybrid_that_leaves_is_let_go(group):
    model, opt = _small()
    core = _exchange(group, model, opt, timeout_s=scaled(30))
    h_model, h_opt = _small()
    points: list[str] = []  # the fault hook's named points, in the order the hybrid passes them
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30), fault=points.append)
    dead, other = socket.socketpair()
    other.close()  # the core's end is gone: the JOIN cannot be sent
    with pytest.raises(LinkError):
        hybrid.join(_link(dead), snapshot_timeout_s=scaled(5))
    assert hybrid.state == JoinState.FAILED
    (fail,) = [t for t in hybrid.states.log if t.dst == JoinState.FAILED]
    assert fail.why.startswith("join: ")
    # joined again: RECOVER first; then it leaves by itself after its first active step
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    done = threading.Event()

    def run() -> None:
        hybrid.join(_link(hybrid_end), snapshot_timeout_s=scaled(60))
        a = hybrid.begin_step()
        assert a is not None and a.mode == Mode.ACTIVE
        hybrid.reduce(a.step, [torch.zeros_like(p) for p in h_model.parameters()])
        hybrid.leave("enough")
        done.set()

    thread = _Hybrid(run)
    thread.start()
    _until_join_message(core, thread)
    for t in range(3):
        if t == 1:
            _until_join_message(core, thread)  # the ATTACH
        a = core.begin_step(t)
        core.reduce(t, [torch.zeros_like(p) for p in model.parameters()])
        opt.step()
        if t == 1:
            assert done.wait(scaled(60)) and a.num_replicas == 2
    thread.join(scaled(60))
    assert thread.error is None
    assert [(t.src.value, t.dst.value, t.why) for t in hybrid.states.log][2:] == [  # after REQUEST and FAIL
        ("failed", "rollout", "restarting a join"),
        ("rollout", "requested", "joining training"),
        ("requested", "fetching_state", "JOIN sent"),
        ("fetching_state", "placeholder", "restored snapshot v0"),
        ("placeholder", "active", "active from step 1"),
        ("active", "rollout", "enough"),
    ]
    assert core.workers() == () and _log(core.states)[-1] == ("h", 2, "active", "rollout", "hybrid left: enough")
    assert points == ["fetching", "restoring", "catchup", "active", "leave"]
    hybrid.leave()  # a second leave: nothing to leave, no fault point
    assert len(points) == 5
    core.close()


def test_a_step_whose_replay_has_no_gradient_fails_the_hybrid(group):
    h_model, h_opt = _small()
    for step, replay, error, words in (
        (0, [0], LinkError, r"^malformed STEP 0: .* with 0 gradient\(s\)$"),  # a replay of step 0 without its gradient
        (3, [], LinkError, r"^STEP 3 but state is at version 0 after replay$"),  # step 3 for a state at version 0
    ):
        hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(5))
        c = _played_core(hybrid)
        c.send(_step_msg(step, replay), timeout=scaled(5))
        with pytest.raises(error, match=words):
            hybrid.begin_step()
        assert hybrid.version == 0 and hybrid.state == JoinState.FAILED
        c.close()


def test_a_replay_copy_reuses_a_pruned_one_only_of_the_same_shape_and_dtype(group):
    model, opt = _small()
    core = _exchange(group, model, opt, timeout_s=1)
    flat = torch.arange(4, dtype=torch.float32)
    core._spare_replay = [torch.zeros(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float32)]
    copy = core._replay_copy(flat)  # neither fits: a new one
    assert copy.dtype == torch.float32 and copy.tolist() == [0.0, 1.0, 2.0, 3.0]
    spare = torch.zeros(4, dtype=torch.float32)
    core._spare_replay = [spare]
    assert core._replay_copy(flat) is spare and spare.tolist() == [0.0, 1.0, 2.0, 3.0]
    core.close()


def test_to_device_of_copies_into_memory_that_fits_on_the_other_device():
    """The dispatch of a received gradient onto a parameter's device, seen on the meta device (no GPU here)."""
    like = torch.empty(3, device="meta")
    t = torch.arange(3, dtype=torch.float32)
    assert to_device_of(t, torch.zeros(1)) is t  # on its device already
    made = to_device_of(t, like)
    assert made.device.type == "meta" and made.shape == (3,) and made.dtype == torch.float32
    assert to_device_of(t, like, out=made) is made  # fits: reused
    assert to_device_of(t, like, out=torch.empty(4, device="meta")) is not made


def test_two_hybrids_played_by_hand_each_judged_on_its_own(group):
    """A rejected contribution of the first hybrid (by name) does not cost the second its turn, and the time the
    core waits is the sum over both."""
    core = _core(group, timeout_s=0.3)
    h, k = _played(core, "h"), _played(core, "k")
    wait = scaled(30)
    assert _core_step(core, 0, [2.0, 2.0]) == [2.0, 2.0]  # one snapshot for both joiners, sent to each
    for x in (h, k):
        assert x.recv(timeout=wait).kind == Kind.SNAPSHOT
        x.send(Message(kind=Kind.ATTACH, step=0, version=0), timeout=wait)
    stale = Message(
        kind=Kind.GRAD, step=1, version=0, info={"dtype": "torch.float32"}, blobs=_grad(1, [7.0, 7.0]).blobs
    )
    h.send(stale, timeout=wait)  # step 1's gradient computed on version 0: rejected (skipped), not a miss
    k.send(_grad(1, [4.0, 8.0]), timeout=wait)
    assert _core_step(core, 1, [2.0, 2.0]) == [3.0, 5.0]  # (2 + 4) / 2, (2 + 8) / 2: k counted, h not
    for x, index in ((h, 1), (k, 2)):
        step1 = x.recv(timeout=wait)
        assert (step1.info["replica_index"], step1.info["num_replicas"]) == (index, 3)
        assert x.recv(timeout=wait).kind == Kind.REDUCED
    assert _core_step(core, 2, [2.0, 2.0]) == [2.0, 2.0]  # both miss
    assert core.records[-1].wait_s >= 2 * 0.3
    assert core.stats == ExchangeStats(accepted=1, placeholders=0, skipped=1, missed=2, failures=0, leaves=0)
    assert [(r.num_replicas, r.num_contributed, r.hybrid_contributors) for r in core.records] == [
        (1, 1, ()),
        (3, 2, ("k",)),
        (3, 1, ()),
    ]
    core.close()
    assert _log(core.states)[-2:] == [
        ("h", 2, "active", "rollout", "exchange closed"),
        ("k", 2, "active", "rollout", "exchange closed"),
    ]
    assert core.stats.leaves == 2


def _refuse(msg: Message, *, timeout: float):
    raise LinkClosed("refused")


def test_joins_that_fail_each_say_why(group):
    """A joiner gone before its snapshot is sent, one that never attaches, one that breaks the protocol in a
    step, one gone without a LEAVE: each is failed, with its reason, and only it."""
    core = _core(group, timeout_s=0.3, max_catchup_steps=1)
    wait = scaled(30)
    core_end, gone = socket.socketpair()
    refusing = _link(core_end)
    refusing.send_async = _refuse  # type: ignore[method-assign]  # the snapshot's send fails at once
    core.admit(refusing)
    gone = _link(gone)
    gone.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": "gone"}), timeout=wait)
    slow = _played(core, "slow")
    assert _core_step(core, 0, [1.0, 1.0]) == [1.0, 1.0]
    assert slow.recv(timeout=wait).kind == Kind.SNAPSHOT  # and never an ATTACH
    rude, quiet = _played(core, "rude"), _played(core, "quiet")
    _core_step(core, 1, [1.0, 1.0])  # their JOINs read: snapshot v1
    for x in (rude, quiet):
        assert x.recv(timeout=wait).kind == Kind.SNAPSHOT
        x.send(Message(kind=Kind.ATTACH, step=1, version=1), timeout=wait)
    _core_step(core, 2, [1.0, 1.0])  # both attach and are active at step 2; `slow` has fetched for 2 > 1 steps
    assert core.workers(JoinState.ACTIVE) == ("quiet", "rude")
    rude.send(Message(kind=Kind.ATTACH, step=3, version=3), timeout=wait)  # not a contribution
    quiet.close()  # gone without a LEAVE
    _core_step(core, 3, [1.0, 1.0])
    fails = {t.worker: (t.step, t.why) for t in core.states.log if t.dst == JoinState.FAILED}
    # at the boundary that read its JOIN if the pack was done by then, else at the next one
    assert fails["gone"][0] in (0, 1) and fails["gone"][1] == "snapshot send failed: refused"
    assert fails["slow"] == (2, "still fetching after 1 steps")  # 2 - 0 > 1
    assert fails["rude"] == (3, "protocol: got ATTACH for step 3 during step 3")
    assert fails["quiet"][0] == 3 and fails["quiet"][1].startswith("send STEP: ")
    assert core.stats.failures == 4 and core.workers() == ()
    for x in (gone, slow, rude):
        x.close()
    core.close()


def test_a_core_that_does_not_reuse_its_snapshot_buffers_keeps_none_and_cannot_prepare(group):
    core = _core(group, timeout_s=0.3, reuse_snapshot_buffers=False)
    with pytest.raises(ValueError) as e:
        core.prepare()
    assert str(e.value) == "prepare() keeps buckets for the first snapshot: it needs reuse_snapshot_buffers=True"
    h = _played(core, "h")
    _core_step(core, 0, [1.0, 1.0])
    assert h.recv(timeout=scaled(30)).kind == Kind.SNAPSHOT
    h.send(Message(kind=Kind.ATTACH, step=0, version=0), timeout=scaled(30))
    _core_step(core, 1, [1.0, 1.0])
    assert core.workers(JoinState.ACTIVE) == ("h",) and core._spare_buckets is None  # delivered, not kept
    h.close()
    core.close()


def _played_core(hybrid: HybridReplica) -> TcpLink:
    """The core's end of a link to `hybrid`, played by hand, the hybrid as after a join that restored version 0."""
    core_end, hybrid_end = socket.socketpair()
    hybrid._link, hybrid.version = _link(hybrid_end), 0
    hybrid.states.apply("h", JoinEvent.REQUEST, step=0, why="")
    hybrid.states.apply("h", JoinEvent.START_FETCH, step=0, why="")
    hybrid.states.apply("h", JoinEvent.RESTORED, step=0, why="")
    return _link(core_end)


def test_the_hybrid_names_its_fault_points_and_what_the_core_told_it(group):
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    points: list[str] = []
    hybrid = HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=scaled(5), fault=points.append)
    c = _played_core(hybrid)
    with pytest.raises(RuntimeError, match=r"^reduce\(5\) but the current step is -1$"):
        hybrid.reduce(5, [torch.zeros(1, 2)])
    c.send(_step_msg(0, []), timeout=scaled(5))
    assert hybrid.begin_step().mode == Mode.ACTIVE
    c.send(Message(kind=Kind.LEAVE, step=0, version=0, info={"why": "shrinking"}), timeout=scaled(5))
    with pytest.raises(LinkError, match="detached by the core during the step"):
        hybrid.reduce(0, [torch.ones(1, 2)])
    assert points == ["active"]
    got = c.recv(timeout=scaled(5))
    assert (got.kind, got.step, got.version, got.blobs[0].view(torch.float32).tolist()) == (Kind.GRAD, 0, 0, [1.0, 1.0])
    assert [(t.event.value, t.why) for t in hybrid.states.log][-2:] == [
        ("caught_up", "active from step 0"),
        ("leave", "core detached us: shrinking"),
    ]
    # a placeholder step, then a leave of its own with the default reason
    points.clear()
    hybrid = HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=scaled(5), fault=points.append)
    c = _played_core(hybrid)
    info = {**_step_msg(0, []).info, "mode": "placeholder"}
    c.send(Message(kind=Kind.STEP, step=0, version=0, info=info), timeout=scaled(5))
    assert hybrid.begin_step().mode == Mode.PLACEHOLDER
    reduced = Message(kind=Kind.REDUCED, step=0, version=0, blobs=(_flat([0.5, 0.5]).view(torch.uint8),))
    c.send(reduced, timeout=scaled(5))
    (g,) = hybrid.reduce(0, [torch.zeros(1, 2)])
    assert g.reshape(-1).tolist() == [0.5, 0.5] and hybrid.version == 1
    placeholder = c.recv(timeout=scaled(5))
    assert (placeholder.kind, placeholder.step, placeholder.version) == (Kind.PLACEHOLDER, 0, 0)
    hybrid.leave()
    left = c.recv(timeout=scaled(5))
    assert (left.kind, left.step, left.version, left.info) == (Kind.LEAVE, 0, 1, {"why": "released to rollout"})
    assert points == ["placeholder", "leave"]
    assert [(t.event.value, t.why) for t in hybrid.states.log][-1] == ("cancel", "released to rollout")


def test_gradients_of_another_size_than_the_models_are_refused_and_the_step_is_not_used_up(group):
    """Three values for a 1x2 weight (no hybrid attached, so no message would have told): one line, and the same
    step then reduces the right gradients."""
    core = _core(group, timeout_s=scaled(30))
    core.begin_step(0)
    with pytest.raises(ValueError, match=r"reduce\(0\): 1 gradients of 3 values, but the model's trainable"):
        core.reduce(0, [torch.zeros(3)])
    assert [float(x) for x in core.reduce(0, [torch.tensor([[1.0, 2.0]])])[0].flatten()] == [1.0, 2.0]
    core.close()
