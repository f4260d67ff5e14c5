"""Ctrl-C and SIGTERM handling of the orchestrator: a record and its checkpoint are written together, a native
library loaded with an engine must not turn Ctrl-C into an abrupt exit, and SIGTERM (`kill`, a job scheduler's
stop, `timeout`) stops the run as Ctrl-C does instead of leaving its engine processes behind."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as for Ctrl-C (a `KeyboardInterrupt`, so every cleanup of an interrupt runs)."""

    signum = signal.SIGTERM


def raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def stop_on_sigterm() -> Any:
    """Make SIGTERM raise `Terminated` in the main thread; returns the previous handler (None off the main thread,
    where nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, raise_terminated)


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT), and a SIGTERM that has a Python handler, until the block is done, then hand the
    first one held to its handler (which raises `KeyboardInterrupt` or `Terminated`). A SIGTERM with the default
    action still ends the process at once (there is no handler to hand it to); an ignored signal stays ignored (a
    process started in the background by a script ignores SIGINT: a Ctrl-C meant for the foreground job must not
    stop it because it arrived during a checkpoint write)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = [s for s in STOP_SIGNALS if _holds(s, signal.getsignal(s))]
    previous = {int(s): signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        handler = previous[caught[0]]
        if callable(handler):
            handler(caught[0], None)
        raise KeyboardInterrupt


def _holds(sig: int, handler: Any) -> bool:
    """Whether `deferred_sigint` holds `sig`: one with a Python handler, and SIGINT with its default action (a
    `KeyboardInterrupt` then), never an ignored one."""
    return callable(handler) or (sig == signal.SIGINT and handler not in (signal.SIG_IGN, None))


def reinstall(handler: Any) -> None:
    """Set the SIGINT handler again at the C level: a native library loaded with an engine resets the process's
    SIGINT action to the default (Python still reports its own handler), and Ctrl-C must stay a KeyboardInterrupt
    so that the run stops cleanly. A Python handler of SIGTERM (`stop_on_sigterm`) is set again too."""
    if threading.current_thread() is not threading.main_thread():
        return
    if callable(handler):
        signal.signal(signal.SIGINT, handler)
    term = signal.getsignal(signal.SIGTERM)
    if callable(term):
        signal.signal(signal.SIGTERM, term)
