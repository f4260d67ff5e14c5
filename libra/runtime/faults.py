"""Fault injection for the runtime: an `on_poll` hook that SIGKILLs (or SIGSTOPs: hangs) a rollout engine at a
seeded random moment.

`Orchestrator(config, out, on_poll=EngineKiller(seed, steps=(1,)))` kills, during rollout of each chosen step, the
engine-core process of one busy instance at a seeded random engine poll. A kill waits (5 polls at a time) until a
second instance is live to take the dead one's requests. Used by the runtime tests and `scripts/runtime_kills.py`.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any


class EngineKiller:
    def __init__(
        self,
        seed: int,
        steps: tuple[int, ...],
        *,
        first_poll: int = 3,
        last_poll: int = 25,
        sig: int = signal.SIGKILL,
    ) -> None:
        self.sig = sig  # SIGKILL: a dead engine; SIGSTOP: a hung one (alive, no progress), for the bounded waits
        self.rnd = random.Random(seed)
        self.at = {s: self.rnd.randint(first_poll, last_poll) for s in steps}
        self.polls: dict[int, int] = {}
        self.killed: list[tuple[int, str]] = []  # (step, instance)
        self.killed_at_poll: dict[int, int] = {}

    def __call__(self, orch: Any) -> None:
        k = orch.rolling_step
        if k is None or k not in self.at:
            return
        self.polls[k] = self.polls.get(k, 0) + 1
        if self.polls[k] != self.at[k]:
            return
        backend = orch.backend
        busy = [n for n in backend.instances() if backend.num_requests(n) > 0]
        if len(backend.instances()) < 2 or not busy:
            self.at[k] += 5  # wait until a second instance can take the requests
            return
        victim = self.rnd.choice(busy)
        for pid in backend.engine_pids(victim):
            os.kill(pid, self.sig)
        self.killed.append((k, victim))
        self.killed_at_poll[k] = self.polls[k]


__all__ = ["EngineKiller"]
