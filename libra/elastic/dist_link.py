"""The torch.distributed point-to-point transport of the side channel: :class:`DistLink`.

Framed messages (see :mod:`libra.elastic.wire`) over ``isend``/``irecv`` between two ranks of a fixed world, on
the default group (never a core group). Two gloo facts shape it: point-to-point work is marked complete only
inside ``wait()``, and a ``wait`` that times out tears that pair's connection down. So a non-blocking poll posts
the receive and lets a small thread wait for it, asynchronous sends are waited for by a thread, and a timed-out
dist link is dead for good (rejoin over TCP or restart the world).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence

import torch

from libra.elastic.wire import (
    _PREFIX,
    LinkClosed,
    LinkError,
    LinkTimeout,
    Message,
    SendHandle,
    _check_blob,
    _check_meta,
    _decode_meta,
    _decode_prefix,
    _encode_head,
    _encode_meta,
    _new_blob,
)


class _WorksSend:
    """Posted isends plus a thread that waits for them (gloo completes work only inside ``wait()``)."""

    def __init__(self, works: list, keep: Sequence[torch.Tensor], timeout: float) -> None:
        self._works, self._keep = works, list(keep)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True, name="libra-dist-send")
        self._thread.start()

    def _run(self, timeout: float) -> None:
        try:
            for w in self._works:
                w.wait(datetime.timedelta(seconds=timeout))
        except BaseException as exc:
            self._error = LinkError(str(exc))

    def done(self) -> bool:
        return not self._thread.is_alive()

    def error(self) -> BaseException | None:
        return self._error

    def close(self) -> None:
        self._thread.join(timeout=5.0)
        self._keep.clear()


class _Posted:
    """A posted prefix receive plus a thread that waits for it: gloo marks point-to-point work complete only inside
    ``wait()``, and a ``wait`` that times out tears the pair down, so a non-blocking poll needs a waiter thread.
    The thread ends when the message arrives (or the process group's own timeout fires)."""

    def __init__(self, work, buf: torch.Tensor) -> None:
        self.work, self.buf = work, buf
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True, name="libra-dist-poll")
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


_POSTED: dict[tuple[int, int, int], _Posted] = {}


class DistLink:
    """Framed messages over ``torch.distributed`` isend/irecv with ``peer`` (a global rank), on ``group`` (the
    default group when None; never a core group). All messages of one link use ``tag``."""

    def __init__(self, peer: int, *, group=None, tag: int = 7) -> None:
        self.peer, self._group, self._tag = peer, group, tag
        self._key = (id(group), peer, tag)

    # A posted prefix receive belongs to the (group, peer, tag) channel, not to one link object: gloo cannot withdraw
    # it, so a later link to the same peer must reuse it rather than post a second one that would lose the race.
    @property
    def _pending(self) -> _Posted | None:
        return _POSTED.get(self._key)

    @_pending.setter
    def _pending(self, value: _Posted | None) -> None:
        if value is None:
            _POSTED.pop(self._key, None)
        else:
            _POSTED[self._key] = value

    def _wait(self, work, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0 and not work.is_completed():
            raise LinkTimeout("side channel (dist) timed out")
        try:
            work.wait(datetime.timedelta(seconds=max(left, 0.001)))
        except RuntimeError as exc:
            kind = LinkTimeout if "imed out" in str(exc) else LinkClosed
            raise kind(f"side channel (dist) with rank {self.peer}: {exc}") from exc

    def _isend_all(self, msg: Message) -> tuple[list, list[torch.Tensor]]:
        import torch.distributed as dist

        meta = _encode_meta(msg)
        prefix = _encode_head(int(msg.kind), msg.step, msg.version, meta)
        # Prefix and meta are separate messages: the receiver learns the meta length from the fixed-size prefix.
        parts = [
            torch.frombuffer(bytearray(prefix), dtype=torch.uint8),
            torch.frombuffer(bytearray(meta), dtype=torch.uint8),
        ]
        parts += [b for b in msg.blobs if b.numel()]
        works = [dist.isend(p, dst=self.peer, group=self._group, tag=self._tag) for p in parts]
        return works, parts

    def send(self, msg: Message, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        works, _parts = self._isend_all(msg)
        for w in works:
            self._wait(w, deadline)

    def send_async(self, msg: Message, *, timeout: float) -> SendHandle:
        works, parts = self._isend_all(msg)
        return _WorksSend(works, parts, timeout)

    def _irecv(self, i: int, n: int) -> tuple[object, torch.Tensor]:
        """Post the receive of part ``i`` (-1: the prefix, -2: the meta, else a blob) of ``n`` bytes."""
        import torch.distributed as dist

        buf = _new_blob(i, n)
        return dist.irecv(buf, src=self.peer, group=self._group, tag=self._tag), buf

    def poll(self) -> bool:
        if self._pending is None:
            self._pending = _Posted(*self._irecv(-1, _PREFIX.size))
        return self._pending.done.is_set()

    def recv(self, *, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        posted = self._pending
        if posted is None:
            work, buf = self._irecv(-1, _PREFIX.size)
            self._wait(work, deadline)
        else:
            if not posted.done.wait(max(deadline - time.monotonic(), 0.0)):
                raise LinkTimeout(f"side channel (dist) with rank {self.peer}: nothing within {timeout}s")
            posted.thread.join()
            self._pending = None
            if posted.error is not None:
                raise LinkClosed(f"side channel (dist) with rank {self.peer}: {posted.error}")
            buf = posted.buf
        head = _decode_prefix(bytes(buf.numpy()))
        work, buf = self._irecv(-2, head.meta_len)
        self._wait(work, deadline)
        info, entries = _decode_meta(_check_meta(bytes(buf.numpy()), head))
        blobs = []
        for i, (n, crc) in enumerate(entries):
            if n == 0:
                blob = torch.empty(0, dtype=torch.uint8)
            else:
                work, blob = self._irecv(i, n)
                self._wait(work, deadline)
            _check_blob(i, blob, crc)
            blobs.append(blob)
        sums = tuple(crc for _, crc in entries)
        return Message(
            kind=head.kind, step=head.step, version=head.version, info=info, blobs=tuple(blobs), checksums=sums
        )

    def close(self) -> None:
        """Nothing to release: a posted prefix receive stays with the channel (see ``_pending``)."""
