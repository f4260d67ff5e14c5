"""What a trainer adapter's mistakes and a peer's malformed frames do: each is one clear error that names the bad
value, raised before anything is used up or written, and a malformed frame fails that peer's link, never the core's
step (an audit of the public API, docs/elastic.md "API for trainer adapters")."""

from __future__ import annotations

import json
import re
import socket

import pytest

torch = pytest.importorskip("torch")

from libra.elastic import ElasticController, Placement, Pool, Role, WorkerPlacement  # noqa: E402
from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.grads import Mode  # noqa: E402
from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.snapshot import SnapshotError, capture, restore  # noqa: E402
from libra.elastic.states import JoinState  # noqa: E402
from libra.elastic.wire import Kind, LinkCorrupt, LinkError, Message, ReusedBlobs, TcpLink, _encode_head  # noqa: E402
from tests.elastic.test_elastic_overlap import _link  # noqa: E402
from tests.elastic.test_exchange_worked import _active_played, _core, _core_step, _played, _played_core, _step_msg  # noqa: E402
from tests.limits import scaled  # noqa: E402

#: Frames whose meta is malformed (under a good checksum: a sender's bug, not the wire's), and what the receiver
#: must say about each
MALFORMED_META = [
    (b"{not json", "meta is not JSON"),
    (b"\xff\xfe", "meta is not JSON"),
    (b"[1, 2]", "meta needs an 'info' object and a 'blobs' list"),
    (json.dumps({"info": [1], "blobs": []}).encode(), "meta needs an 'info' object"),
    (json.dumps({"info": {"worker": "x"}}).encode(), "meta needs an 'info' object and a 'blobs' list"),
    (json.dumps({"info": {}, "blobs": 5}).encode(), "meta needs an 'info' object and a 'blobs' list"),
    (json.dumps({"info": {}, "blobs": [[-5, 0]]}).encode(), r"blob 0 is \[-5, 0\], not \[byte count >= 0"),
    (json.dumps({"info": {}, "blobs": [["8", 0]]}).encode(), r"blob 0 is \['8', 0\]"),
    (json.dumps({"info": {}, "blobs": [[8, 2**64]]}).encode(), r"blob 0 is \[8, 18446744073709551616\]"),
    (json.dumps({"info": {}, "blobs": [[8]]}).encode(), r"blob 0 is \[8\]"),
    (json.dumps({"info": {}, "blobs": [[2**62, 0]]}).encode(), rf"blob 0 of {2**62} bytes cannot be allocated"),
]


def _raw(sock: socket.socket, kind: Kind, step: int, meta: bytes) -> None:
    sock.sendall(_encode_head(int(kind), step, step, meta) + meta)


@pytest.mark.parametrize(("meta", "words"), MALFORMED_META)
@pytest.mark.parametrize("reusing", [False, True])
def test_a_malformed_meta_is_link_corrupt_naming_what_is_wrong(pair, meta, words, reusing):
    a, b = pair
    _raw(a._sock, Kind.GRAD, 3, meta)
    with pytest.raises(LinkCorrupt, match=f"^bad frame: {words}"):
        b.recv(timeout=scaled(5), into=ReusedBlobs() if reusing else None)


@pytest.mark.parametrize(("meta", "words"), MALFORMED_META)
def test_a_malformed_join_or_contribution_fails_that_hybrid_and_the_core_step_completes(group, meta, words):
    core = _core(group, timeout_s=scaled(5))
    # a connection whose first frame (its JOIN) is malformed: dropped at the boundary, nobody joins
    core_end, stranger = socket.socketpair()
    core.admit(_link(core_end))
    _raw(stranger, Kind.JOIN, -1, meta)
    # an attached, active hybrid whose contribution to step 1 is malformed
    h = _active_played(core)
    _raw(h._sock, Kind.GRAD, 1, meta)
    (g,) = core.reduce(1, [torch.tensor([[3.0, 5.0]])])
    assert g.reshape(-1).tolist() == [3.0, 5.0]  # the core's own gradient alone
    assert core.workers() == () and core.stats.failures == 1
    assert re.match(f"^no contribution for step 1: bad frame: {words}", core.states.log[-1].why)
    # and the next step runs as ever
    assert _core_step(core, 2, [1.0, 1.0]) == [1.0, 1.0]
    stranger.close()
    h.close()
    core.close()


def _small_state():
    model = torch.nn.Linear(2, 1, bias=False)
    return model, torch.optim.SGD(model.parameters(), lr=0.0)


class _GroupOfTwo:
    """Rank 1 of a two-rank group (a second process cannot run in this test): just what the constructor asks."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"core_rank": 1}, r"core_rank must be in \[0, num_core_replicas=1\), got 1"),
        ({"core_rank": -1}, "core_rank must be a whole number >= 0, got -1"),
        ({"num_core_replicas": 0}, "num_core_replicas must be a whole number >= 1, got 0"),
        ({"num_core_replicas": 2}, r"num_core_replicas=2, but core_group holds 1 rank\(s\)"),  # half the batch lost
        (
            {"core_group": _GroupOfTwo(), "num_core_replicas": 2},
            "core_rank=0, but this process is rank 1 of core_group",
        ),
        ({"timeout_s": 0}, "timeout_s must be a finite number of seconds > 0, got 0"),
        ({"timeout_s": "5"}, "timeout_s must be a finite number of seconds > 0, got '5'"),
        ({"snapshot_timeout_s": float("inf")}, "snapshot_timeout_s must be a finite number of seconds > 0, got inf"),
        ({"max_catchup_steps": -1}, "max_catchup_steps must be a whole number >= 0, got -1"),
        ({"min_placeholder_steps": 0.5}, "min_placeholder_steps must be a whole number >= 0, got 0.5"),
        ({"history": 0}, "history must be a whole number >= 1, got 0"),
        ({"backend": "c++"}, r"backend must be one of \['auto', 'native', 'python'\], got 'c\+\+'"),
    ],
)
def test_a_core_exchange_refuses_bad_arguments_naming_them(group, kw, words):
    model, opt = _small_state()
    args = {"core_group": group, "core_rank": 0, "num_core_replicas": 1, "timeout_s": 1.0, **kw}
    with pytest.raises(ValueError, match=f"^{words}$"):
        CoreExchange(model=model, optimizer=opt, **args)


@pytest.mark.parametrize("step", [1.5, "2", -1, True])
def test_a_step_that_is_not_a_whole_number_is_refused_before_anything_happens(group, step):
    """A float step went on the wire only once a hybrid was attached (a struct error in the middle of the step)."""
    model, opt = _small_state()
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=1)
    with pytest.raises(ValueError, match=f"^step must be a whole number >= 0, got {step!r}$"):
        core.begin_step(step)
    core.begin_step(0)  # nothing was begun: the first step runs as ever
    assert [g.tolist() for g in core.reduce(0, [torch.ones(1, 2)])] == [[[1.0, 1.0]]]
    assert [r.step for r in core.records] == [0]
    core.close()


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"worker": ""}, "worker must be a non-empty name (the core refuses a JOIN without one), got ''"),
        ({"worker": 3}, "worker must be a non-empty name (the core refuses a JOIN without one), got 3"),
        ({"timeout_s": None}, "timeout_s must be a finite number of seconds > 0, got None"),
        ({"timeout_s": -5.0}, "timeout_s must be a finite number of seconds > 0, got -5.0"),
        ({"backend": "fast"}, "backend must be one of ['auto', 'native', 'python'], got 'fast'"),
    ],
)
def test_a_hybrid_replica_refuses_bad_arguments_naming_them(kw, words):
    model, opt = _small_state()
    with pytest.raises(ValueError) as e:
        HybridReplica(**{"worker": "h", "model": model, "optimizer": opt, "timeout_s": 1.0, **kw})
    assert str(e.value) == words


def _reduced(step: int, values) -> Message:
    blob = torch.tensor(values, dtype=torch.float32).view(torch.uint8)
    return Message(kind=Kind.REDUCED, step=step, version=step, blobs=(blob,))


def _active_hybrid(**kw) -> tuple[HybridReplica, TcpLink]:
    """A hybrid over a 1x2 weight, active at step 0 of a core played by hand (returned: the core's end)."""
    model, opt = _small_state()
    hybrid = HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=scaled(5), **kw)
    c = _played_core(hybrid)
    c.send(_step_msg(0, []), timeout=scaled(5))
    assert hybrid.begin_step().mode == Mode.ACTIVE
    return hybrid, c


def test_joining_again_while_in_training_is_refused_and_the_stay_goes_on(group):
    """`join` replaced the link of the stay in progress before it found the join illegal: the hybrid then talked to
    the new connection and waited out its timeouts on it."""
    hybrid, c = _active_hybrid(max_missed=1)
    other_core, other_hybrid = socket.socketpair()
    with pytest.raises(RuntimeError, match=r"^hybrid 'h' is in training already \(state active\): leave first$"):
        hybrid.join(_link(other_hybrid))
    c.send(_reduced(0, [2.0, 4.0]), timeout=scaled(5))
    (g,) = hybrid.reduce(0, [torch.ones(1, 2)])
    assert g.reshape(-1).tolist() == [2.0, 4.0] and hybrid.state == JoinState.ACTIVE
    assert c.recv(timeout=scaled(5)).kind == Kind.GRAD
    other_core.close()
    other_hybrid.close()
    c.close()


@pytest.mark.parametrize(
    ("grads", "words"),
    [
        ([torch.zeros(3)], r"^reduce\(0\): 1 gradients of 3 values, but the model's trainable parameters hold 2 "),
        ([torch.zeros(1, 2, dtype=torch.float64)], r"^reduce\(0\): gradients of dtype \['torch.float64'\], but the"),
    ],
)
def test_a_hybrids_gradients_of_another_size_or_dtype_are_refused_before_the_step_is_used_up(grads, words):
    """They went to the core, which skips them every step (a replica that never counts, silently) or, for a size,
    failed the hybrid once the reduced gradient came back."""
    hybrid, c = _active_hybrid()
    with pytest.raises(ValueError, match=words):
        hybrid.reduce(0, grads)
    assert hybrid.state == JoinState.ACTIVE and not c.poll()  # nothing sent: the step is not used up
    c.send(_reduced(0, [2.0, 4.0]), timeout=scaled(5))
    (g,) = hybrid.reduce(0, [torch.ones(1, 2)])
    assert g.reshape(-1).tolist() == [2.0, 4.0]
    c.close()


@pytest.mark.parametrize(
    ("msg", "words"),
    [
        (Message(kind=Kind.STEP, step=0, version=0, info={"mode": "active"}), "malformed STEP 0: KeyError"),
        (
            Message(kind=Kind.STEP, step=0, version=0, info={**_step_msg(0, []).info, "mode": "lazy"}),
            "malformed STEP 0: ValueError",
        ),
        (
            Message(kind=Kind.STEP, step=0, version=0, info={**_step_msg(0, []).info, "num_replicas": "2"}),
            "malformed STEP 0: {",
        ),
        (
            Message(kind=Kind.STEP, step=0, version=0, info={**_step_msg(0, []).info, "replay": None}),
            "malformed STEP 0: {",
        ),
    ],
)
def test_a_malformed_step_is_a_link_error_and_fails_the_hybrid(msg, words):
    model, opt = _small_state()
    hybrid = HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=scaled(5))
    c = _played_core(hybrid)
    c.send(msg, timeout=scaled(5))
    with pytest.raises(LinkError, match=f"^{words}"):
        hybrid.begin_step()
    assert hybrid.state == JoinState.FAILED
    c.close()


@pytest.mark.parametrize("blobs", [(), (torch.zeros(12, dtype=torch.uint8),)])
def test_a_reduced_gradient_of_the_wrong_size_is_a_link_error(blobs):
    hybrid, c = _active_hybrid()
    c.send(Message(kind=Kind.REDUCED, step=0, version=0, blobs=blobs), timeout=scaled(5))
    got = "none" if not blobs else "12 bytes"
    with pytest.raises(LinkError, match=rf"^REDUCED 0: gradient 0 is {got}, not 2 torch.float32 values$"):
        hybrid.reduce(0, [torch.ones(1, 2)])
    assert hybrid.state == JoinState.FAILED
    c.close()


def _trained(make_opt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 4))
    opt = make_opt(list(model.parameters()))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("share_buckets", [False, True])
@pytest.mark.parametrize(
    ("core_opt", "words"),
    [
        (
            lambda ps: torch.optim.Adam([{"params": ps[:2]}, {"params": ps[2:]}], lr=1e-2),
            r"^optimizer: the snapshot's parameter groups hold \[2, 2\] parameters, the optimizer's \[4\]$",
        ),
        (
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
            "^optimizer: the snapshot's is SGD, the one restored into is Adam$",
        ),
    ],
)
def test_a_snapshot_whose_optimizer_does_not_fit_is_refused_before_the_model_is_written(core_opt, words, share_buckets):
    """The optimizer's state was loaded last, after the model was overwritten: torch refused it then (another number
    of parameter groups) or the next step failed (KeyError 'step' for SGD's state in Adam)."""
    model, opt = _trained(core_opt)
    other, other_opt = _trained(lambda ps: torch.optim.Adam(ps, lr=1e-2))
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(SnapshotError, match=words):
        restore(capture(model, opt, version=1), other, other_opt, share_buckets=share_buckets)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True))


def test_a_core_whose_state_cannot_be_packed_fails_the_joiner_naming_the_tensor_and_steps_on(group):
    """The snapshot's SnapshotError came out of `begin_step`: a hybrid's JOIN stopped the core's training."""
    model, opt = _small_state()
    model.register_buffer("phase", torch.zeros(2, dtype=torch.complex64))
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=1)
    h = _played(core, "h")
    assert _core_step(core, 0, [3.0, 5.0]) == [3.0, 5.0]
    assert core.workers() == () and core.stats.failures == 1
    assert core.states.log[-1].why.startswith("snapshot v0: model tensor 'phase' is torch.complex64, which is not")
    with pytest.raises(LinkError):  # the hybrid is told by its link's end
        h.recv(timeout=scaled(5))
    h.close()
    core.close()


@pytest.mark.parametrize("plan", [{"workers": []}, [], None])
def test_a_controller_takes_only_a_placement_as_a_plan(plan):
    core = WorkerPlacement(name="c0", role=Role.TRAIN_REPLICA, tp=1, gpu_ids=(0,), pool=Pool.CORE_TRAIN)
    words = rf"^a plan is a libra.spec.placement.Placement, got {type(plan).__name__}: "
    with pytest.raises(TypeError, match=words):
        ElasticController(placement=plan)
    controller = ElasticController(placement=Placement(workers=(core,)))
    with pytest.raises(TypeError, match=words):
        controller.apply_plan(plan, step=0, why="")


def test_a_gradient_that_is_not_a_tensor_is_named_on_either_end(group):
    """A placeholder step's `p.grad` left None went into `numel()` (AttributeError), on the hybrid after the step
    had begun."""
    words = r"^reduce\(0\): gradient 0 is None, not a tensor \(in a placeholder step too: bind zeros as p.grad\)$"
    hybrid, c = _active_hybrid()
    with pytest.raises(ValueError, match=words):
        hybrid.reduce(0, [None])
    assert hybrid.state == JoinState.ACTIVE and not c.poll()
    c.close()
    core = _core(group, timeout_s=1)
    core.begin_step(0)
    with pytest.raises(ValueError, match=words):
        core.reduce(0, [None])
    assert core.reduce(0, [torch.ones(1, 2)])[0].tolist() == [[1.0, 1.0]]
    core.close()


def test_a_connection_that_never_sends_its_join_is_closed_after_the_snapshot_timeout(group):
    """A hybrid sends JOIN as it connects; a connection silent past `snapshot_timeout_s` (a port scan, a peer hung
    before its first frame) was kept waiting for the whole run, holding its descriptor."""
    import time

    core = _core(group, timeout_s=scaled(5), snapshot_timeout_s=0.2)
    core_end, stranger = socket.socketpair()
    core.admit(_link(core_end))
    core.begin_step(0)
    assert core.joining == 1  # within its time: still waited for
    time.sleep(0.3)
    assert _core_step(core, 1, [1.0, 2.0]) == [1.0, 2.0]
    assert core.joining == 0
    stranger.settimeout(scaled(5))
    assert stranger.recv(1) == b""  # the core closed its end
    h = _played(core, "late")  # a real joiner after it still joins
    core.begin_step(2)
    assert core.workers() == ("late",)
    stranger.close()
    h.close()
    core.close()
