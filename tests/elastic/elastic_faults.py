"""Fault injection: the hybrid worker is killed (SIGKILL) or frozen (SIGSTOP) at a seeded random point of its
life, many runs in one set of processes.

Processes: core ranks 0 and 1 (one gloo world, core group created once) and a *zygote* that is not in the world:
it imports torch once and forks a fresh hybrid child per run, which joins over TCP and kills itself when its
seeded fault point comes. After every run, core rank 0 checks each step it took against a teacher-forced
reference: from the state before the step it recomputes the gradients of the replicas that the step counted
(core shards, plus the hybrid's shard if its contribution was accepted), averages them the same way and applies
the same Adam step. A step whose result differs in any bit is a corrupted step (a partial, stale or misapplied
contribution would show up here).
"""

from __future__ import annotations

import os
import random
import signal

import elastic_harness as H
import elastic_scenarios as S

from tests.limits import scaled

B = H.GLOBAL_BATCH
PHASES = ("fetching", "restoring", "catchup", "placeholder", "active", "mid_send:GRAD", "leave")
STEPS = 10


def plan_run(seed: int, run: int) -> dict:
    rng = random.Random(seed * 100_003 + run)
    phase = rng.choice(PHASES)
    return {
        "run": run,
        "phase": phase,
        "occurrence": rng.randint(1, 2) if phase in ("active", "mid_send:GRAD") else 1,
        "hang": rng.random() < 0.1,  # freeze instead of dying: the core must time out
        "min_placeholder_steps": rng.randint(1, 3),
        "leave_after": rng.randint(1, 5),
    }


# -- the hybrid side: zygote and forked children ----------------------------------------------------------------


def _child(spec: dict, port: int, timeout_s: float) -> int:
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import TcpLink

    seen = {"n": 0}

    def fault(name: str) -> None:
        if name == spec["phase"]:
            seen["n"] += 1
            if seen["n"] == spec["occurrence"]:
                os.kill(os.getpid(), signal.SIGSTOP if spec["hang"] else signal.SIGKILL)

    model, opt = H.make_model(seed=spec["run"] + 77)  # wrong weights until the snapshot overwrites them
    hy = HybridReplica(worker=S.HYBRID, model=model, optimizer=opt, timeout_s=timeout_s * 20, fault=fault)
    try:
        hy.join(TcpLink.connect("127.0.0.1", port, timeout=scaled(5.0), fault=fault), snapshot_timeout_s=scaled(10.0))
        steps = 0
        while True:
            if spec["phase"] == "leave" and steps == spec["leave_after"]:
                hy.leave("fault-injection run leaves")
                return 0
            a = hy.begin_step()
            if a is None:
                return 0
            grads = H.local_grads(model, a.step, a.shard(B)) if a.mode == Mode.ACTIVE else H.zero_grads(model)
            hy.reduce(a.step, grads)
            opt.step()
            steps += 1
    except Exception:
        return 3


def zygote(requests, replies, timeout_s: float) -> dict:
    import libra.elastic.core  # noqa: F401  (import and build the extension once, before forking)
    from libra.elastic import native

    native.load()
    # Warm up every lazy import (optimizer step, snapshot restore) once, so that forked children start at once.
    from libra.elastic.snapshot import capture, restore

    model, opt = H.make_model()
    H.local_grads(model, 0, slice(0, B))
    opt.step()
    restore(capture(model, opt, version=1), *H.make_model(seed=1))
    outcomes = []
    child = None
    while True:
        msg = requests.get(timeout=scaled(120))  # core rank 0 gone: end instead of waiting forever
        if msg[0] == "stop":
            return {"outcomes": outcomes}
        if msg[0] == "run":
            child = os.fork()
            if child == 0:
                code = 3
                try:
                    code = _child(msg[1], msg[2], timeout_s)
                finally:
                    os._exit(code)
            replies.put(child)
        elif msg[0] == "end":
            pid, status = os.waitpid(child, os.WNOHANG | os.WUNTRACED)
            if pid == 0 or os.WIFSTOPPED(status):  # still running or frozen: the core has moved on; reap it
                frozen = pid != 0
                os.kill(child, signal.SIGKILL)
                _, status = os.waitpid(child, 0)
                outcome = "frozen" if frozen else "killed at end of run"
            elif os.WIFSIGNALED(status):
                outcome = f"killed ({signal.Signals(os.WTERMSIG(status)).name})"
            else:
                outcome = f"exit {os.WEXITSTATUS(status)}"
            outcomes.append(outcome)
            replies.put(outcome)


# -- the core side ----------------------------------------------------------------------------------------------


def _reference_step(before, step: int, record) -> tuple[int, ...]:
    """Digest of the state after ``step`` recomputed from the snapshot ``before`` it, for the replicas counted."""
    import torch

    from libra.elastic.grads import flatten, set_grads, shard_bounds
    from libra.elastic.snapshot import restore, state_digest

    model, opt = H.make_model(seed=3)
    restore(before, model, opt)

    def grads(index: int):
        g = H.local_grads(model, step, slice(*shard_bounds(B, index, record.num_replicas)))
        return flatten(g).clone()

    flat0 = grads(0)
    if record.num_contributed == 3:  # the hybrid's gradient was accepted (on core 1: counted, not seen)
        assert record.num_replicas == 3
        flat0 += grads(2)
    flat = flat0 + grads(1)
    flat.div_(record.num_contributed)
    with torch.no_grad():
        set_grads(model, flat)
    opt.step()
    return state_digest(model, opt)


def fault_core(rank: int, world_port: int, requests, replies, num_runs: int, seed: int, timeout_s: float) -> dict:
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.snapshot import capture
    from libra.elastic.wire import SideChannelServer

    counter = H.count_new_groups()
    H.init_gloo(rank, 2, world_port)
    core_group = dist.new_group([0, 1])
    server = SideChannelServer(host="127.0.0.1", port=0) if rank == 0 else None  # kernel-picked free port
    runs, corrupted, waits, probes = [], 0, [], {}
    for run in range(num_runs):
        spec = plan_run(seed, run)
        if rank == 0:
            requests.put(("run", spec, server.port))
            replies.get(timeout=scaled(30))
        model, opt = H.make_model()
        ex = CoreExchange(
            core_group=core_group,
            core_rank=rank,
            num_core_replicas=2,
            model=model,
            optimizer=opt,
            timeout_s=timeout_s,
            max_catchup_steps=4,
            server=server,
            min_placeholder_steps=spec["min_placeholder_steps"],
        )
        before, after = {}, {}
        for t in range(STEPS):
            S.pace(ex, cap_s=scaled(0.2))
            before[t] = capture(model, opt, version=t)
            a = ex.begin_step(t)
            ex.reduce(t, H.local_grads(model, t, a.shard(B)))
            opt.step()
            after[t] = capture(model, opt, version=t + 1).checksums
        records = list(ex.records)
        ex.close()
        bad = [r.step for r in records if _reference_step(before[r.step], r.step, r) != after[r.step]]
        corrupted += len(bad)
        waits += [r.wait_s for r in records if r.wait_s > 0]
        outcome = None
        if rank == 0:
            requests.put(("end",))
            outcome = replies.get(timeout=scaled(30))
        contributed = sum(1 for r in records if r.hybrid_contributors)
        runs.append(
            {
                **spec,
                "outcome": outcome,
                "bad_steps": bad,
                "hybrid_steps": contributed,
                "failures": ex.stats.failures,
                "states": [tr.dst.value for tr in ex.states.log],
            }
        )
        if run == 10:
            probes["warm"] = H.leak_probe()
    probes["end"] = H.leak_probe()
    if rank == 0:
        requests.put(("stop",))
        server.close()
    dist.barrier(group=core_group)
    dist.destroy_process_group()
    return {"runs": runs, "corrupted": corrupted, "waits": waits, "new_group_calls": counter[0], "probes": probes}


def tcp_cycles_core(rank: int, world_port: int, port_queue, num_cycles: int) -> dict:
    import torch.distributed as dist

    counter = H.count_new_groups()
    H.init_gloo(rank, 2, world_port)
    core_group = dist.new_group([0, 1])
    out = S.cycles(rank, core_group, "tcp", num_cycles, port_queue=port_queue)
    dist.barrier(group=core_group)
    dist.destroy_process_group()
    out["new_group_calls"] = counter[0]
    return out


def tcp_cycles_hybrid(port_queue, num_cycles: int) -> dict:
    return S.cycles(2, None, "tcp", num_cycles, port_queue=port_queue)
