"""A frame cut short by a peer that then closes the connection (docs/elastic.md "Failures"): the end of the stream
is there, so the receiver fails at once with one `LinkClosed` line that names the short frame (which part, how
many of its bytes came), never a wait for the rest; a close between two frames is a plain close. Before, every
such cut read "peer closed the side channel", whether a frame had begun or not."""

from __future__ import annotations

import logging
import socket
import time

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.wire import _PREFIX, Kind, LinkClosed, LinkError, Message, SideChannelServer, TcpLink  # noqa: E402
from tests.elastic.test_elastic_frame_head import _frame, _grad  # noqa: E402
from tests.elastic.test_exchange_worked import _active_played, _core, _core_step, _flat  # noqa: E402
from tests.limits import scaled  # noqa: E402


def _tcp_pair(server: SideChannelServer) -> tuple[socket.socket, TcpLink]:
    """A real TCP connection to ``server``: the peer's raw socket and the receiving link."""
    peer = socket.create_connection(("127.0.0.1", server.port), timeout=scaled(30))
    for _ in range(int(scaled(30) / 0.01)):
        if links := server.accept_ready():
            return peer, links[0]
        time.sleep(0.01)
    raise AssertionError(f"the server accepted no connection in {scaled(30):.0f} s")


def _cuts() -> list[tuple[int, str]]:
    """Where a GRAD frame is cut (bytes sent before the close) and the line the receiver must give."""
    raw, blobs_at = _frame(_grad(3, [1.0, 2.0, 3.0]))
    meta_len, blob_len = blobs_at - _PREFIX.size, len(raw) - blobs_at
    line = "short frame: the peer closed the side channel after {} of the {} bytes of its {}"
    return [
        (1, line.format(1, _PREFIX.size, "frame head")),
        (_PREFIX.size - 1, line.format(_PREFIX.size - 1, _PREFIX.size, "frame head")),
        (_PREFIX.size, line.format(0, meta_len, "meta")),
        (_PREFIX.size + 5, line.format(5, meta_len, "meta")),
        (blobs_at, line.format(0, blob_len, "blob 0")),
        (blobs_at + 7, line.format(7, blob_len, "blob 0")),
    ]


@pytest.mark.parametrize(("cut", "line"), _cuts())
def test_a_frame_cut_short_then_closed_fails_at_once_naming_the_short_frame(cut, line):
    """Over a real TCP connection; the receive timeout is long, and a receiver that waited for it would raise
    `LinkTimeout`, not the `LinkClosed` asked for."""
    raw, _ = _frame(_grad(3, [1.0, 2.0, 3.0]))
    server = SideChannelServer(host="127.0.0.1", port=0)
    peer, link = _tcp_pair(server)
    try:
        peer.sendall(raw[:cut])
        peer.close()
        with pytest.raises(LinkClosed) as e:
            link.recv(timeout=scaled(60))
        assert str(e.value) == line
    finally:
        link.close()
        server.close()


def test_garbage_shorter_than_a_head_then_closed_is_named_and_a_close_between_frames_is_plain():
    server = SideChannelServer(host="127.0.0.1", port=0)
    peer, link = _tcp_pair(server)
    whole, _ = _frame(_grad(1, [1.0, 2.0, 3.0]))
    peer.sendall(whole + b"not a frame")  # a whole frame, then 11 bytes of garbage
    peer.close()
    assert link.recv(timeout=scaled(60)).kind == Kind.GRAD
    with pytest.raises(LinkClosed, match="^short frame: the peer closed the side channel after 11 of the 48 bytes"):
        link.recv(timeout=scaled(60))
    link.close()
    peer, link = _tcp_pair(server)
    peer.close()
    with pytest.raises(LinkClosed, match="^peer closed the side channel$"):
        link.recv(timeout=scaled(60))
    link.close()
    server.close()


def test_a_joiner_that_sends_garbage_and_closes_is_dropped_at_once_with_the_line(group, caplog):
    """At the core's boundary: the step completes, and the warning names the short frame."""
    server = SideChannelServer(host="127.0.0.1", port=0)
    core = _core(group, timeout_s=scaled(60), server=server)
    peer = socket.create_connection(("127.0.0.1", server.port), timeout=scaled(30))
    peer.sendall(b"LBR2\x01garbage")
    peer.close()
    with caplog.at_level(logging.WARNING, logger="libra.elastic.core"):
        for t in range(int(scaled(30) / 0.01)):  # until the server has the connection and the core has read it
            assert _core_step(core, t, [1.0, 2.0]) == [1.0, 2.0]
            if caplog.records:
                break
            time.sleep(0.01)
    assert [r.getMessage() for r in caplog.records] == [
        f"elastic: step {t} dropped a connection before its JOIN: short frame: the peer closed the side channel "
        "after 12 of the 48 bytes of its frame head"
    ]
    assert core.workers() == () and core.joining == 0
    core.close()
    server.close()


def test_a_contribution_cut_short_fails_that_hybrid_and_the_core_steps_on_alone(group):
    core = _core(group, timeout_s=scaled(60))
    h = _active_played(core)
    raw, _ = _frame(_grad(1, [1.0, 3.0]))
    h._sock.sendall(raw[:20])
    h.close()
    own = _flat([3.0, 5.0]).reshape(1, 2)
    (g,) = core.reduce(1, [own.clone()])
    assert torch.equal(g, own)
    assert core.workers() == () and core.stats.failures == 1
    assert core.states.log[-1].why == (
        "no contribution for step 1: short frame: the peer closed the side channel after 20 of the 48 bytes of its "
        "frame head"
    )
    core.close()


def test_a_joiner_whose_snapshot_is_cut_short_is_told_which_blob(pair):
    """The hybrid's end: a SNAPSHOT frame cut in its first blob, then the core's end closes."""
    a, b = pair
    blob = torch.arange(64, dtype=torch.uint8)
    raw, blobs_at = _frame(Message(kind=Kind.SNAPSHOT, step=0, version=0, blobs=(blob,)))
    a._sock.sendall(raw[: blobs_at + 10])
    a.close()
    with pytest.raises(LinkError, match="^short frame: the peer closed the side channel after 10 of the 64 bytes of "):
        b.recv(timeout=scaled(60))
