"""The snapshot's and the wire's details worked out by hand (scripts/mutation.sh elastic_bytes): frames refused
for each reason alone, the tensors a snapshot holds and in which order, a background capture reusing the buckets it
is given, two optimizer entries sharing one scalar, received blobs landing in reused memory, and the errors' words."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
import xxhash

torch = pytest.importorskip("torch")

from libra.elastic.pack import checksum, plan_layout, unpack  # noqa: E402
from libra.elastic.snapshot import (  # noqa: E402
    PendingCapture,
    SnapshotError,
    capture,
    restore,
    state_tensors,
)
from libra.elastic.wire import (  # noqa: E402
    _HEAD_SUMMED,
    _MAGIC,
    _MAX_META,
    _PREFIX,
    Kind,
    LinkClosed,
    LinkCorrupt,
    LinkTimeout,
    Message,
    ReusedBlobs,
    _check_blob,
    recv_reusing,
)
from tests.limits import scaled  # noqa: E402


def trained(seed: int = 0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    o = torch.optim.Adam(m.parameters(), lr=1e-2)
    o.zero_grad()
    m(torch.randn(5, 3)).square().mean().backward()
    o.step()
    return m, o


@pytest.mark.parametrize(
    ("magic", "kind", "meta_len", "words"),
    [
        (b"LBR3", 1, 2, "bad frame: magic b'LBR3', meta length 2"),  # a bad magic alone
        (
            _MAGIC,
            1,
            _MAX_META + 1,
            f"bad frame: meta length {_MAX_META + 1}, more than the {_MAX_META} a meta may have",
        ),  # a length alone
        (_MAGIC, 99, 2, "bad frame: unknown kind 99"),
        (
            b"LBR1",
            1,
            2,
            "bad frame: wire version 1 (magic b'LBR1') from the peer, this side speaks version 2 (magic b'LBR2'): "
            "run one Libra version on both ends",
        ),
    ],
)
def test_a_frame_is_refused_for_each_fault_alone(pair, magic, kind, meta_len, words):
    """Each fault under a good head checksum (a sender's bug, not the wire's): every check holds by itself."""
    a, b = pair
    summed = _PREFIX.pack(magic, kind, 0, 0, meta_len, xxhash.xxh3_64_intdigest(b"{}"), 0)[:_HEAD_SUMMED]
    a._sock.sendall(summed + struct.pack("<Q", xxhash.xxh3_64_intdigest(summed)) + b"{}")
    with pytest.raises(LinkCorrupt) as e:
        b.recv(timeout=scaled(5))
    assert str(e.value) == words


def test_a_blob_that_fails_its_checksum_names_both_values():
    blob = torch.arange(16, dtype=torch.uint8)
    good = checksum(blob)
    _check_blob(3, blob, good)  # no error
    with pytest.raises(LinkCorrupt) as e:
        _check_blob(3, blob, good ^ 1)
    assert str(e.value) == f"blob 3: checksum {good:#018x} != sent {good ^ 1:#018x}"


def test_a_snapshot_holds_the_models_tensors_then_the_optimizers_by_parameter_and_key():
    m, o = trained()
    got = state_tensors(m, o)
    sd, osd = m.state_dict(), o.state_dict()["state"]
    want = [*sd.values(), *(osd[pid][key] for pid in sorted(osd) for key in sorted(osd[pid]))]
    assert len(got) == 4 + 4 * 3  # weight and bias twice; Adam's exp_avg, exp_avg_sq and step for each
    assert [t.data_ptr() for t in got] == [t.data_ptr() for t in want]  # the tensors themselves, not copies
    assert [tuple(t.shape) for t in got[4:7]] == [(4, 3), (4, 3), ()]  # exp_avg, exp_avg_sq, step
    assert [t.data_ptr() for t in state_tensors(m, None)] == [t.data_ptr() for t in sd.values()]


def test_a_background_capture_writes_into_the_buckets_it_is_given():
    m, o = trained()
    first = capture(m, o, version=1, bucket_bytes=256)
    o.zero_grad()
    m(torch.randn(5, 3)).square().mean().backward()
    o.step()
    again = PendingCapture(m, o, version=2, bucket_bytes=256, out=first.buckets).wait(timeout=scaled(30))
    assert [b.data_ptr() for b in again.buckets] == [b.data_ptr() for b in first.buckets]
    assert again.checksums == capture(m, o, version=2, bucket_bytes=256).checksums != first.checksums
    other = PendingCapture(m, o, version=3, bucket_bytes=512, out=first.buckets).wait(timeout=scaled(30))
    assert other.buckets[0].data_ptr() != first.buckets[0].data_ptr()  # sizes differ: new buckets


def test_a_mismatched_tensor_names_both_shapes():
    m, o = trained()
    snap = capture(m, o, version=1)
    other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with pytest.raises(SnapshotError) as e:
        restore(snap, other, None)
    assert str(e.value) == (
        "model tensor '0.weight': snapshot has [[4, 3], 'torch.float32'], model has [[5, 3], 'torch.float32']"
    )


def test_two_optimizer_entries_sharing_one_scalar_are_restored_apart():
    """Restoring into an optimizer whose entries share a tensor (here a one-element one) must not write both
    entries into it: the second gets memory of its own."""
    torch.manual_seed(0)
    m = torch.nn.Linear(2, 1)
    src = torch.optim.SGD(m.parameters(), lr=0.1)
    for value, p in zip((1.0, 2.0), m.parameters(), strict=True):
        src.state[p] = {"k": torch.tensor([value])}
    snap = capture(m, src, version=1)
    dst = torch.optim.SGD(m.parameters(), lr=0.1)
    shared = torch.tensor([0.0])
    for p in m.parameters():
        dst.state[p] = {"k": shared}
    restore(snap, m, dst)
    assert [dst.state[p]["k"].item() for p in m.parameters()] == [1.0, 2.0]


def test_unpack_refuses_a_tensor_of_another_size_in_bytes():
    layout = plan_layout([16, 8], bucket_bytes=64)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in layout.bucket_sizes]
    with pytest.raises(ValueError) as e:
        unpack(buckets, [torch.zeros(4), torch.zeros(3)], layout)
    assert str(e.value) == "tensor 1: 12 bytes, contiguous=True; layout says 8"


def test_reused_blobs_give_each_index_its_memory_and_grow_it_only_when_outgrown():
    into = ReusedBlobs()
    a = into(0, 10)
    assert a.numel() == 10 and a.dtype == torch.uint8
    assert into(0, 6).data_ptr() == a.data_ptr()  # smaller: the same memory
    c = into(2, 4)
    assert [b.numel() for b in into.buffers] == [10, 0, 4] and c.numel() == 4
    assert into(0, 11).numel() == 11 and into.buffers[0].data_ptr() != a.data_ptr()


def test_recv_reusing_receives_into_the_given_memory_and_keeps_the_timeout(pair):
    a, b = pair
    into = ReusedBlobs()
    blob = torch.arange(32, dtype=torch.uint8)
    a.send(Message(kind=Kind.GRAD, step=1, version=1, blobs=(blob,)), timeout=scaled(5))
    got = recv_reusing(b, into, timeout=scaled(5))
    assert got.blobs[0].data_ptr() == into.buffers[0].data_ptr() and torch.equal(got.blobs[0], blob)
    closer = threading.Timer(scaled(5), a.close)  # a call that dropped the timeout ends here, not never
    closer.start()
    try:
        with pytest.raises(LinkTimeout):
            recv_reusing(b, into, timeout=0.2)
    finally:
        closer.cancel()


def test_recv_reusing_on_a_link_that_cannot_receive_into_memory():
    class Plain:  # a link without `receives_into` (torch.distributed's point-to-point receives into new memory)
        def __init__(self) -> None:
            self.calls: list[dict] = []

        def recv(self, **kw):
            self.calls.append(kw)
            if kw.get("timeout") is None:
                raise LinkClosed("no timeout given")
            return Message(kind=Kind.LEAVE, step=0, version=0)

    link = Plain()
    assert recv_reusing(link, ReusedBlobs(), timeout=1.5).kind == Kind.LEAVE  # type: ignore[arg-type]
    assert link.calls == [{"timeout": 1.5}]


def test_free_port_falls_back_to_a_port_the_kernel_gives_when_no_fixed_one_is_left(monkeypatch):
    from libra.elastic import wire

    low, _ = wire._ephemeral_range()
    monkeypatch.setattr(wire, "_FIXED_PORTS", (low, low + 1))  # the one candidate is ephemeral: none is left
    port = wire.free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
