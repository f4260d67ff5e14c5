"""Wall-time accounting of the orchestrator's thread: time inside engines, tools, the trainer (waiting for it),
weight pushes, engine starts/stops; the rest is orchestration overhead. Also the spans of the timeline."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import attrs


@attrs.frozen
class Span:
    worker: str
    kind: str  # rollout, train, switching, weights
    start_s: float
    end_s: float
    step: int


class Clock:
    """`with clock.span(category):` adds the block's wall time to `category` (nested spans count once, in the
    outermost). `mark(worker, kind, start, end, step)` records a timeline span (seconds since `t0`)."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.totals: dict[str, float] = defaultdict(float)
        self.spans: list[Span] = []
        self._depth = 0
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    @contextlib.contextmanager
    def span(self, category: str) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            self.totals[category] += time.perf_counter() - start

    def mark(self, worker: str, kind: str, start_s: float, end_s: float, step: int) -> None:
        with self._lock:
            self.spans.append(Span(worker, kind, start_s, end_s, step))

    def take(self) -> dict[str, float]:
        """The totals since the last `take`, and reset them."""
        out, self.totals = dict(self.totals), defaultdict(float)
        return out
