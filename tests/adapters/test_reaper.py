"""The engine reaper: what a process started is stopped when that process is SIGKILLed, and only then.

Each test runs an owner process (a fresh interpreter) that starts what it watches, prints the process ids and
waits; the test kills the owner the way the OOM killer would (SIGKILL: nothing runs in it afterwards)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from libra.adapters.reaper import descendants, reap, start_time
from tests.limits import scaled

pytestmark = pytest.mark.timeout(scaled(300))

# starts what it watches, prints {"watched": [...], "others": [...]} and waits to be killed or told to close
OWNER = """
import json, os, subprocess, sys, time
from libra.adapters.reaper import EngineReaper

def main():
    reaper = EngineReaper(grace_s={grace})
    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
    )
    watched, others = [], []
    for kind in {kinds!r}:
        if kind == "sleep":
            proc = subprocess.Popen(["sleep", "600"])
        elif kind == "ignores-term":
            proc = subprocess.Popen([sys.executable, "-c", ignores_term], stdout=subprocess.PIPE)
            proc.stdout.readline()  # its handler is set
        elif kind == "parent":  # a watched process with a child of its own (an engine core and its worker)
            proc = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
        watched.append(proc.pid)
        reaper.watch(proc.pid)
    if {fork}:  # a forked child holds the watcher's pipe open after the owner dies
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        others.append(child)
    others.append(reaper.pid)
    if {close}:
        reaper.close()
    print(json.dumps({{"watched": watched, "others": others}}), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    main()
"""


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after waiting up to `timeout_s` for all of them to exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def start_owner(tmp_path: Path, *, kinds: tuple[str, ...], grace: float = 1.0, fork: bool = False, close: bool = False):
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(OWNER).format(grace=grace, kinds=kinds, fork=fork, close=close))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, f"the owner exited with {owner.wait()} before printing its processes"
    pids = json.loads(line)
    return owner, pids["watched"], pids["others"]


def test_a_sigkilled_owners_processes_and_their_children_are_stopped(tmp_path):
    owner, watched, others = start_owner(tmp_path, kinds=("sleep", "parent"))
    grandchildren: list[int] = []
    try:
        deadline = time.monotonic() + scaled(30)
        while not grandchildren and time.monotonic() < deadline:  # `sh` forks its sleep when it gets to run
            grandchildren = sorted(descendants(watched))
            time.sleep(0.05)
        assert len(grandchildren) == 1 and alive(grandchildren[0])  # the sleep under `sh`
        owner.kill()
        owner.wait()
        assert wait_gone([*watched, *grandchildren, *others], scaled(30)) == []
    finally:
        kill_all([*watched, *grandchildren, *others])


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    owner, watched, others = start_owner(tmp_path, kinds=("ignores-term",), grace=1.0)
    try:
        owner.kill()
        owner.wait()
        assert wait_gone(watched, scaled(30)) == []
    finally:
        kill_all([*watched, *others])


def test_the_owners_death_is_seen_while_a_forked_child_holds_the_pipe(tmp_path):
    owner, watched, others = start_owner(tmp_path, kinds=("sleep",), fork=True)
    forked, watcher = others
    try:
        owner.kill()
        owner.wait()
        assert wait_gone([*watched, watcher], scaled(30)) == []
        assert alive(forked)  # not watched: left alone
    finally:
        kill_all([*watched, *others])


def test_a_clean_close_leaves_the_processes_to_the_owner(tmp_path):
    owner, watched, others = start_owner(tmp_path, kinds=("sleep",), close=True)
    try:
        owner.kill()
        owner.wait()
        assert wait_gone(others, scaled(30)) == []  # the watcher exited on close
        time.sleep(2.0)  # more than the grace: a watcher that reaped anyway would have done it by now
        assert all(alive(p) for p in watched)
    finally:
        kill_all(watched)


def test_a_reused_process_id_is_left_alone():
    proc = subprocess.Popen(["sleep", "600"])
    try:
        started = start_time(proc.pid)
        assert started is not None
        assert reap({proc.pid: started + 1}, grace_s=0.1) == []  # another process that had this id
        assert proc.poll() is None
        assert reap({proc.pid: started}, grace_s=5.0) == [proc.pid]
        assert proc.wait(timeout=scaled(10)) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_start_time_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "42").mkdir()
    rest = " ".join(str(i) for i in range(3, 53))  # field k holds k: the start time (22) and the parent (4)
    (tmp_path / "42" / "stat").write_text(f"42 (a) b (c) {rest}\n")
    assert start_time(42, proc=tmp_path) == 22
    assert start_time(43, proc=tmp_path) is None


VLLM_OWNER = """
import json, os, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

def main():
    from libra.adapters.types import InstanceSpec
    from libra.adapters.vllm_backend import VLLMRolloutBackend

    backend = VLLMRolloutBackend(model={model!r}, engine_tp="one", sleep_mode="pause")
    backend.start_instance(InstanceSpec(name="one", max_num_seqs=2, max_model_len=256))
    print("PIDS", json.dumps(backend.engine_pids("one")), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_a_sigkilled_vllm_backend_leaves_no_engine_behind(tmp_path, tiny_model_dir):
    """`libra run` killed by SIGKILL left its engine-core processes (and their workers) running, holding memory."""
    pytest.importorskip("vllm")
    script = tmp_path / "vllm_owner.py"
    script.write_text(textwrap.dedent(VLLM_OWNER).format(model=tiny_model_dir))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    engines: list[int] = []
    try:
        assert owner.stdout is not None
        for line in owner.stdout:  # vLLM logs to standard output too
            if line.startswith("PIDS "):
                engines = json.loads(line[5:])
                break
        else:
            raise AssertionError(f"the owner exited with {owner.wait()} before its engine started")
        workers = sorted(descendants(engines))
        assert engines and all(alive(p) for p in [*engines, *workers])
        owner.kill()
        owner.wait()
        assert wait_gone([*engines, *workers], scaled(120)) == []
    finally:
        owner.kill()
        kill_all([*engines, *descendants(engines)])


class _Core:
    """An engine core client's shutdown as vLLM 0.32 has it (`timeout`) or as an older one (none)."""

    def __init__(self, takes_timeout: bool) -> None:
        self.calls: list[float | None] = []
        self.takes_timeout = takes_timeout

    def shutdown(self, *args: float, **kwargs: float) -> None:
        if kwargs and not self.takes_timeout:
            raise TypeError("shutdown() got an unexpected keyword argument 'timeout'")
        self.calls.append(kwargs.get("timeout"))


@pytest.mark.parametrize("takes_timeout", [True, False])
def test_an_engine_is_stopped_after_a_short_grace_not_vllms_five_seconds(takes_timeout) -> None:
    """vLLM waits 5 s by default for its engine core, whose CPU worker outlasts that in its last garbage collection:
    every stop of an engine took 5 s and ended in a kill anyway."""
    from libra.adapters.vllm_engine import SHUTDOWN_GRACE_S, shutdown

    core = _Core(takes_timeout)
    shutdown(type("Engine", (), {"engine_core": core})())
    assert core.calls == ([SHUTDOWN_GRACE_S] if takes_timeout else [None])
    assert SHUTDOWN_GRACE_S < 5.0
