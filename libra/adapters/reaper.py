"""Stop the engine processes a process started when that process dies without stopping them.

vLLM's engine-core processes (and their workers) outlive a parent killed by SIGKILL, the OOM killer or a crash in
native code: nothing runs in the parent to shut them down, and they hold their memory until someone finds them.
`EngineReaper` starts one small watcher process per owner (`python -m libra.adapters.reaper`) in a session of its
own, and tells it each engine's process id as the engine starts. The watcher reads its standard input; when the
owner closes it cleanly (`close()`), it exits. When the input ends without that, or the owner is no longer its
parent, the owner died: the watcher sends SIGTERM to every watched process that is still the one it was told of
(same start time, so a reused id is left alone) and to their descendants, waits `grace_s` for them to exit
(vLLM's engine core shuts its workers down on SIGTERM), then sends SIGKILL to what is left.

Linux only where it matters: start times and descendants come from `/proc`; without `/proc` a watched process is
matched by its id alone and only the watched processes themselves are signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

#: What the owner writes when it closes cleanly: the watcher exits without signalling anything.
_BYE = "bye"


def _stat(pid: int, proc: Path) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (field 3 first), None if it cannot be read."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself hold spaces and parentheses
    return stat[stat.rfind(")") + 2 :].split()


def _field(fields: list[str] | None, index: int) -> int | None:
    try:
        return None if fields is None else int(fields[index])
    except (IndexError, ValueError):
        return None


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat`, field 22), None if unknown."""
    return _field(_stat(pid, proc), 19)


def _parent_of(pid: int, proc: Path) -> int | None:
    return _field(_stat(pid, proc), 1)


def descendants(pids: Iterable[int], proc: Path = Path("/proc")) -> set[int]:
    """Every living descendant of `pids` (children, their children, ...), from `/proc`; empty without it."""
    try:
        entries = [int(e.name) for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return set()
    children: dict[int, list[int]] = {}
    for pid in entries:
        parent = _parent_of(pid, proc)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _same(pid: int, started: int | None) -> bool:
    """Whether `pid` is still the process that started at `started` (any living `pid` when unknown). A zombie (it
    exited; its new parent has not collected it yet) is not."""
    fields = _stat(pid, Path("/proc"))
    if fields is None:  # gone, or no /proc to read: the kernel says whether the id lives
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return started is None
    return fields[:1] != ["Z"] and (started is None or _field(fields, 19) == started)


def reap(watched: dict[int, int | None], grace_s: float) -> list[int]:
    """SIGTERM the watched processes that are still themselves and their descendants, wait up to `grace_s`, SIGKILL
    the rest. Returns the process ids signalled."""
    alive = [pid for pid, started in watched.items() if _same(pid, started)]
    targets = {pid: start_time(pid) for pid in [*alive, *sorted(descendants(alive))]}
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_same(pid, started) for pid, started in targets.items()):
        time.sleep(0.1)
    for pid, started in targets.items():
        if _same(pid, started):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return list(targets)


def watch(owner: int, lines: IO[str], grace_s: float, poll_s: float = 0.5) -> list[int]:
    """The watcher's loop: read `watch PID START`, `forget PID` and `bye` lines from `lines` until the owner says
    bye (returns []) or dies (reaps what it was told of and returns the ids signalled)."""
    watched: dict[int, int | None] = {}
    buffered = ""
    fd = lines.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], poll_s)
        if not ready:
            if os.getppid() != owner:  # the owner died; its pipe may still be held open by a forked child
                return reap(watched, grace_s)
            continue
        chunk = os.read(fd, 4096).decode("ascii", "replace")
        if not chunk:  # end of input without a bye: the owner died
            return reap(watched, grace_s)
        buffered += chunk
        *complete, buffered = buffered.split("\n")
        for line in complete:
            word, *args = line.split() or [""]
            if word == _BYE:
                return []
            if word == "watch":
                watched[int(args[0])] = None if args[1] == "-" else int(args[1])
            elif word == "forget":
                watched.pop(int(args[0]), None)


class EngineReaper:
    """The owner's side: `watch(pid)` as an engine starts, `forget(pid)` once the owner stopped it itself, `close()`
    when the owner shuts down cleanly. The watcher process starts on the first `watch`."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The watcher's process id, None before the first `watch` and after `close`."""
        return None if self._proc is None else self._proc.pid

    def watch(self, pid: int) -> None:
        started = start_time(pid)
        self._send(f"watch {pid} {'-' if started is None else started}")

    def forget(self, pid: int) -> None:
        if self._proc is not None:
            self._send(f"forget {pid}")

    def close(self) -> None:
        """Tell the watcher the owner stopped its engines itself, and wait for it to exit."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):  # a watcher that died already has nothing left to do
            assert proc.stdin is not None
            proc.stdin.write(f"{_BYE}\n".encode())
            proc.stdin.close()
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "libra.adapters.reaper", str(os.getpid()), str(self.grace_s)],
                stdin=subprocess.PIPE,
                start_new_session=True,  # out of the terminal's process group: Ctrl-C and hang-ups reach the owner
            )
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{line}\n".encode())
        self._proc.stdin.flush()


def main(argv: list[str]) -> int:
    owner, grace_s = int(argv[0]), float(argv[1])
    watch(owner, sys.stdin, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
