"""Signals held around a record's checkpoint and an engine start (libra/runtime/signals.py), as an integrator's own
process has them: an ignored SIGINT stays ignored, a default one still stops the run once the block is done."""

from __future__ import annotations

import os
import signal

import pytest

from libra.runtime.signals import deferred_sigint


@pytest.fixture
def sigint():
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_stays_ignored_while_held(sigint) -> None:
    # a process started in the background by a script ignores SIGINT (Ctrl-C is meant for the foreground job)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = []
    try:
        with deferred_sigint():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("checkpoint")
    except KeyboardInterrupt:  # before: a Ctrl-C during a checkpoint write stopped the run, at any other moment not
        pytest.fail("an ignored SIGINT raised KeyboardInterrupt at the end of the block")
    assert done == ["checkpoint"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_sigint_with_its_default_action_still_stops_once_the_block_is_done(sigint) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    done = []
    with pytest.raises(KeyboardInterrupt), deferred_sigint():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("checkpoint")
    assert done == ["checkpoint"] and signal.getsignal(signal.SIGINT) is signal.SIG_DFL
