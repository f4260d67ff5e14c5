"""Ctrl-C handling of the orchestrator: a record and its checkpoint are written together, and a native library
loaded with an engine must not turn Ctrl-C into an abrupt exit."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) until the block is done, then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def reinstall(handler: Any) -> None:
    """Set the SIGINT handler again at the C level: a native library loaded with an engine resets the process's
    SIGINT action to the default (Python still reports its own handler), and Ctrl-C must stay a KeyboardInterrupt
    so that the run stops cleanly."""
    if threading.current_thread() is threading.main_thread() and callable(handler):
        signal.signal(signal.SIGINT, handler)
