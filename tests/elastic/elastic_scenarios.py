"""Scenarios run inside spawned processes by the multi-process elastic tests (importable by the children).

World layout for the torch.distributed scenarios: ranks 0 and 1 are the core replicas (core group created once
at start), rank 2 is the hybrid worker; the side channel is DistLink over the default group.
"""

from __future__ import annotations

from collections.abc import Callable

import elastic_harness as H

from tests.limits import scaled

B = H.GLOBAL_BATCH
HYBRID = "hybrid-0"


def pace(ex, cap_s: float = 10.0) -> None:
    """Harness pacing on the core: while a hybrid is on its way in, hold the step until the joiner's next message
    is there (at most ``cap_s``). A real step computes for seconds, which is what lets a join overlap training;
    these test steps take a millisecond, so without pacing the run would end before any join completes. The
    exchange itself never waits for a joining hybrid."""
    import time

    deadline = time.monotonic() + scaled(cap_s)
    while ex.joining and not ex.join_message_waiting() and time.monotonic() < deadline:
        time.sleep(0.0005)


def core_loop(
    ex, model, opt, steps, *, before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None
) -> None:
    for t in steps:
        if before is not None:
            before(t)
        pace(ex)
        a = ex.begin_step(t)
        ex.reduce(t, H.local_grads(model, t, a.shard(B)))
        opt.step()
        if after is not None:
            after(t)


def hybrid_loop(hy, model, opt, *, after: Callable[[int], None] | None = None, stop_after: int | None = None) -> int:
    """Run steps until the core detaches the hybrid (or ``stop_after`` steps); returns steps taken."""
    from libra.elastic.grads import Mode

    n = 0
    while stop_after is None or n < stop_after:
        a = hy.begin_step()
        if a is None:
            break
        grads = H.local_grads(model, a.step, a.shard(B)) if a.mode == Mode.ACTIVE else H.zero_grads(model)
        hy.reduce(a.step, grads)
        opt.step()
        n += 1
        if after is not None:
            after(a.step)
    return n


def _exchange(rank, core_group, model, opt, **kw):
    from libra.elastic.core import CoreExchange

    kw.setdefault("timeout_s", scaled(30.0))
    return CoreExchange(core_group=core_group, core_rank=rank, num_core_replicas=2, model=model, optimizer=opt, **kw)


def _hybrid(model, opt, **kw):
    from libra.elastic.hybrid import HybridReplica

    kw.setdefault("timeout_s", scaled(30.0))
    return HybridReplica(worker=HYBRID, model=model, optimizer=opt, **kw)


def _all_gather(obj):
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _exact(model, opt) -> list:
    """The state's CRC-32 over every byte (parameters and optimizer state) plus the raw bytes as hex, so that
    equality means bitwise equality."""
    from libra.elastic.snapshot import capture

    snap = capture(model, opt, version=0, backend="python")
    return [list(snap.checksums), [bytes(b.numpy()).hex() for b in snap.buckets]]


# -- scenario 1: a replica in placeholder changes nothing (bitwise) --------------------------------------------


def placeholder_bitwise(rank: int, core_group, steps: int = 8) -> dict:
    from libra.elastic.dist_link import DistLink

    reference: dict[int, list] = {}
    if rank < 2:  # the 2 core replicas alone
        model, opt = H.make_model()
        ex = _exchange(rank, core_group, model, opt)
        core_loop(ex, model, opt, range(steps), after=lambda t: reference.__setitem__(t, _exact(model, opt)))
    digests: dict[int, list] = {}
    model, opt = H.make_model()
    if rank < 2:  # the same run with a joining replica that stays in placeholder
        ex = _exchange(rank, core_group, model, opt, min_placeholder_steps=10**9)
        before = (lambda t: ex.admit(DistLink(2)) if t == 1 else None) if rank == 0 else None
        core_loop(
            ex,
            model,
            opt,
            range(steps),
            before=before,
            after=lambda t: digests.__setitem__(t, _exact(model, opt)),
        )
        records = [(r.step, r.num_replicas, list(r.hybrid_contributors)) for r in ex.records]
        states = [(tr.step, tr.dst.value) for tr in ex.states.log]
        ex.close()
    else:
        H.make_model(seed=123)  # the hybrid starts from different weights: the snapshot must overwrite them
        model, opt = H.make_model(seed=123)
        hy = _hybrid(model, opt)
        hy.join(DistLink(0))
        hybrid_loop(hy, model, opt, after=lambda t: digests.__setitem__(t, _exact(model, opt)))
        records, states = [], [(tr.step, tr.dst.value) for tr in hy.states.log]
    gathered = _all_gather({"reference": reference, "digests": digests})
    return {"gathered": gathered, "records": records, "states": states}


# -- scenario 2: 2 core + 1 active hybrid == DDP with 3 replicas; continues after the leave ----------------------


def ddp_match(rank: int, core_group, steps: int = 12, leave_at: int = 8) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from libra.elastic.dist_link import DistLink
    from libra.elastic.snapshot import capture, restore, state_digest

    after_step: dict[int, object] = {}  # step -> snapshot of the state after it (version step + 1)
    model, opt = H.make_model() if rank < 2 else H.make_model(seed=7)
    record = lambda t: after_step.__setitem__(t, capture(model, opt, version=t + 1, backend="python"))  # noqa: E731
    if rank < 2:
        ex = _exchange(rank, core_group, model, opt, min_placeholder_steps=1)

        def before(t: int) -> None:
            if rank == 0 and t == 1:
                ex.admit(DistLink(2))
            if rank == 0 and t == leave_at:
                ex.remove(HYBRID, step=t, why="plan moved hybrid-0 back to rollout")

        core_loop(ex, model, opt, range(steps), before=before, after=record)
        members = {r.step: r.num_replicas for r in ex.records}
        ex.close()
    else:
        hy = _hybrid(model, opt)
        hy.join(DistLink(0))
        hybrid_loop(hy, model, opt, after=record)
        members = {}
    members = _all_gather(members)[0]
    active = sorted(t for t, n in members.items() if n == 3)
    assert active and active == list(range(active[0], leave_at)), f"membership per step: {members}"
    first = active[0]
    # Before contributing, the hybrid must be bitwise equal to the core (state after step first-1).
    digests = _all_gather(list(after_step[first - 1].checksums))
    assert digests[0] == digests[1] == digests[2], f"hybrid not aligned before step {first}: {digests}"

    worst = {"three_replicas": 0.0, "after_leave": 0.0}
    ref_model, ref_opt = H.make_model(seed=99)
    restore(after_step[first - 1], ref_model, ref_opt)
    ddp = DDP(ref_model)  # plain DDP over the 3-rank default group
    for t in active:
        x, y = H.batch(t)
        sl = slice(*__import__("libra.elastic.grads", fromlist=["x"]).shard_bounds(B, rank, 3))
        ref_opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ddp(x[sl]), y[sl]).backward()
        ref_opt.step()
        got = H.flat_state(*_restored(after_step[t]))
        want = H.flat_state(ref_model, ref_opt)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=lambda m, t=t: f"step {t}: {m}")
        worst["three_replicas"] = max(worst["three_replicas"], float((got - want).abs().max()))
    if rank < 2:  # after the leave: the 2 core replicas against DDP over the core group, free-running
        two_model, two_opt = H.make_model(seed=98)
        restore(capture(ref_model, ref_opt, version=0, backend="python"), two_model, two_opt)
        ddp2 = DDP(two_model, process_group=core_group)
        for t in range(leave_at, steps):
            assert members[t] == 2, members
            x, y = H.batch(t)
            sl = slice(rank * B // 2, (rank + 1) * B // 2)
            two_opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp2(x[sl]), y[sl]).backward()
            two_opt.step()
            got = H.flat_state(*_restored(after_step[t]))
            want = H.flat_state(two_model, two_opt)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=lambda m, t=t: f"step {t}: {m}")
            worst["after_leave"] = max(worst["after_leave"], float((got - want).abs().max()))
        del ddp2
    del ddp
    dist.barrier()
    return {
        "members": members,
        "first_active": first,
        "worst_abs_diff": worst,
        "digest": list(state_digest(model, opt)),
    }


def _restored(snapshot):
    from libra.elastic.snapshot import restore

    model, opt = H.make_model(seed=5)
    restore(snapshot, model, opt, backend="python")
    return model, opt


# -- scenario 3: join/leave cycles over the fixed world --------------------------------------------------------


def cycles(rank: int, core_group, transport: str, num_cycles: int, port_queue=None) -> dict:
    """Rank 0 (with rank 1 in lockstep) runs steps; the hybrid joins, becomes active for one step, is removed, and
    joins again, ``num_cycles`` times. Leak probes are taken after the warm-up cycles and at the end."""
    import torch
    import torch.distributed as dist

    from libra.elastic.dist_link import DistLink
    from libra.elastic.states import JoinState
    from libra.elastic.wire import SideChannelServer

    warmup = min(50, num_cycles // 4)
    model, opt = H.make_model()
    probes = {}
    if rank < 2:
        server = None
        if transport == "tcp" and rank == 0:
            server = SideChannelServer(host="127.0.0.1", port=0)  # the kernel picks a free port, atomically
            port_queue.put(server.port)
        ex = _exchange(rank, core_group, model, opt, server=server, max_catchup_steps=10**6)
        done, t, flag, stalled = 0, 0, torch.ones(1, dtype=torch.int64), False
        if rank == 0 and transport == "dist":
            ex.admit(DistLink(2))
        while True:
            if rank == 0 and ex.records and ex.records[-1].hybrid_contributors:
                ex.remove(HYBRID, step=t, why="cycle")
                done += 1
                if done == warmup:
                    probes["warm"] = H.leak_probe()
                if transport == "dist" and done < num_cycles:
                    ex.admit(DistLink(2))
            stalled = stalled or t > 50 * num_cycles + 1000  # the hybrid stopped coming back: end, and fail
            flag[0] = 1 if (rank == 0 and done < num_cycles and not stalled) else 0  # rank 0 decides; rank 1 follows
            dist.all_reduce(flag, group=core_group)
            if int(flag[0]) == 0:
                break
            pace(ex)
            a = ex.begin_step(t)
            ex.reduce(t, H.local_grads(model, t, a.shard(B)))
            opt.step()
            t += 1
        assert ex.workers() == (), ex.workers()
        failures = ex.stats.failures
        states = ex.states
        ex.close()
        if server is not None:
            server.close()
        probes["end"] = H.leak_probe()
        return {
            "stalled": stalled,
            "cycles": done,
            "steps": t,
            "failures": failures,
            "probes": probes,
            "final_state": states.state(HYBRID).value if rank == 0 else None,
        }
    hy = _hybrid(model, opt)
    port = port_queue.get(timeout=scaled(120)) if transport == "tcp" else None
    for c in range(num_cycles):
        link = _connect_with_retry(port) if transport == "tcp" else DistLink(0)
        hy.join(link)
        hybrid_loop(hy, model, opt)
        assert hy.state == JoinState.ROLLOUT, hy.state
        if c + 1 == warmup:
            probes["warm"] = H.leak_probe()
    probes["end"] = H.leak_probe()
    return {"cycles": num_cycles, "probes": probes}


def _connect_with_retry(port: int, deadline_s: float = 60.0):
    """Connect to the core's side-channel server, retrying while it is not listening yet (process start-up)."""
    import time

    from libra.elastic.wire import LinkError, TcpLink

    deadline = time.monotonic() + scaled(deadline_s)
    while True:
        try:
            return TcpLink.connect("127.0.0.1", port, timeout=scaled(30.0))
        except LinkError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- process entry points ---------------------------------------------------------------------------------------


def dist_world(rank: int, port: int, num_cycles: int) -> dict:
    """All torch.distributed scenarios in one 3-rank world; counts every new_group call."""
    import torch.distributed as dist

    counter = H.count_new_groups()
    H.init_gloo(rank, 3, port)
    core_group = dist.new_group([0, 1])  # the core's process group: created once, here, and never again
    out = {
        "placeholder": placeholder_bitwise(rank, core_group),
        "ddp": ddp_match(rank, core_group),
        "cycles": cycles(rank, core_group, "dist", num_cycles),
    }
    dist.barrier()
    out["new_group_calls"] = counter[0]
    dist.destroy_process_group()
    return out


def _model_parallel_core(rank: int, port: int, **options):
    """Coordinate ``rank`` of a core replica with two model-parallel ranks (this process in a gloo world of two):
    its CoreExchange over a data-parallel group of itself, with both ranks as its model-parallel group, and its
    model (a shard of its own: the weights offset by ``rank``) and Adam."""
    import torch
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from tests.elastic.test_elastic_overlap import _small

    H.init_gloo(rank, 2, port)
    dp = [dist.new_group([0]), dist.new_group([1])][rank]
    mp = dist.new_group([0, 1])
    model, opt = _small()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)
    core = CoreExchange(
        core_group=dp,
        core_rank=0,
        num_core_replicas=1,
        model=model,
        optimizer=opt,
        timeout_s=scaled(30),
        model_parallel_group=mp,
        **options,
    )
    return core, model, opt


def model_parallel_promotion(rank: int, port: int) -> dict:
    """Rank ``rank`` is coordinate ``rank`` of one core replica with two model-parallel ranks (TP = 2, DP = 1): a
    CoreExchange over a data-parallel group of itself, with both ranks as its model-parallel group, paired with
    that coordinate's rank of one hybrid replica ``h`` (a thread here, over a socketpair). Coordinate 0's hybrid
    rank attaches at step 1, coordinate 1's holds its ATTACH until step 3; coordinate 1's rank sends a stale
    gradient at step 4 (which its core skips); before step 5 coordinate 0 alone detaches ``h``. Returns what each
    side saw."""
    import socket
    import threading

    import attrs
    import torch.distributed as dist

    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import Kind, Message
    from tests.elastic.test_elastic_overlap import (
        _core_steps,
        _Hybrid,
        _link,
        _small,
        _train_hybrid,
        _until_join_message,
    )

    core, model, opt = _model_parallel_core(rank, port)
    h_model, h_opt = _small()
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    core_end, hybrid_end = socket.socketpair()
    core.admit(_link(core_end))
    release, joined, seen = threading.Event(), threading.Event(), []
    link = _link(hybrid_end, release)
    if rank == 1:
        send = link.send

        def stale_at_step_4(msg: Message, *, timeout: float) -> None:
            if msg.kind == Kind.GRAD and msg.step == 4:
                msg = attrs.evolve(msg, version=msg.version - 1)
            send(msg, timeout=timeout)

        link.send = stale_at_step_4  # type: ignore[method-assign]

    def run_hybrid() -> None:
        hybrid.join(link, snapshot_timeout_s=scaled(60))
        joined.set()
        _train_hybrid(hybrid, h_model, h_opt, seen)

    def before(t: int) -> None:
        if t == (1 if rank == 0 else 3):
            release.set()
            assert joined.wait(scaled(60))
            _until_join_message(core, thread)
        if t == 5 and rank == 0:
            core.remove("h", step=5, why="released at coordinate 0 only")

    thread = _Hybrid(run_hybrid)
    thread.start()
    _until_join_message(core, thread)
    digests: dict = {}
    _core_steps(core, model, opt, range(7), digests, before)
    thread.join(scaled(60))
    out = {
        "seen": [[s, m.value, list(d)] for s, m, d in seen],
        "digests": {str(t): list(d) for t, d in digests.items()},
        "counted": [[r.step, r.num_contributed] for r in core.records],
        "hybrid_left": not thread.is_alive() and thread.error is None,
        "skipped": core.stats.skipped,
        "transitions": [[t.worker, t.event.value, t.step] for t in core.states.log],
        "whys": [t.why for t in core.states.log],
    }
    core.close()
    dist.destroy_process_group()
    return out


def model_parallel_rank_missing(rank: int, port: int) -> dict:
    """As `model_parallel_promotion`, but only coordinate 0 has a rank of the hybrid replica ``h`` (coordinate 1's
    never joins) and ``max_catchup_steps=3``: the rank that did join waits as a placeholder, then is detached."""
    import socket
    import threading

    import torch.distributed as dist

    from libra.elastic.hybrid import HybridReplica
    from tests.elastic.test_elastic_overlap import (
        _core_steps,
        _Hybrid,
        _link,
        _small,
        _train_hybrid,
        _until_join_message,
    )

    core, model, opt = _model_parallel_core(rank, port, max_catchup_steps=3)
    seen: list = []
    thread = None
    if rank == 0:
        h_model, h_opt = _small()
        hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
        core_end, hybrid_end = socket.socketpair()
        core.admit(_link(core_end))
        joined = threading.Event()

        def run_hybrid() -> None:
            hybrid.join(_link(hybrid_end), snapshot_timeout_s=scaled(60))
            joined.set()
            _train_hybrid(hybrid, h_model, h_opt, seen)

        thread = _Hybrid(run_hybrid)
        thread.start()

    def before(t: int) -> None:
        if t == 0 and thread is not None:  # boundary 0 reads the JOIN and sends the snapshot
            _until_join_message(core, thread)
        if t == 1 and thread is not None:  # restored and attached before boundary 1 reads the ATTACH
            assert joined.wait(scaled(60))
            _until_join_message(core, thread)

    _core_steps(core, model, opt, range(8), {}, before)
    if thread is not None:
        thread.join(scaled(60))
    out = {
        "seen": [[s, m.value] for s, m, _ in seen],
        "counted": [[r.step, r.num_contributed] for r in core.records],
        "transitions": [[t.worker, t.event.value, t.step, t.why] for t in core.states.log],
        "hybrid_left": thread is None or (not thread.is_alive() and thread.error is None),
    }
    core.close()
    dist.destroy_process_group()
    return out
