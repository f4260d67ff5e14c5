"""A flipped bit in a frame's head or meta (docs/elastic.md "Failures"): the blobs carry checksums, and so do the
head (kind, step, version, meta length) and the JSON meta, so the receiver refuses the frame at once with one
`LinkCorrupt` line. Without the head's checksum a flipped length had the receiver wait for bytes that never come
(or read the next blob's bytes as meta), a flipped step or version was accepted as another message, a flipped kind
as another kind."""

from __future__ import annotations

import logging
import socket
import struct

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.wire import _PREFIX, Kind, LinkCorrupt, Message, as_bytes  # noqa: E402
from tests.elastic.test_elastic_overlap import _link  # noqa: E402
from tests.elastic.test_exchange_worked import _active_played, _core, _core_step, _flat  # noqa: E402
from tests.limits import scaled  # noqa: E402

#: Byte ranges of the head's fields (struct "<4sB3xqqQ..."): everything up to the meta length is the same in every
#: wire version, so the test reads a frame's meta length the same way on either.
FIELDS = {
    "magic": (0, 4),
    "kind": (4, 5),
    "padding": (5, 8),
    "step": (8, 16),
    "version": (16, 24),
    "meta length": (24, 32),
}


def _frame(msg: Message) -> tuple[bytes, int]:
    """The bytes ``msg`` goes on the wire as, and where its blobs start (after the head and the meta)."""
    ours, theirs = socket.socketpair()
    _link(ours).send(msg, timeout=scaled(5))
    ours.close()
    raw = bytearray()
    while chunk := theirs.recv(1 << 16):
        raw += chunk
    theirs.close()
    (meta_len,) = struct.unpack_from("<Q", raw, 24)
    return bytes(raw), _PREFIX.size + meta_len


def _grad(step: int, values) -> Message:
    return Message(
        kind=Kind.GRAD, step=step, version=step, info={"dtype": "torch.float32"}, blobs=(as_bytes(_flat(values)),)
    )


def _flipped(raw: bytes, bit: int) -> bytes:
    out = bytearray(raw)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_every_flipped_bit_of_the_head_and_meta_is_refused_at_once_in_one_line():
    """Every bit of the head and of the meta, one at a time, of a real GRAD frame; the sender stays connected, so
    a receiver that waited for bytes would time out instead (a LinkTimeout, not the LinkCorrupt asked for)."""
    raw, blobs_at = _frame(_grad(3, [1.0, 2.0, 3.0]))
    assert len(raw) > blobs_at
    for bit in range(blobs_at * 8):
        ours, theirs = socket.socketpair()
        try:
            ours.sendall(_flipped(raw, bit))
            with pytest.raises(LinkCorrupt) as e:
                got = _link(theirs).recv(timeout=scaled(5))
                pytest.fail(f"bit {bit} (byte {bit // 8}) flipped, yet accepted: {got.kind.name} {got.step} {got.info}")
            assert "\n" not in str(e.value) and str(e.value).startswith("bad frame: "), (bit, str(e.value))
        finally:
            ours.close()
            theirs.close()


@pytest.mark.parametrize(
    ("field", "byte"),
    [
        *((f, lo) for f, (lo, _) in FIELDS.items()),
        ("meta length + 256", 25),  # more bytes than were sent: without the head checksum, a wait for them
        ("meta checksum", 32),
        ("head checksum", 40),
        ("meta", None),
    ],
)
def test_a_contribution_with_a_flipped_bit_fails_that_hybrid_and_the_core_steps_on_alone(group, field, byte):
    """The core detaches the hybrid with the one-line reason and averages over itself alone: its reduced gradient
    is its own, bitwise, within the one receive timeout (never a wait for a length that was not sent)."""
    core = _core(group, timeout_s=scaled(5))
    h = _active_played(core)
    raw, _ = _frame(_grad(1, [1.0, 3.0]))
    h._sock.sendall(_flipped(raw, 8 * (_PREFIX.size + 2 if byte is None else byte)))
    own = _flat([3.0, 5.0]).reshape(1, 2)
    (g,) = core.reduce(1, [own.clone()])
    assert torch.equal(g, own)  # the core's own gradient, every bit
    assert core.workers() == () and core.stats.failures == 1 and core.stats.accepted == 0
    why = core.states.log[-1].why
    assert why.startswith("no contribution for step 1: bad frame: ") and "\n" not in why, why
    assert _core_step(core, 2, [1.0, 1.0]) == [1.0, 1.0]  # and the next step runs as ever
    h.close()
    core.close()


def test_a_peer_of_the_old_wire_version_is_refused_by_name(pair):
    """Version 1 frames (magic LBR1) had no head checksum: the receiver says which versions meet."""
    a, b = pair
    meta = b'{"info":{"worker":"old"},"blobs":[]}'
    a._sock.sendall(struct.pack("<4sB3xqqQ", b"LBR1", int(Kind.JOIN), -1, -1, len(meta)) + meta)
    with pytest.raises(LinkCorrupt, match=r"^bad frame: wire version 1 \(magic b'LBR1'\) from the peer, this side"):
        b.recv(timeout=scaled(5))


def test_a_joiner_of_the_old_wire_version_is_dropped_and_the_versions_are_logged(group, caplog):
    core = _core(group, timeout_s=scaled(5))
    core_end, old = socket.socketpair()
    core.admit(_link(core_end))
    meta = b'{"info":{"worker":"old"},"blobs":[]}'
    old.sendall(struct.pack("<4sB3xqqQ", b"LBR1", int(Kind.JOIN), -1, -1, len(meta)) + meta)
    with caplog.at_level(logging.WARNING, logger="libra.elastic.core"):
        assert _core_step(core, 0, [1.0, 2.0]) == [1.0, 2.0]
    assert core.workers() == () and core.joining == 0
    assert [r.getMessage() for r in caplog.records] == [
        "elastic: step 0 dropped a connection before its JOIN: bad frame: wire version 1 (magic b'LBR1') from the "
        "peer, this side speaks version 2 (magic b'LBR2'): run one Libra version on both ends"
    ]
    old.close()
    core.close()


@pytest.mark.parametrize("byte", [4, 8, 16, 25, _PREFIX.size + 2])
def test_a_hybrid_refuses_a_reduced_gradient_with_a_flipped_bit_and_applies_nothing(byte):
    """The other end: a REDUCED frame with one flipped bit (kind, step, version, meta length, meta) fails the
    hybrid with one `LinkCorrupt` line; the tensors the optimizer reads keep the hybrid's own values."""
    from libra.elastic.states import JoinState
    from tests.elastic.test_elastic_misuse import _active_hybrid, _reduced

    hybrid, c = _active_hybrid(max_missed=1)
    raw, _ = _frame(_reduced(0, [2.0, 4.0]))
    c._sock.sendall(_flipped(raw, 8 * byte))
    mine = torch.ones(1, 2)
    with pytest.raises(LinkCorrupt, match="^bad frame: [^\n]*$"):
        hybrid.reduce(0, [mine])
    assert torch.equal(mine, torch.ones(1, 2)) and hybrid.state == JoinState.FAILED
    c.close()
