"""Side-channel messages and the two transports that carry them.

A :class:`Message` is a kind, a training step, a state version, a small JSON ``info`` dict and a list of byte
blobs (1-D uint8 CPU tensors; a gradient or a snapshot bucket viewed as bytes). Every blob travels with its
checksum (XXH3-64, :func:`libra.elastic.pack.checksum`), checked on receipt, so a truncated or corrupted
contribution is rejected, never applied. The frame's head (kind, step, version, meta length) and its JSON meta
(``info``, the blobs' sizes and checksums) are checksummed as well, and each is verified before it is used, so a
flipped bit anywhere in a frame fails that link at once with :class:`LinkCorrupt` (never a wait for bytes that
do not come, never a misparsed frame). A sender that already holds its blobs' checksums (a snapshot packs them
as it copies) passes them in ``Message.checksums`` and they are not recomputed; :meth:`TcpLink.recv` hashes each
blob window by window as it arrives (while it is still in cache) and returns the verified checksums there too.

Transports (both implement :class:`Link`):

- :class:`TcpLink`: a socket on 127.0.0.1 (or any address the caller binds), for hybrid workers that are not in the
  core's torch.distributed world (a rollout worker started elsewhere). :class:`SideChannelServer` accepts them
  without a thread: the core polls it at step boundaries.
- :class:`~libra.elastic.dist_link.DistLink` (module :mod:`libra.elastic.dist_link`): torch.distributed
  point-to-point between two ranks of a fixed world, on the default group, never on the core's groups.

Every blocking call takes a timeout; expiry raises :class:`LinkTimeout`, a closed peer :class:`LinkClosed`, a bad
checksum or framing :class:`LinkCorrupt` (all are :class:`LinkError`).
"""

from __future__ import annotations

import contextlib
import json
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Protocol

import attrs
import torch
import xxhash

from libra.elastic.pack import checksum, checksums, new_hasher

#: The fixed-size head of a frame: magic, kind, step, version, meta length, the meta's XXH3-64 and the XXH3-64 of
#: the 40 bytes before it. The head is verified before its meta length is used (a flipped bit there would have the
#: receiver wait for bytes that never come, or read into the wrong buffer), the meta against its checksum before it
#: is parsed; the blobs carry their own checksums in the meta.
_PREFIX = struct.Struct("<4sB3xqqQQQ")
_HEAD_SUMMED = _PREFIX.size - 8  # the bytes the head's own checksum covers
#: The wire version is in the magic: ``LBR2`` (since 2026-12-06: head and meta checksummed). ``LBR1`` frames carried
#: no head checksum; they are refused by name.
_MAGIC = b"LBR2"
_OLD_MAGICS = {b"LBR1": 1}
_MAX_META = 16 << 20
#: Receive granularity: each window is hashed right after it lands (it is still in L2).
RECV_WINDOW = 256 << 10
#: Linux TCP states (``tcpi_state``) of an end whose peer has closed: TCP_CLOSE (reset) and TCP_CLOSE_WAIT (FIN)
_TCP_PEER_CLOSED = frozenset({7, 8})


class Kind(IntEnum):
    JOIN = 1  # hybrid -> core: hello; info = {"worker": name}
    SNAPSHOT = 2  # core -> hybrid: versioned model + optimizer state (buckets)
    ATTACH = 3  # hybrid -> core: snapshot restored at ``version``
    STEP = 4  # core -> hybrid: step start; info = mode, replica index, num replicas; blobs = catch-up gradients
    GRAD = 5  # hybrid -> core: a real gradient for ``step`` computed on state ``version``
    PLACEHOLDER = 6  # hybrid -> core: no gradient this step (exact zeros, not counted)
    REDUCED = 7  # core -> hybrid: the reduced gradient of ``step``
    LEAVE = 8  # either way: detach now


class LinkError(ConnectionError):
    """The side channel to one peer failed; the caller drops that peer's contribution."""


class LinkTimeout(LinkError):
    pass


class LinkClosed(LinkError):
    pass


class LinkCorrupt(LinkError):
    pass


@attrs.frozen(kw_only=True)
class Message:
    kind: Kind
    step: int
    version: int
    info: dict = attrs.field(factory=dict, eq=False)
    blobs: tuple[torch.Tensor, ...] = attrs.field(default=(), eq=False)
    #: The blobs' checksums when known: given by a sender that computed them while writing the blobs (then they
    #: are not recomputed), set by a receiver to the values it verified. None: compute on send.
    checksums: tuple[int, ...] | None = attrs.field(default=None, eq=False)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 view of a contiguous CPU tensor (no copy)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _encode_meta(msg: Message, backend: str = "auto") -> bytes:
    sums: Sequence[int] | None = msg.checksums
    if sums is None or len(sums) != len(msg.blobs):
        sums = checksums(msg.blobs) if len(msg.blobs) > 1 else [checksum(b, backend=backend) for b in msg.blobs]
    blobs = [[int(b.numel()), int(c)] for b, c in zip(msg.blobs, sums, strict=True)]
    return json.dumps({"info": msg.info, "blobs": blobs}, separators=(",", ":")).encode()


def _encode_head(kind: int, step: int, version: int, meta: bytes, *, magic: bytes = _MAGIC) -> bytes:
    """The head of a frame whose meta is ``meta``, both checksums filled in."""
    unsummed = _PREFIX.pack(magic, kind, step, version, len(meta), xxhash.xxh3_64_intdigest(meta), 0)
    return unsummed[:_HEAD_SUMMED] + struct.pack("<Q", xxhash.xxh3_64_intdigest(unsummed[:_HEAD_SUMMED]))


@attrs.frozen
class _Head:
    """A verified frame head: what the meta (``meta_len`` bytes, checksum ``meta_sum``) belongs to."""

    kind: Kind
    step: int
    version: int
    meta_len: int
    meta_sum: int


def _decode_prefix(raw: bytes) -> _Head:
    """A frame head, verified: its magic (the wire version), its checksum, then its fields. Any fault is
    :class:`LinkCorrupt`, raised before the meta length is trusted."""
    magic, kind, step, version, meta_len, meta_sum, head_sum = _PREFIX.unpack(raw)
    if magic in _OLD_MAGICS:
        raise LinkCorrupt(
            f"bad frame: wire version {_OLD_MAGICS[magic]} (magic {magic!r}) from the peer, this side speaks "
            f"version 2 (magic {_MAGIC!r}): run one Libra version on both ends"
        )
    if magic != _MAGIC:
        raise LinkCorrupt(f"bad frame: magic {magic!r}, meta length {meta_len}")
    got = xxhash.xxh3_64_intdigest(raw[:_HEAD_SUMMED])
    if got != head_sum:
        raise LinkCorrupt(
            f"bad frame: head checksum {got:#018x} != sent {head_sum:#018x} "
            f"(kind {kind}, step {step}, version {version}, meta length {meta_len})"
        )
    if meta_len > _MAX_META:
        raise LinkCorrupt(f"bad frame: meta length {meta_len}, more than the {_MAX_META} a meta may have")
    try:
        return _Head(Kind(kind), step, version, meta_len, meta_sum)
    except ValueError:
        raise LinkCorrupt(f"bad frame: unknown kind {kind}") from None


def _check_meta(raw: bytes, head: _Head) -> bytes:
    """``raw`` if it is the meta ``head`` announced (its checksum), else :class:`LinkCorrupt`."""
    got = xxhash.xxh3_64_intdigest(raw)
    if got != head.meta_sum:
        raise LinkCorrupt(f"bad frame: meta checksum {got:#018x} != sent {head.meta_sum:#018x}")
    return raw


def _decode_meta(raw: bytes) -> tuple[dict, list[tuple[int, int]]]:
    """A frame's meta: its ``info`` dict and each blob's (byte count, checksum). Anything else (not UTF-8 JSON, not
    an object of those two, a negative or non-integer size, a checksum outside 64 bits) is :class:`LinkCorrupt`,
    so that a malformed frame fails that peer's link and never the receiver (a core step must always complete)."""
    try:
        meta = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise LinkCorrupt(f"bad frame: meta is not JSON ({exc})") from None
    info = meta.get("info") if isinstance(meta, dict) else None
    entries = meta.get("blobs") if isinstance(meta, dict) else None
    if not isinstance(info, dict) or not isinstance(entries, list):
        raise LinkCorrupt(f"bad frame: meta needs an 'info' object and a 'blobs' list, got {raw[:80]!r}")
    blobs: list[tuple[int, int]] = []
    for i, entry in enumerate(entries):
        ok = isinstance(entry, list) and len(entry) == 2 and all(type(v) is int for v in entry)
        if not ok or not entry[0] >= 0 or not 0 <= entry[1] < 1 << 64:
            raise LinkCorrupt(f"bad frame: blob {i} is {entry!r}, not [byte count >= 0, 64-bit checksum]")
        blobs.append((entry[0], entry[1]))
    return info, blobs


def _check_blob(i: int, blob: torch.Tensor, crc: int, backend: str = "auto") -> None:
    _check_sum(i, checksum(blob, backend=backend), crc)


def _check_sum(i: int, got: int, sent: int) -> None:
    if got != sent:
        raise LinkCorrupt(f"blob {i}: checksum {got:#018x} != sent {sent:#018x}")


class SendHandle(Protocol):
    def done(self) -> bool: ...
    def error(self) -> BaseException | None: ...
    def close(self) -> None: ...


class Link(Protocol):
    """One side-channel connection to one peer."""

    def send(self, msg: Message, *, timeout: float) -> None: ...
    def send_async(self, msg: Message, *, timeout: float) -> SendHandle: ...
    def poll(self) -> bool: ...
    def recv(self, *, timeout: float) -> Message: ...
    def close(self) -> None: ...


FaultHook = Callable[[str], None]


def _no_fault(_: str) -> None:
    return None


# -- TCP ------------------------------------------------------------------------------------------------------


class _ThreadSend:
    def __init__(self, link: TcpLink, msg: Message, timeout: float) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(link, msg, timeout), daemon=True, name="libra-snap")
        self._thread.start()

    def _run(self, link: TcpLink, msg: Message, timeout: float) -> None:
        try:
            link.send(msg, timeout=timeout)
        except BaseException as exc:  # reported through error(); the core must not die of a peer's failure
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def error(self) -> BaseException | None:
        return self._error

    def close(self) -> None:
        self._thread.join(timeout=5.0)


#: ``recv(into=...)``: called with (blob index, byte count) before a blob is received; returns a 1-D uint8 CPU
#: tensor of at least that many bytes to receive into (preallocated, reused memory), or None for a new one.
BlobAllocator = Callable[[int, int], "torch.Tensor | None"]


class ReusedBlobs:
    """A :data:`BlobAllocator` that receives blob ``i`` of every message into the memory blob ``i`` of the last one
    had (a larger buffer when a blob outgrows it). For a stream of messages each consumed before the next is
    received, such as a step's gradient: a new blob of 400 MB (100M parameters) costs more in page faults than its
    transfer on the machines measured. A received blob is then a view of that memory, valid until the next message."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def __call__(self, index: int, nbytes: int) -> torch.Tensor:
        while len(self.buffers) <= index:
            self.buffers.append(torch.empty(0, dtype=torch.uint8))
        if self.buffers[index].numel() < nbytes:
            self.buffers[index] = _new_blob(index, nbytes)
        return self.buffers[index]


def recv_reusing(link: Link, into: BlobAllocator, *, timeout: float) -> Message:
    """``link.recv`` with its blobs received into the memory ``into`` gives (a :class:`ReusedBlobs`, say) where the
    link can (``receives_into``); into new memory where it cannot."""
    if getattr(link, "receives_into", False):
        return link.recv(timeout=timeout, into=into)  # type: ignore[call-arg]
    return link.recv(timeout=timeout)


class TcpLink:
    """A framed message stream over one TCP socket. ``fault`` is called at named points (fault-injection tests);
    ``backend`` is passed to :func:`libra.elastic.pack.checksum` (every backend gives the same value).

    Blobs are sent straight from their memory (``sendall`` of a memoryview: no copy in Python, the loop over
    partial sends runs in C) and received straight into their destination, window by window."""

    #: ``send_async`` may be called from any thread: it sends on a thread of its own, and sends are serialized
    posts_from_any_thread = True
    #: ``recv`` takes ``into=`` (memory to receive blobs into)
    receives_into = True

    def __init__(self, sock: socket.socket, *, fault: FaultHook = _no_fault, backend: str = "auto") -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._fault = fault
        self.backend = backend
        self._send_lock = threading.Lock()

    @classmethod
    def connect(
        cls, host: str, port: int, *, timeout: float, fault: FaultHook = _no_fault, backend: str = "auto"
    ) -> TcpLink:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise LinkError(f"connect to {host}:{port}: {exc}") from exc
        return cls(sock, fault=fault, backend=backend)

    def send(self, msg: Message, *, timeout: float) -> None:
        meta = _encode_meta(msg, self.backend)
        deadline = time.monotonic() + timeout
        with self._send_lock:
            self._sendall(_encode_head(int(msg.kind), msg.step, msg.version, meta) + meta, deadline)
            for blob in msg.blobs:
                view = memoryview(blob.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).cast("B")
                half = len(view) // 2
                self._sendall(view[:half], deadline)
                self._fault(f"mid_send:{msg.kind.name}")
                self._sendall(view[half:], deadline)

    def send_async(self, msg: Message, *, timeout: float) -> SendHandle:
        return _ThreadSend(self, msg, timeout)

    def poll(self) -> bool:
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True  # closed: let recv() raise
        return bool(readable)

    def recv(self, *, timeout: float, into: BlobAllocator | None = None) -> Message:
        """The next message; every blob verified against its checksum as it arrives. ``into`` supplies the memory
        blobs are received into (see :data:`BlobAllocator`); by default each blob is a new tensor."""
        deadline = time.monotonic() + timeout
        head = _decode_prefix(self._recv_exact(_PREFIX.size, deadline, "frame head"))
        info, entries = _decode_meta(_check_meta(self._recv_exact(head.meta_len, deadline, "meta"), head))
        blobs, sums = [], []
        for i, (n, crc) in enumerate(entries):
            blob = into(i, n) if into is not None else None
            if blob is None:
                blob = _new_blob(i, n)
            elif blob.dtype != torch.uint8 or blob.dim() != 1 or blob.numel() < n or not blob.is_contiguous():
                raise ValueError(f"recv(into=...): blob {i} needs a contiguous 1-D uint8 tensor of >= {n} bytes")
            blob = blob[:n]
            _check_sum(i, self._recv_hashed(memoryview(blob.numpy()).cast("B"), deadline, f"blob {i}"), crc)
            blobs.append(blob)
            sums.append(crc)
        return Message(
            kind=head.kind, step=head.step, version=head.version, info=info, blobs=tuple(blobs), checksums=tuple(sums)
        )

    def peer_closed(self) -> bool:
        """Whether the peer has closed its end: nothing more will arrive (what it sent before may still be waiting
        to be read). Reads nothing. A TCP socket on Linux says so in its state (peer's FIN or reset received); on
        any other socket only an end with nothing left to read can tell (an empty peek), so a closed peer whose
        last bytes are still unread is taken for a live one."""
        try:
            if self._sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_INFO"):
                state = self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
                return state in _TCP_PEER_CLOSED
            readable, _, _ = select.select([self._sock], [], [], 0)
            return bool(readable) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset, or this end closed already
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LinkTimeout("side channel timed out")
        return left

    def _sendall(self, data: bytes | memoryview, deadline: float) -> None:
        """All of ``data`` in one ``sendall`` (its timeout bounds the whole call since Python 3.5)."""
        if not len(data):
            return
        try:
            self._sock.settimeout(self._remaining(deadline))
            self._sock.sendall(data)
        except TimeoutError as exc:
            raise LinkTimeout("side channel send timed out") from exc
        except OSError as exc:
            raise LinkClosed(f"side channel send failed: {exc}") from exc

    def _recv_hashed(self, view: memoryview, deadline: float, part: str) -> int:
        """Receive exactly ``len(view)`` bytes into ``view``, hashing each window as soon as it is complete."""
        h = new_hasher()
        for start in range(0, len(view), RECV_WINDOW):
            window = view[start : start + RECV_WINDOW]
            self._recv_into(window, deadline, _Part(part, start, len(view)))
            h.update(window)
        return h.intdigest()

    def _recv_into(self, view: memoryview, deadline: float, part: _Part) -> None:
        """Fill ``view`` (bytes ``part.before`` on of ``part``). A peer that closes part way is a short frame, named
        at once (the end of the stream is there: nothing is waited for)."""
        got_before = part.before
        while view:
            try:
                self._sock.settimeout(self._remaining(deadline))
                got = self._sock.recv_into(view)
            except TimeoutError as exc:
                raise LinkTimeout("side channel receive timed out") from exc
            except OSError as exc:
                raise LinkClosed(f"side channel receive failed: {exc}") from exc
            if got == 0:
                raise LinkClosed(part.closed_after(got_before))
            view = view[got:]
            got_before += got

    def _recv_exact(self, n: int, deadline: float, part: str) -> bytes:
        buf = bytearray(n)
        self._recv_into(memoryview(buf), deadline, _Part(part, 0, n))
        return bytes(buf)


@attrs.frozen
class _Part:
    """Which part of a frame a receive fills (``name``: "frame head", "meta", "blob 3"), from which of its
    ``size`` bytes on: what a short frame names."""

    name: str
    before: int
    size: int

    def closed_after(self, got: int) -> str:
        """The line for a peer that closed after ``got`` bytes of this part."""
        if self.name == "frame head" and got == 0:
            return "peer closed the side channel"  # between two frames: a plain close
        return f"short frame: the peer closed the side channel after {got} of the {self.size} bytes of its {self.name}"


def _new_blob(i: int, n: int) -> torch.Tensor:
    """New memory for blob ``i`` of ``n`` bytes; a size no allocator can give (a corrupted frame) is LinkCorrupt."""
    try:
        return torch.empty(n, dtype=torch.uint8)
    except (RuntimeError, MemoryError) as exc:
        raise LinkCorrupt(f"bad frame: blob {i} of {n} bytes cannot be allocated") from exc


class SideChannelServer:
    """A listening socket on the core replica; :meth:`accept_ready` takes pending hybrid connections without
    blocking (called at step boundaries, so no acceptor thread exists)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.setblocking(False)
        self.host, self.port = self._sock.getsockname()[:2]

    def accept_ready(self) -> list[TcpLink]:
        links: list[TcpLink] = []
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return links
            conn.setblocking(True)
            links.append(TcpLink(conn))

    def close(self) -> None:
        self._sock.close()


def peer_closed(link: Link) -> bool:
    """Whether ``link``'s peer has visibly closed its end (see :meth:`TcpLink.peer_closed`); False for a link that
    cannot tell (:class:`~libra.elastic.dist_link.DistLink`: a fixed world's pair stays up)."""
    check = getattr(link, "peer_closed", None)
    return bool(check()) if check is not None else False


def arrives(link: Link, deadline: float) -> bool:
    """Whether ``link``'s next message starts to arrive before ``deadline`` (``poll`` consumes nothing of it, so a
    False leaves the link in step: the caller may skip this message and wait again later)."""
    while not link.poll():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.0005))
    return True


_FIXED_PORTS = (20000, 32768)  # below Linux's default ephemeral range (32768-60999)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux), or the IANA one where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, for a caller that binds it later (another process, a
    rendezvous URL).

    The port is drawn at random from outside the kernel's ephemeral range: a port that binding to 0 returns is
    ephemeral, and the kernel may give it to any outgoing connection (a store client, a gloo pair) before the
    caller binds it, which fails the later bind with EADDRINUSE. A port outside that range is only taken by
    another explicit bind. Falls back to binding port 0 if no candidate outside the range is free."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(*_FIXED_PORTS) if not low <= p <= high]
    rng = random.Random()
    for port in rng.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
