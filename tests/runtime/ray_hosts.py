"""A scripted actor payload for the Ray backend's tests: the driver side, Ray and the actors are real, the engine is
a counter, so that concurrency, grace, deaths and weight checks are tested in seconds (the real engine in an actor is
`tests/runtime/test_run_engines.py -k ray_run`)."""

from __future__ import annotations

import os
import socket
import time

from libra.adapters.types import EventKind, StreamEvent


class ScriptedHost:
    """Speaks `EngineHost`'s protocol. Each poll appends one token (the context length mod 97) to every running
    request; a turn finishes after its `max_tokens`. `gates[name]`: a file whose absence blocks every poll of that
    instance (a slow or hung engine)."""

    def __init__(self, info, gates: dict[str, str] | None = None) -> None:
        self.name = info.worker
        self.gate = (gates or {}).get(self.name)
        self.requests: dict[str, tuple[list[int], int]] = {}
        self.version = -1

    def start(self, spec) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": "", "engine_pids": []}

    def submit(self, engine_id: str, context, sampling) -> None:
        self.requests[engine_id] = (list(context), sampling.max_tokens)

    def abort(self, engine_id: str) -> None:
        self.requests.pop(engine_id, None)

    def poll(self):
        while self.gate is not None and not os.path.exists(self.gate):
            time.sleep(0.05)
        events = []
        for eid, (context, left) in list(self.requests.items()):
            token = len(context) % 97
            context.append(token)
            kind = EventKind.FINISHED if left == 1 else EventKind.TOKENS
            if kind == EventKind.FINISHED:
                del self.requests[eid]
            else:
                self.requests[eid] = (context, left - 1)
            events.append(
                StreamEvent(
                    request_id=eid, instance=self.name, kind=kind, new_token_ids=(token,), weight_version=self.version
                )
            )
        return events, None

    def load(self, update) -> int:
        if update.version < self.version:
            raise ValueError(f"instance {self.name!r} serves version {self.version}; refusing older {update.version}")
        self.version = update.version
        return self.version

    def forget(self) -> None:
        self.version = -1

    def weight_version(self) -> int:
        return self.version

    def engine_pids(self) -> tuple[int, ...]:
        return ()

    def shutdown(self) -> None:
        self.requests.clear()
