"""A hybrid waits out a slow core: a STEP that comes after one receive timeout (but within `max_missed` of them)
is taken, not treated as a dead core; a core silent for longer still fails the hybrid."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

import elastic_harness as H  # noqa: E402

from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.snapshot import capture  # noqa: E402
from libra.elastic.states import JoinState  # noqa: E402
from libra.elastic.wire import Kind, LinkTimeout, Message, SideChannelServer, TcpLink  # noqa: E402
from tests.limits import scaled  # noqa: E402

TIMEOUT_S = scaled(0.5)


def _slow_core(server: SideChannelServer, core_state, delay_s: float, errors: list) -> None:
    """Serve one join, then send STEP 0 only after `delay_s`."""
    try:
        deadline = time.monotonic() + scaled(120)
        while not (links := server.accept_ready()):
            assert time.monotonic() < deadline, "the hybrid never connected"
            time.sleep(0.01)
        (link,) = links
        link.backend = "python"  # no C++ extension load inside the timed exchange
        assert link.recv(timeout=scaled(60)).kind == Kind.JOIN
        model, opt = core_state
        link.send(capture(model, opt, version=0, backend="python").to_message(), timeout=scaled(60))
        assert link.recv(timeout=scaled(60)).kind == Kind.ATTACH
        time.sleep(delay_s)
        info = {"mode": "placeholder", "replica_index": -1, "num_replicas": 2, "replay": []}
        link.send(Message(kind=Kind.STEP, step=0, version=0, info=info), timeout=scaled(10))
        time.sleep(scaled(1.0))  # keep the link open while the hybrid reads
        link.close()
    except Exception as exc:  # surfaced by the test
        errors.append(f"{type(exc).__name__}: {exc}")


def _begin_step_against_slow_core(max_missed: int, delay_s: float):
    server = SideChannelServer(host="127.0.0.1", port=0)
    errors: list = []
    core_state = H.make_model()  # built before the clock starts (a first optimizer can take seconds to import)
    model, opt = H.make_model(seed=5)
    core = threading.Thread(target=_slow_core, args=(server, core_state, delay_s, errors))
    core.start()
    hy = HybridReplica(
        worker="hybrid-0", model=model, optimizer=opt, timeout_s=TIMEOUT_S, max_missed=max_missed, backend="python"
    )
    try:
        hy.join(TcpLink.connect("127.0.0.1", server.port, timeout=scaled(10), backend="python"))
        return hy, hy.begin_step()
    except LinkTimeout as exc:
        return hy, exc
    finally:
        core.join()
        server.close()
        assert not errors, errors


def test_a_core_late_by_one_timeout_is_waited_out() -> None:
    hy, got = _begin_step_against_slow_core(max_missed=3, delay_s=1.5 * TIMEOUT_S)
    assert not isinstance(got, Exception), got
    assert got.step == 0 and hy.state == JoinState.PLACEHOLDER


def test_without_grace_the_same_late_core_fails_the_hybrid() -> None:
    hy, got = _begin_step_against_slow_core(max_missed=1, delay_s=1.5 * TIMEOUT_S)
    assert isinstance(got, LinkTimeout) and hy.state == JoinState.FAILED


def test_max_missed_must_be_a_whole_number() -> None:
    model, opt = H.make_model()
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError):
            HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=1.0, max_missed=bad)
