"""A hybrid that joins again at once, before the core noticed that its old link died (docs/elastic.md "Failures").
The core read the new JOIN while it still held a slot of that name, and refused it as "in training already": the
hybrid had to retry at a later boundary. Now, at the boundary that reads such a JOIN, an old link whose peer has
closed its end ends the old stay (a failure, or a leave where its LEAVE waits there) and the JOIN is a new join;
an old link still open keeps its slot, and the JOIN is refused as before (`test_elastic_early_remove.py`)."""

from __future__ import annotations

import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.grads import Mode, trainable  # noqa: E402
from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.snapshot import state_digest  # noqa: E402
from libra.elastic.states import JoinEvent, JoinState  # noqa: E402
from libra.elastic.wire import LinkClosed, SideChannelServer, TcpLink  # noqa: E402
from tests.elastic.test_elastic_overlap import _core_steps, _grads, _Hybrid, _small, _until  # noqa: E402
from tests.limits import scaled  # noqa: E402

#: a join takes two boundaries (JOIN, then ATTACH), each waited for: more core steps without a contribution is a bug
MAX_STEPS_TO_CONTRIBUTE = 8


def _step(hybrid: HybridReplica, model, opt, seen: list) -> bool:
    """One step of ``hybrid`` (False: the core detached it), noting (step, mode, state digest) in ``seen``."""
    a = hybrid.begin_step()
    if a is None:
        return False
    g = _grads(model, a.step, a.shard(8)) if a.mode == Mode.ACTIVE else [torch.zeros_like(p) for p in trainable(model)]
    hybrid.reduce(a.step, g)
    for p, gr in zip(trainable(model), g, strict=True):
        p.grad = gr
    opt.step()
    seen.append((a.step, a.mode, state_digest(model, opt)))
    return True


@pytest.mark.parametrize("how", ["dropped", "left"])
def test_a_hybrid_whose_link_dropped_joins_again_at_once_and_stays_bitwise_the_cores(group, how):
    """A real hybrid over TCP trains one step, loses its link (its end closes; or it leaves, its LEAVE unread) and
    joins again at once on a new connection, before the core's next boundary: that boundary ends the old stay and
    admits the new one, which trains bitwise equal to the core after every step."""
    model, opt = _small(warm_step=-1)
    server = SideChannelServer(host="127.0.0.1", port=0)  # the test admits its connections (see `before`)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30)
    )
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen: list = []
    ended: list = []

    def run_hybrid() -> None:
        first = TcpLink.connect("127.0.0.1", server.port, timeout=scaled(30))
        hybrid.join(first, snapshot_timeout_s=scaled(60))
        assert _step(hybrid, h_model, h_opt, seen)
        if how == "dropped":
            first.close()  # the connection drops; the hybrid finds out at its next receive
            with pytest.raises(LinkClosed):
                hybrid.begin_step()
            assert hybrid.state == JoinState.FAILED
        else:
            hybrid.leave("back to rollout")
        hybrid.join(TcpLink.connect("127.0.0.1", server.port, timeout=scaled(30)), snapshot_timeout_s=scaled(60))
        while _step(hybrid, h_model, h_opt, seen):
            pass
        ended.append(hybrid.state)

    thread = _Hybrid(run_hybrid)
    thread.start()
    digests: dict = {}
    steps = iter(range(10**6))

    def step_until_it_contributed(times: int) -> None:
        """Core steps, each once a joiner's next message is there, until the hybrid contributed ``times`` more."""
        for _ in range(times):
            for _ in range(MAX_STEPS_TO_CONTRIBUTE):
                _until(lambda: not core.workers(JoinState.FETCHING_STATE) or core.join_message_waiting(), thread)
                _core_steps(core, model, opt, [next(steps)], digests)
                if core.records[-1].hybrid_contributors:
                    break
            else:
                raise AssertionError(f"no contribution in {MAX_STEPS_TO_CONTRIBUTE} steps: {thread.error!r}")

    def admit_the_next_join(old=None) -> None:
        """The hybrid's next connection, once its JOIN is there (and ``old``'s close: a loaded kernel may deliver
        either a little later). The test takes it off the server so as to wait for both before the boundary."""
        links: list = []
        _until(lambda: bool(links.extend(server.accept_ready()) or links), thread)
        core.admit(links[0])
        _until(lambda: core.join_message_waiting() and (old is None or old.peer_closed()), thread)

    admit_the_next_join()
    step_until_it_contributed(1)
    rejoined_at = core.records[-1].step + 1  # the next boundary reads the new JOIN: the core has not noticed
    admit_the_next_join(old=core._slots["h"].link)
    step_until_it_contributed(3)
    core.remove("h", step=next(steps), why="released")
    thread.join(scaled(60))
    assert thread.error is None, repr(thread.error)
    assert ended == [JoinState.ROLLOUT]
    contributed = [r.step for r in core.records if r.hybrid_contributors == ("h",)]
    assert len(contributed) == 4 and contributed[0] < rejoined_at < contributed[1]
    assert [(s, m) for s, m, _ in seen] == [(t, Mode.ACTIVE) for t in contributed]
    assert all(d == digests[s] for s, _, d in seen)  # bitwise the core's after every step it took
    assert core.stats.refused == 0
    old_end = {"dropped": (JoinEvent.FAIL, "its side channel closed: it joined again on a new connection"),
               "left": (JoinEvent.LEAVE, "hybrid left: back to rollout")}[how]  # fmt: skip
    there = [(r.event, r.why) for r in core.states.log if r.step == rejoined_at]
    assert there[0] == old_end, there
    new_join = [*([JoinEvent.RECOVER] if how == "dropped" else []), JoinEvent.REQUEST, JoinEvent.START_FETCH]
    assert [e for e, _ in there[1 : 1 + len(new_join)]] == new_join, there
    assert (core.stats.failures, core.stats.leaves) == ((1, 1) if how == "dropped" else (0, 2))
    core.close()
    server.close()


def test_a_join_of_a_name_whose_link_is_open_is_still_refused(group):
    """The old link open (a second worker of that name, over TCP): the JOIN is refused and the first keeps its
    slot, as before."""
    model, opt = _small(warm_step=-1)
    server = SideChannelServer(host="127.0.0.1", port=0)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30),
        server=server,
    )  # fmt: skip
    first = _raw_join(server.port, "h")
    core.begin_step(0)
    assert core.workers() == ("h",)
    second = _raw_join(server.port, "h")
    core.begin_step(1)
    assert core.workers() == ("h",) and core.stats.refused == 1 and core.stats.failures == 0
    for s in (first, second):
        s.close()
    core.close()
    server.close()


def _raw_join(port: int, name: str) -> socket.socket:
    """A connection that sent a JOIN of ``name`` and reads nothing (its end stays open)."""
    from libra.elastic.wire import Kind, Message

    link = TcpLink.connect("127.0.0.1", port, timeout=scaled(30))
    link.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": name}), timeout=scaled(30))
    return link._sock


def test_peer_closed_reads_nothing_and_tells_a_closed_peer_where_the_socket_can(pair):
    """TCP (Linux): the socket's state says it, bytes unread or not. A socketpair: only an end with nothing left
    to read can tell, so a closed peer whose last bytes are unread is taken for a live one (the JOIN is refused,
    as before). Never a read: the bytes are still there for `recv`."""
    a, b = pair
    assert not b.peer_closed()
    a._sock.sendall(b"last words")
    a.close()
    assert not b.peer_closed() and b._sock.recv(64) == b"last words"
    assert b.peer_closed()
    server = SideChannelServer(host="127.0.0.1", port=0)
    peer = _raw_join(server.port, "h")
    links = []
    for _ in range(int(scaled(30) / 0.01)):
        if links := server.accept_ready():
            break
        threading.Event().wait(0.01)
    (link,) = links
    assert not link.peer_closed()
    peer.close()
    for _ in range(int(scaled(30) / 0.01)):  # the FIN travels on its own
        if link.peer_closed():
            break
        threading.Event().wait(0.01)
    assert link.peer_closed() and link.recv(timeout=scaled(30)).info == {"worker": "h"}  # the JOIN still there
    link.close()
    server.close()
