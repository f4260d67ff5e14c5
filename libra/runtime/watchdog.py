"""Bounded waits on the engines: a hung-but-alive engine is treated like a dead one.

vLLM's synchronous client blocks in ``engine.step()`` until its engine core answers; an engine core that is alive
but makes no progress (stopped, deadlocked, swapped out for good) would block the run forever. :class:`EngineWatch`
is a thread that checks, every ``check_s`` seconds, which engine step the backend is inside
(``backend.stepping``: instance name and the step's start). The same step still running at a check is a missed
progress check; ``missed_checks`` consecutive ones (not one slow reply: this machine is often loaded) make the
engine hung: its processes are SIGKILLed, so that the backend's own death watchdog fails the step, re-queues the
instance's requests on a live instance and the next boundary restarts it. The cause is kept (:attr:`hangs`) and
recorded with the ``EngineDied`` decision.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any

log = logging.getLogger("libra.runtime")


class EngineWatch:
    def __init__(self, backend: Any, *, check_s: float, missed_checks: int) -> None:
        self.backend, self.check_s, self.missed_checks = backend, check_s, missed_checks
        self.hangs: dict[str, str] = {}  # instance -> cause, until the orchestrator records its death
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="libra-engine-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen, missed = None, 0
        while not self._stop.wait(self.check_s):
            current = getattr(self.backend, "stepping", None)
            if current is None or current != seen:
                seen, missed = current, 0
                continue
            missed += 1
            if missed < self.missed_checks:
                continue
            name = current[0]
            cause = (
                f"hung: one engine step made no progress for {missed} consecutive checks of {self.check_s:g} s; "
                "its processes were killed"
            )
            self.hangs[name] = cause
            log.warning("engine %s %s", name, cause)
            try:
                pids = self.backend.engine_pids(name)
            except Exception:  # noqa: BLE001 - the instance went away meanwhile: nothing to kill
                pids = ()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            seen, missed = None, 0

    def cause(self, instance: str) -> str | None:
        return self.hangs.pop(instance, None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.check_s + 1.0)


__all__ = ["EngineWatch"]
