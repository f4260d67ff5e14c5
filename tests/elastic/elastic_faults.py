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

import contextlib
import faulthandler
import json
import os
import queue
import random
import shutil
import signal
import tempfile
import time

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


class Diary:
    """One line per request and reply, with the system-wide monotonic time, from the zygote and core rank 0 into one
    file (appends of one short line each, so their lines do not mix), plus, from the zygote, a dump of every
    thread's stack on SIGUSR1. When core rank 0 waits in vain for a reply, it signals the zygote and puts this file
    in its error: a lost message, a slow start and a stuck zygote read differently."""

    def __init__(self, path: str, who: str, *, dump_on_signal: bool = False) -> None:
        self._time, self._who = time.monotonic, who
        self.path = path
        self._file = open(path, "a", buffering=1)  # noqa: SIM115  (open for the process's whole life)
        if dump_on_signal:
            faulthandler.register(signal.SIGUSR1, file=self._file, all_threads=True)

    def __call__(self, what: str) -> None:
        self._file.write(f"{self._time():.3f} {self._who}: {what}\n")


def await_reply(replies, timeout_s: float, *, diary: Diary, zygote_pid: int | None, waiting_for: str):
    """The zygote's next reply; if none comes in `timeout_s`, dump the zygote's stacks into the diary and raise
    with the diary, which says whether the zygote read the request and what it was doing."""
    try:
        reply = replies.get(timeout=timeout_s)
    except queue.Empty:
        diary(f"no reply in {timeout_s:.0f} s for {waiting_for}")
        if zygote_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(zygote_pid, signal.SIGUSR1)
                time.sleep(2.0)
        try:
            with open(diary.path) as f:
                text = f.read()[-8000:]
        except OSError as exc:
            text = f"(no diary: {exc})"
        raise AssertionError(
            f"no reply from the zygote in {timeout_s:.0f} s while waiting for {waiting_for}; the diary:\n{text}"
        ) from None
    diary(f"got {waiting_for}")
    return reply


def end_of_run(child: int, witness: str) -> str:
    """What became of a run's child, which is then reaped. A child still running when its run ends is frozen
    (SIGSTOP) before its witness is read, so that the witness is final when read: on a loaded machine the end of a
    run can come just as the child writes its fault line, whose next instruction signals itself, and the outcome
    must say what the fault did, not "killed at end of run" (reading first and killing after lost that race)."""
    pid, status = os.waitpid(child, os.WNOHANG | os.WUNTRACED)
    if pid == 0:
        os.kill(child, signal.SIGSTOP)
        _, status = os.waitpid(child, os.WUNTRACED)  # stopped, or ended on its own first
        if os.WIFSTOPPED(status):
            fired = [r["signal"] for r in read_witness(witness) if r["event"] == "fault"]
            if not fired:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                return "killed at end of run"
            if fired[0] == "SIGKILL":  # frozen between its fault line and its own SIGKILL: let that land
                os.kill(child, signal.SIGCONT)
                _, status = os.waitpid(child, 0)
            # (a SIGSTOP fault: it froze itself, or was frozen by us one instruction before it would have)
    if os.WIFSTOPPED(status):  # frozen by its fault: the core has moved on; reap it
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        return "frozen"
    if os.WIFSIGNALED(status):
        return f"killed ({signal.Signals(os.WTERMSIG(status)).name})"
    return f"exit {os.WEXITSTATUS(status)}"


def zygote(requests, replies, timeout_s: float, diary_path: str) -> dict:
    log = Diary(diary_path, "zygote", dump_on_signal=True)
    log("started")
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
    replies.put(("ready", os.getpid()))
    log("ready")
    while True:
        msg = requests.get(timeout=scaled(120))  # core rank 0 gone: end instead of waiting forever
        log(f"read {msg[0]} {msg[1]['run'] if msg[0] == 'run' else ''}")
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
            log(f"forked {child}")
        elif msg[0] == "end":
            outcome = end_of_run(child, run_spec["witness"])
            outcomes.append(outcome)
            replies.put(outcome)
            log(f"reaped: {outcome}")


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


def fault_core(
    rank: int, world_port: int, requests, replies, num_runs: int, seed: int, timeout_s: float, diary_path: str
) -> dict:
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.wire import SideChannelServer

    counter = H.count_new_groups()
    H.init_gloo(rank, 2, world_port)
    core_group = dist.new_group([0, 1])
    server = SideChannelServer(host="127.0.0.1", port=0) if rank == 0 else None  # kernel-picked free port
    witness_dir = tempfile.mkdtemp(prefix="libra-faults-") if rank == 0 else None
    runs, corrupted, compared, waits, probes = [], 0, 0, [], {}
    zygote_pid, diary = None, None
    if rank == 0:  # the zygote imports torch and warms up before it reads a request
        diary = Diary(diary_path, "core 0")
        _, zygote_pid = await_reply(replies, scaled(120), diary=diary, zygote_pid=None, waiting_for="ready")
    for run in range(num_runs):
        spec = plan_run(seed, run)
        if rank == 0:
            spec["witness"] = os.path.join(witness_dir, f"run{run}.jsonl")
            requests.put(("run", spec, server.port))
            diary(f"sent run {run}")
            await_reply(replies, scaled(30), diary=diary, zygote_pid=zygote_pid, waiting_for=f"run {run}")
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
            diary(f"sent end of run {run}")
            # the child is reaped: its witness is complete
            outcome = await_reply(
                replies, scaled(30), diary=diary, zygote_pid=zygote_pid, waiting_for=f"end of run {run}"
            )
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
