"""Side-channel framing over TCP: round trips, checksums, timeouts, closed and truncated peers."""

from __future__ import annotations

import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.grads import flatten, shard_bounds, unflatten_into  # noqa: E402
from libra.elastic.pack import checksum  # noqa: E402
from libra.elastic.wire import (  # noqa: E402
    _PREFIX,
    Kind,
    LinkClosed,
    LinkCorrupt,
    LinkTimeout,
    Message,
    SideChannelServer,
    TcpLink,
    _encode_head,
    as_bytes,
    free_port,
)
from tests.limits import scaled  # noqa: E402


def test_roundtrip_with_blobs(pair):
    a, b = pair
    g = torch.randn(1000)
    a.send(
        Message(
            kind=Kind.GRAD,
            step=4,
            version=4,
            info={"dtype": "torch.float32"},
            blobs=(as_bytes(g), torch.empty(0, dtype=torch.uint8)),
        ),
        timeout=scaled(5),
    )
    msg = b.recv(timeout=scaled(5))
    assert (msg.kind, msg.step, msg.version, msg.info) == (Kind.GRAD, 4, 4, {"dtype": "torch.float32"})
    assert torch.equal(msg.blobs[0].view(torch.float32), g) and msg.blobs[1].numel() == 0


def test_receive_times_out(pair):
    with pytest.raises(LinkTimeout):
        pair[1].recv(timeout=scaled(0.05))


def test_closed_peer_and_truncated_message(pair):
    a, b = pair
    a.send(Message(kind=Kind.PLACEHOLDER, step=1, version=1), timeout=scaled(5))
    raw = a._sock
    # a frame that announces a blob and then stops half way, like a hybrid killed mid-send
    frame = bytearray()
    meta = b'{"info":{},"blobs":[[100,0]]}'
    frame += _encode_head(int(Kind.GRAD), 2, 2, meta) + meta + b"x" * 40
    raw.sendall(frame)
    raw.shutdown(socket.SHUT_WR)
    assert b.recv(timeout=scaled(5)).kind == Kind.PLACEHOLDER
    with pytest.raises(LinkClosed):
        b.recv(timeout=scaled(5))


def test_corrupted_blob_is_rejected(pair):
    a, b = pair
    meta = b'{"info":{},"blobs":[[4,12345]]}'
    a._sock.sendall(_encode_head(int(Kind.GRAD), 2, 2, meta) + meta + b"abcd")
    with pytest.raises(LinkCorrupt, match="checksum"):
        b.recv(timeout=scaled(5))


def test_bad_magic_is_rejected(pair):
    a, b = pair
    a._sock.sendall(b"X" * _PREFIX.size)
    with pytest.raises(LinkCorrupt):
        b.recv(timeout=scaled(5))


def test_server_accepts_without_blocking():
    server = SideChannelServer(host="127.0.0.1", port=0)
    try:
        assert server.accept_ready() == []
        client = TcpLink.connect("127.0.0.1", server.port, timeout=scaled(5))
        for _ in range(200):
            links = server.accept_ready()
            if links:
                break
            threading.Event().wait(0.01)
        assert len(links) == 1
        client.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": "h"}), timeout=scaled(5))
        assert links[0].recv(timeout=scaled(5)).info == {"worker": "h"}
        client.close()
        links[0].close()
    finally:
        server.close()
    assert 0 < free_port() < 65536


def test_free_port_is_bindable_and_outside_the_kernels_ephemeral_range():
    """An ephemeral port can be handed to an outgoing connection between free_port and the caller's bind (the
    EADDRINUSE that failed a CI run); free_port's ports are outside that range, and free when returned."""
    from libra.elastic.wire import _ephemeral_range

    low, high = _ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high, (port, low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_shards_cover_the_global_batch_exactly():
    for batch in range(4, 40):
        for n in range(1, 5):
            bounds = [shard_bounds(batch, i, n) for i in range(n)]
            assert bounds[0][0] == 0 and bounds[-1][1] == batch
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    with pytest.raises(ValueError):
        shard_bounds(2, 3, 3)


def test_flatten_roundtrip_and_dtype_check():
    grads = [torch.randn(3, 2), torch.randn(5)]
    flat = flatten(grads)
    target = [torch.zeros(3, 2), torch.zeros(5)]
    unflatten_into(flat, target)
    assert all(torch.equal(a, b) for a, b in zip(grads, target))
    with pytest.raises(ValueError, match="mix dtypes"):
        flatten([torch.zeros(1), torch.zeros(1, dtype=torch.float64)])


def test_flatten_writes_into_a_fitting_out_and_only_into_one():
    grads = [torch.randn(3, 2), torch.randn(5)]
    expected = flatten(grads)
    out = torch.full((11,), 7.0)
    assert flatten(grads, out=out) is out and torch.equal(out, expected)
    misfits = {
        "size": torch.zeros(12),
        "dtype": torch.zeros(11, dtype=torch.float64),
        "shape": torch.zeros(11, 1),
        "strided": torch.zeros(22)[::2],
    }
    for why, bad in misfits.items():
        before = bad.clone()
        got = flatten(grads, out=bad)
        assert got is not bad and torch.equal(got, expected) and torch.equal(bad, before), why


def test_a_cpu_replicas_gradients_are_sent_and_added_where_they_are(group):
    """No copy on a CPU replica: the host copy of a flat gradient and the device copy of a received one are the
    tensors themselves, and the replica counts are reduced in host memory on a gloo group. (The copies on a GPU
    replica: tests/elastic/test_elastic_cuda.py.)"""
    from libra.elastic.grads import to_device_of, to_host
    from libra.elastic.groups import counts_device

    flat, received = torch.randn(11), torch.randn(11)
    assert to_host(flat) is flat and to_host(flat, out=torch.zeros(11)) is flat
    assert to_device_of(received, flat) is received and to_device_of(received, flat, out=torch.zeros(11)) is received
    assert counts_device(group) == torch.device("cpu") and counts_device(None) == torch.device("cpu")


def test_receive_into_caller_memory_and_report_the_verified_checksums(pair, monkeypatch):
    from libra.elastic import wire

    monkeypatch.setattr(wire, "RECV_WINDOW", 4096)  # several windows per blob
    a, b = pair
    blobs = (as_bytes(torch.randn(10_000)), as_bytes(torch.arange(7, dtype=torch.int8)))
    a.send(Message(kind=Kind.SNAPSHOT, step=1, version=1, blobs=blobs), timeout=5)
    pool = [torch.zeros(50_000, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8)]
    msg = b.recv(timeout=5, into=lambda i, n: pool[i])
    assert all(torch.equal(x, y) for x, y in zip(msg.blobs, blobs))
    assert msg.blobs[0].data_ptr() == pool[0].data_ptr()  # received in place, no copy
    assert msg.checksums == tuple(checksum(x) for x in blobs)
    with pytest.raises(ValueError, match="contiguous 1-D uint8"):
        a.send(Message(kind=Kind.GRAD, step=1, version=1, blobs=blobs[:1]), timeout=5)
        b.recv(timeout=5, into=lambda i, n: torch.zeros(10, dtype=torch.uint8))


def test_given_checksums_are_sent_as_is_and_a_wrong_one_is_caught(pair):
    a, b = pair
    blob = as_bytes(torch.randn(1000))
    a.send(Message(kind=Kind.GRAD, step=1, version=1, blobs=(blob,), checksums=(checksum(blob),)), timeout=5)
    assert b.recv(timeout=5).checksums == (checksum(blob),)
    a.send(Message(kind=Kind.GRAD, step=2, version=2, blobs=(blob,), checksums=(checksum(blob) ^ 4,)), timeout=5)
    with pytest.raises(LinkCorrupt, match="checksum"):
        b.recv(timeout=5)
