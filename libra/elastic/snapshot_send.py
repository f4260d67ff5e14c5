"""The core's send of a joiner's snapshot: posted as soon as the background capture has packed it."""

from __future__ import annotations

import threading

from libra.elastic.snapshot import PendingCapture
from libra.elastic.wire import Link, SendHandle


class SnapshotSend:
    """A :class:`~libra.elastic.snapshot.PendingCapture` and, once it is packed, its send with the link's
    ``send_async``, like any other send. On a link whose ``posts_from_any_thread`` is true (TCP) the packing thread
    posts it as soon as the pack is done, so the transfer overlaps the rest of the core's forward and backward pass
    (nothing else is sent to a fetching hybrid, so nothing can come between); on others (torch.distributed
    point-to-point) the core's own thread posts it at the end of ``reduce`` (:meth:`start`)."""

    def __init__(self, link: Link, pending: PendingCapture, timeout: float) -> None:
        self.pending, self._link, self._timeout = pending, link, timeout
        self._handle: SendHandle | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._posts_from_any_thread = bool(getattr(link, "posts_from_any_thread", False))
        if self._posts_from_any_thread:
            pending.add_done_callback(self.start)

    def start(self) -> None:
        """Post the send if the snapshot is packed and the send is not posted yet (a failed pack is an error)."""
        with self._lock:
            if self._handle is not None or self._error is not None or not self.pending.done():
                return
            try:
                self._handle = self._link.send_async(self.pending.wait().to_message(), timeout=self._timeout)
            except Exception as exc:  # reported through error(); the core must not die of a failed pack or send
                self._error = exc

    def wait_safe(self) -> None:
        """Wait until the caller may change the state: its bytes copied (a GPU state's checksums may still be
        computed, and the packing thread posts the send when they are) on a link that posts from any thread; the
        whole pack on others, whose send only the core's thread can post, at the end of this ``reduce``."""
        if self._posts_from_any_thread:
            self.pending.wait_copied()
        else:
            self.pending.wait()

    def done(self) -> bool:
        return self._error is not None or (self._handle is not None and self._handle.done())

    def error(self) -> BaseException | None:
        return self._error if self._error is not None else self._handle.error() if self._handle else None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
