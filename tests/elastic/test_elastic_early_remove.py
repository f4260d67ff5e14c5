"""`CoreExchange.remove` sticks for a JOIN the core has not read yet, and two joins of one name (docs/elastic.md
"Failures"). The controller may cancel a join (`CancelJoin`) before the core's next boundary reads that hybrid's
JOIN: remove found no slot and did nothing, so that boundary admitted a worker the controller had already removed
(the runtime had handed it back to rollout). Now such a JOIN is refused with the reason, logged and counted, the
joiner is told why, and the core's state is bitwise what it is without the joiner."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.grads import Mode  # noqa: E402
from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.snapshot import state_digest  # noqa: E402
from libra.elastic.states import JoinState  # noqa: E402
from libra.elastic.wire import Kind, LinkClosed, LinkError, SideChannelServer, TcpLink  # noqa: E402
from tests.elastic.test_elastic_overlap import _core_steps, _Hybrid, _link, _small, _train_hybrid, _until  # noqa: E402
from tests.elastic.test_exchange_worked import _core, _core_step, _played  # noqa: E402
from tests.limits import scaled  # noqa: E402

WHY = "removed at step 0 before its JOIN was read: released to rollout"


def test_a_worker_removed_before_its_join_was_read_is_refused_with_the_reason(group, caplog):
    core = _core(group, timeout_s=scaled(5))
    h = _played(core, "h")  # its JOIN waits in the socket for the core's next boundary
    core.remove("h", step=0, why="released to rollout")
    with caplog.at_level(logging.WARNING, logger="libra.elastic.core"):
        assert _core_step(core, 0, [3.0, 5.0]) == [3.0, 5.0]
    assert core.workers() == () and core.joining == 0
    assert core.stats.refused == 1 and core.stats.failures == 0
    told = h.recv(timeout=scaled(5))
    assert (told.kind, told.info) == (Kind.LEAVE, {"why": WHY})
    with pytest.raises(LinkClosed):
        h.recv(timeout=scaled(5))
    assert [r.getMessage() for r in caplog.records] == [f"elastic: step 0 refused the JOIN of h: {WHY}"]
    assert [t.worker for t in core.states.log] == []  # it never joined: no transition to undo
    # a connection made after the remove is a new join of that name, and is admitted
    again = _played(core, "h")
    core.begin_step(1)
    assert core.workers() == ("h",)
    again.close()
    h.close()
    core.close()


def test_a_hybrid_removed_while_its_connection_waits_at_the_server_is_refused_and_the_core_is_unchanged(group):
    """A real hybrid over TCP whose connection the server has not accepted yet when the controller removes it: its
    `join` fails with the core's reason, and the core's parameters and optimizer state are bitwise those of a core
    that never heard of it."""
    model, opt = _small(warm_step=-1)
    server = SideChannelServer(host="127.0.0.1", port=0)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(5),
        server=server,
    )  # fmt: skip
    sent = threading.Event()
    h_model, h_opt = _small()
    hybrid = HybridReplica(
        worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(5),
        fault=lambda point: sent.set() if point == "fetching" else None,
    )  # fmt: skip
    errors: list[LinkError] = []

    def join() -> None:
        try:
            hybrid.join(TcpLink.connect("127.0.0.1", server.port, timeout=scaled(5)))
        except LinkError as exc:
            errors.append(exc)

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    assert sent.wait(scaled(30)), "the hybrid never sent its JOIN"
    core.remove("h", step=0, why="released to rollout")
    digests: dict = {}
    _core_steps(core, model, opt, range(3), digests)
    thread.join(scaled(30))
    assert [str(e) for e in errors] == [f"the core refused the join of 'h': {WHY}"]
    assert hybrid.state == JoinState.FAILED and core.workers() == () and core.stats.refused == 1
    alone, alone_opt = _small(warm_step=-1)
    reference: dict = {}
    plain = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=alone, optimizer=alone_opt, timeout_s=5
    )
    _core_steps(plain, alone, alone_opt, range(3), reference)
    assert digests == reference  # every step, bitwise
    plain.close()
    core.close()
    server.close()


def test_a_second_join_of_a_name_in_training_is_refused_and_the_first_stays_bitwise_equal(group):
    """Two hybrids named "h": the first joins and trains; the second's JOIN is refused with the reason, and the
    first is not disturbed (bitwise the core's after every step). Then the controller removes "h" while a third
    JOIN of that name waits: that one is refused too, not admitted into the slot the remove freed."""
    model, opt = _small(warm_step=-1)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30)
    )
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    attached, seen = threading.Event(), []

    def run_hybrid() -> None:
        hybrid.join(_link(hybrid_end), snapshot_timeout_s=scaled(60))
        attached.set()
        _train_hybrid(hybrid, h_model, h_opt, seen)

    thread = _Hybrid(run_hybrid)
    thread.start()
    digests: dict = {}

    def before(t: int) -> None:
        if t == 0:  # the first JOIN is in the socket before step 0 reads it
            _until(lambda: core.join_message_waiting(), thread)
        if t == 1:  # restored and attached: step 1 reads its ATTACH
            assert attached.wait(scaled(60))
            _until(lambda: core.join_message_waiting(), thread)
        if t == 2:
            duplicates.append(_played(core, "h"))

    duplicates: list = []
    _core_steps(core, model, opt, range(4), digests, before)
    told = duplicates[0].recv(timeout=scaled(5))
    assert (told.kind, told.info) == (Kind.LEAVE, {"why": "a worker named 'h' is in training already"})
    assert core.workers(JoinState.ACTIVE) == ("h",) and core.stats.refused == 1
    third = _played(core, "h")
    core.remove("h", step=4, why="released")
    core.begin_step(4)
    assert core.workers() == () and core.stats.refused == 2
    assert third.recv(timeout=scaled(5)).info == {"why": "removed at step 4 before its JOIN was read: released"}
    thread.join(scaled(30))
    assert thread.error is None
    assert [(s, m) for s, m, _ in seen] == [(1, Mode.ACTIVE), (2, Mode.ACTIVE), (3, Mode.ACTIVE)]
    assert all(d == digests[s] for s, _, d in seen)  # bitwise the core's after every step
    assert digests[3] == state_digest(h_model, h_opt)
    for link in (*duplicates, third):
        link.close()
    core.close()
