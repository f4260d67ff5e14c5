"""Named kill points, each run on purpose (the seeded sweep of `test_elastic_faults.py` draws them at random and, on a
busy machine, reaches a hybrid's first active step or its gradient send in a few runs only): a hybrid SIGKILLed part
way through receiving its snapshot, in its first step (as a placeholder, or active), half way through sending a
gradient; a core SIGKILLed while a joiner's snapshot is on its way; a frame that stalls for less than the timeout.
After each, the surviving side's parameters and optimizer state are compared byte for byte with a run of the same
steps without the fault (docs/elastic.md "Failures")."""

from __future__ import annotations

import multiprocessing as mp
import signal
import socket
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.hybrid import HybridReplica  # noqa: E402
from libra.elastic.snapshot import state_digest  # noqa: E402
from libra.elastic.states import JoinState  # noqa: E402
from libra.elastic.wire import Kind, LinkClosed, LinkError, Message, SideChannelServer, TcpLink, free_port  # noqa: E402
from tests.elastic import elastic_fault_points as F  # noqa: E402
from tests.elastic.test_elastic_overlap import _Hybrid, _link  # noqa: E402
from tests.elastic.test_exchange_worked import _active_played, _core, _flat  # noqa: E402
from tests.limits import scaled  # noqa: E402

STEPS = 6


def _pace(core: CoreExchange, server: SideChannelServer, proc) -> None:
    """Hold the step while the hybrid is on its way in and its next message is not there yet (test steps take
    milliseconds; a real one seconds), or until the hybrid process has ended."""
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline and proc.is_alive():
        for link in server.accept_ready():
            core.admit(link)
        if not core.joining or core.join_message_waiting():
            return
        time.sleep(0.001)


def _reference(replicas: dict[int, int]) -> dict[int, tuple]:
    """The core alone, no exchange: each step its shard of ``replicas[t]`` replicas, averaged over itself."""
    from libra.elastic.grads import shard_bounds

    model, opt = F.net()
    digests = {}
    for t in sorted(replicas):
        F.grads(model, t, slice(*shard_bounds(F.BATCH, 0, replicas[t])))
        opt.step()
        digests[t] = state_digest(model, opt)
    return digests


@pytest.mark.parametrize(
    ("point", "min_placeholder_steps"),
    [("snapshot", 0), ("placeholder", 1), ("active", 0), ("mid_send:GRAD", 0)],
)
def test_a_hybrid_killed_at_each_point_leaves_the_core_bitwise_a_run_without_its_gradient(
    group, tmp_path, point, min_placeholder_steps
):
    model, opt = F.net()
    server = SideChannelServer(host="127.0.0.1", port=0)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(10),
        snapshot_timeout_s=scaled(60), server=server, min_placeholder_steps=min_placeholder_steps,
    )  # fmt: skip
    path = str(tmp_path / "witness.jsonl")
    proc = mp.get_context("spawn").Process(
        target=F.hybrid_child, args=(server.port, point, path, scaled(60)), daemon=True
    )
    proc.start()
    try:
        deadline = time.monotonic() + scaled(120)
        while not core.joining and proc.is_alive() and time.monotonic() < deadline:  # its JOIN before step 0
            for link in server.accept_ready():
                core.admit(link)
            time.sleep(0.001)
        digests, replicas = {}, {}
        for t in range(STEPS):
            _pace(core, server, proc)
            a = core.begin_step(t)
            core.reduce(t, F.grads(model, t, a.shard(F.BATCH)))
            opt.step()
            digests[t], replicas[t] = state_digest(model, opt), a.num_replicas
        proc.join(scaled(60))
    finally:
        if proc.is_alive():
            proc.kill()
        server.close()
    seen = F.witness(path)
    assert proc.exitcode == -signal.SIGKILL and seen[-1] == {"event": "fault", "point": point}, (proc.exitcode, seen)
    assert not [e for e in seen if e["event"] == "grad"]  # no gradient went out in full
    for e in seen:  # the membership the hybrid was told is the one the core used
        if e["event"] == "step":
            assert replicas[e["step"]] == e["replicas"]
    assert core.workers() == () and core.stats.failures == 1 and core.stats.accepted == 0
    assert [r.num_contributed for r in core.records] == [1] * STEPS
    assert digests == _reference(replicas)  # every byte of every step
    assert core.states.log[-1].dst == JoinState.FAILED
    core.close()


def test_a_core_killed_while_sending_a_snapshot_fails_the_join_at_once_and_the_hybrid_joins_again(group):
    """The joiner sees the core's death as a closed link in the middle of its snapshot (not a wait for its
    timeout), ends FAILED, and its next join, to a live core, leaves it bitwise that core's after every step."""
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=F.core_child, args=(free_port(), ports, 10_000, scaled(60)), daemon=True)
    proc.start()
    h_model, h_opt = F.net(warm=False)
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(60))
    try:
        port = ports.get(timeout=scaled(120))
        with pytest.raises(LinkError) as e:
            hybrid.join(TcpLink.connect("127.0.0.1", port, timeout=scaled(60)), snapshot_timeout_s=scaled(600))
        proc.join(scaled(60))
    finally:
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == -signal.SIGKILL
    assert isinstance(e.value, LinkClosed), repr(e.value)  # seen as a death, not waited out
    assert hybrid.state == JoinState.FAILED
    seen, digests = _join_and_train(group, hybrid, h_model, h_opt)
    assert len(seen) >= 2 and hybrid.state == JoinState.ROLLOUT
    assert all(d == digests[s] for s, d in seen)  # bitwise the core's after every step
    assert [s for s, _ in seen] == list(range(seen[0][0], STEPS))


def _join_and_train(group, hybrid, h_model, h_opt) -> tuple[list, dict]:
    """``hybrid`` (on a thread) joins a live core before its step 0 and trains until the core removes it after
    ``STEPS`` steps: (step, its state digest) after each of its steps, and the core's digest after each."""

    model, opt = F.net()
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30)
    )
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    seen: list = []

    def run() -> None:
        hybrid.join(_link(hybrid_end), snapshot_timeout_s=scaled(60))
        F.train_hybrid(hybrid, h_model, h_opt, after=lambda a: seen.append((a.step, state_digest(h_model, h_opt))))

    thread = _Hybrid(run)
    thread.start()
    digests = {}
    for t in range(STEPS):
        deadline = time.monotonic() + scaled(60)
        while (t == 0 or core.joining) and not core.join_message_waiting() and time.monotonic() < deadline:
            time.sleep(0.001)  # test steps take milliseconds: hold one while the joiner's next message is due
        a = core.begin_step(t)
        core.reduce(t, F.grads(model, t, a.shard(F.BATCH)))
        opt.step()
        digests[t] = state_digest(model, opt)
    core.remove("h", step=STEPS, why="test over")
    thread.join(scaled(60))
    assert thread.error is None, repr(thread.error)
    core.close()
    return seen, digests


@pytest.mark.parametrize(("start", "pause"), [(0.0, 0.1), (0.5, 0.7)])
def test_a_contribution_that_stalls_part_way_for_less_than_the_timeout_is_accepted_whole(group, start, pause):
    """Slow is not dead: the first half of a gradient frame after ``start`` timeouts, a pause of ``pause`` timeouts
    (less than one), then the rest. The core adds it (bitwise the mean with the hybrid's values) and counts no miss
    and no failure. A frame that began to arrive half way to the timeout and then paused for 0.7 of it was failed
    (its receive had only what was left of the first wait, and declared a live hybrid dead for one late reply)."""
    timeout_s = scaled(2.0)
    core = _core(group, timeout_s=timeout_s)
    h = _active_played(core)
    ours, theirs = socket.socketpair()
    blob = _flat([1.0, 3.0]).view(torch.uint8)
    grad = Message(kind=Kind.GRAD, step=1, version=1, info={"dtype": "torch.float32"}, blobs=(blob,))
    _link(ours).send(grad, timeout=scaled(5))
    ours.close()
    raw = theirs.recv(1 << 16)
    theirs.close()

    def stalled() -> None:
        time.sleep(start * timeout_s)
        h._sock.sendall(raw[: len(raw) // 2])
        time.sleep(pause * timeout_s)
        h._sock.sendall(raw[len(raw) // 2 :])

    writer = threading.Thread(target=stalled, daemon=True)
    writer.start()
    (g,) = core.reduce(1, [_flat([3.0, 5.0]).reshape(1, 2)])
    writer.join(scaled(10))
    assert (core.stats.accepted, core.stats.missed, core.stats.failures) == (1, 0, 0), core.states.log[-1].why
    assert torch.equal(g, _flat([2.0, 4.0]).reshape(1, 2))
    assert core.workers(JoinState.ACTIVE) == ("h",)
    h.close()
    core.close()
