"""Fault injection: the hybrid worker is killed (SIGKILL) or frozen (SIGSTOP) at a seeded random point of its
life, many runs in one set of processes.

Processes: core ranks 0 and 1 (one gloo world, core group created once) and a *zygote* that is not in the world:
it imports torch once and forks a fresh hybrid child per run, which joins over TCP and kills itself when its
seeded fault point comes. The child keeps a *witness* file (one JSON line per event, written unbuffered so that
it survives the kill): every STEP assignment it received, every gradient it finished sending, the fault it
injected, and any exception it ended with (type and message). After every run, both core ranks check each step
they took against a teacher-forced reference built from the test's own schedule, not from the core's record:
from a copy of the state before the step, recompute the gradients of the core shards plus the hybrid's shard if
the witness shows the hybrid sent that step's gradient in full, average them the same way, apply the same Adam
step, and compare every byte of parameters and optimizer state. A step that differs in any byte is a corrupted
step (a partial, stale or misapplied contribution, or a wrong decision about who contributed, shows up here).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile

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


class Witness:
    """Append-only JSON lines, one ``os.write`` each (no buffer to lose when the process is killed)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, event: str, **fields) -> None:
        os.write(self._fd, (json.dumps({"event": event, **fields}) + "\n").encode())


def read_witness(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


class _WitnessLink:
    """The hybrid's link, noting each gradient once it is sent in full (a kill half way leaves no note)."""

    def __init__(self, link, witness: Witness) -> None:
        self._link, self._witness = link, witness

    def send(self, msg, *, timeout: float) -> None:
        from libra.elastic.wire import Kind

        self._link.send(msg, timeout=timeout)
        if msg.kind == Kind.GRAD:
            self._witness.write("grad", step=msg.step, version=msg.version)

    def send_async(self, msg, *, timeout: float):
        return self._link.send_async(msg, timeout=timeout)

    def poll(self) -> bool:
        return self._link.poll()

    def recv(self, *, timeout: float):
        return self._link.recv(timeout=timeout)

    def close(self) -> None:
        self._link.close()


def _child(spec: dict, port: int, timeout_s: float) -> int:
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import TcpLink

    witness = Witness(spec["witness"])
    seen = {"n": 0}

    def fault(name: str) -> None:
        if name == spec["phase"]:
            seen["n"] += 1
            if seen["n"] == spec["occurrence"]:
                sig = signal.SIGSTOP if spec["hang"] else signal.SIGKILL
                witness.write("fault", phase=name, signal=sig.name)
                os.kill(os.getpid(), sig)

    model, opt = H.make_model(seed=spec["run"] + 77)  # wrong weights until the snapshot overwrites them
    hy = HybridReplica(worker=S.HYBRID, model=model, optimizer=opt, timeout_s=timeout_s * 20, fault=fault)
    try:
        link = TcpLink.connect("127.0.0.1", port, timeout=scaled(5.0), fault=fault)
        hy.join(_WitnessLink(link, witness), snapshot_timeout_s=scaled(10.0))
        steps = 0
        while True:
            if spec["phase"] == "leave" and steps == spec["leave_after"]:
                hy.leave("fault-injection run leaves")
                witness.write("exit", why="left")
                return 0
            a = hy.begin_step()
            if a is None:
                witness.write("exit", why="detached by the core")
                return 0
            witness.write("step", step=a.step, mode=a.mode.value, index=a.replica_index, replicas=a.num_replicas)
            grads = H.local_grads(model, a.step, a.shard(B)) if a.mode == Mode.ACTIVE else H.zero_grads(model)
            hy.reduce(a.step, grads)
            opt.step()
            steps += 1
    except Exception as exc:  # recorded with its cause, counted by the test: never swallowed silently
        witness.write("error", type=type(exc).__name__, message=str(exc))
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
    run_spec: dict = {}
    while True:
        msg = requests.get(timeout=scaled(120))  # core rank 0 gone: end instead of waiting forever
        if msg[0] == "stop":
            return {"outcomes": outcomes}
        if msg[0] == "run":
            run_spec = msg[1]
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
            if pid == 0 and any(r["event"] == "fault" for r in read_witness(run_spec["witness"])):
                # The child wrote its fault line and its next instruction signals itself; on a loaded machine the
                # end of the run can come in between. Wait for that signal to land (SIGKILL: it dies; SIGSTOP: it
                # stops), so the outcome says what the fault did rather than "killed at end of run".
                pid, status = os.waitpid(child, os.WUNTRACED)
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


def _copy_state(model, opt) -> dict:
    import copy

    return {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict())}


def _reference_bytes(before: dict, step: int, num_replicas: int, hybrid_index: int | None) -> bytes:
    """The state after ``step`` recomputed from a copy of the state ``before`` it: the two core shards, plus the
    hybrid's shard when ``hybrid_index`` is given (the witness saw it send that step's gradient in full)."""
    import torch

    from libra.elastic.grads import flatten, set_grads, shard_bounds

    model, opt = H.make_model(seed=3)
    model.load_state_dict(before["model"])
    opt.load_state_dict(before["opt"])

    def grads(index: int):
        g = H.local_grads(model, step, slice(*shard_bounds(B, index, num_replicas)))
        return flatten(g).clone()

    flat0 = grads(0)
    if hybrid_index is not None:  # core 0 adds the hybrid's gradient before the all-reduce, as the core does
        flat0 += grads(hybrid_index)
    flat = flat0 + grads(1)
    flat.div_(3 if hybrid_index is not None else 2)
    with torch.no_grad():
        set_grads(model, flat)
    opt.step()
    return H.state_bytes(model, opt)


def schedule_of(witness: list[dict]) -> dict[int, int]:
    """step -> the hybrid's replica index, for the steps whose gradient the hybrid sent in full, as ACTIVE, for
    the step it was assigned (from the witness alone)."""
    assigned = {r["step"]: r for r in witness if r["event"] == "step" and r["mode"] == "active"}
    return {
        r["step"]: assigned[r["step"]]["index"]
        for r in witness
        if r["event"] == "grad" and r["step"] == r["version"] and r["step"] in assigned
    }


def fault_core(rank: int, world_port: int, requests, replies, num_runs: int, seed: int, timeout_s: float) -> dict:
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.wire import SideChannelServer

    counter = H.count_new_groups()
    H.init_gloo(rank, 2, world_port)
    core_group = dist.new_group([0, 1])
    server = SideChannelServer(host="127.0.0.1", port=0) if rank == 0 else None  # kernel-picked free port
    witness_dir = tempfile.mkdtemp(prefix="libra-faults-") if rank == 0 else None
    runs, corrupted, compared, waits, probes = [], 0, 0, [], {}
    for run in range(num_runs):
        spec = plan_run(seed, run)
        if rank == 0:
            spec["witness"] = os.path.join(witness_dir, f"run{run}.jsonl")
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
        before, after, replicas = {}, {}, {}
        for t in range(STEPS):
            S.pace(ex, cap_s=scaled(0.2))
            before[t] = _copy_state(model, opt)
            a = ex.begin_step(t)
            replicas[t] = a.num_replicas  # the membership this replica computed its shard with
            ex.reduce(t, H.local_grads(model, t, a.shard(B)))
            opt.step()
            after[t] = H.state_bytes(model, opt)
        records = {r.step: r for r in ex.records}
        ex.close()
        outcome, witness = None, []
        if rank == 0:
            requests.put(("end",))
            outcome = replies.get(timeout=scaled(30))  # the child is reaped: its witness is complete
            witness = read_witness(spec["witness"])
        shared = [outcome, witness]
        dist.broadcast_object_list(shared, src=0, group=core_group)
        outcome, witness = shared
        schedule = schedule_of(witness)
        bad, decisions = [], []
        for t in range(STEPS):
            expected = 3 if t in schedule else 2
            if records[t].num_contributed != expected:
                decisions.append({"step": t, "core_counted": records[t].num_contributed, "schedule": expected})
            if _reference_bytes(before[t], t, replicas[t], schedule.get(t)) != after[t]:
                bad.append(t)
        compared += STEPS
        corrupted += len(bad)
        waits += [r.wait_s for r in records.values() if r.wait_s > 0]
        fired = [r for r in witness if r["event"] == "fault"]
        runs.append(
            {
                **spec,
                "outcome": outcome,
                "bad_steps": bad,
                "decision_mismatches": decisions,
                "hybrid_steps": len(schedule),
                "fault": fired[0] if fired else None,
                "hybrid_errors": [f"{r['type']}: {r['message']}" for r in witness if r["event"] == "error"],
                "failures": ex.stats.failures,
                "missed": ex.stats.missed,
                "states": [tr.dst.value for tr in ex.states.log],
                "core_fail_causes": [tr.why for tr in ex.states.log if tr.dst.value == "failed"],
            }
        )
        if run == 10:
            probes["warm"] = H.leak_probe()
    probes["end"] = H.leak_probe()
    if rank == 0:
        requests.put(("stop",))
        server.close()
        shutil.rmtree(witness_dir, ignore_errors=True)
    dist.barrier(group=core_group)
    dist.destroy_process_group()
    return {
        "runs": runs,
        "corrupted": corrupted,
        "compared_steps": compared,
        "waits": waits,
        "new_group_calls": counter[0],
        "probes": probes,
    }


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
