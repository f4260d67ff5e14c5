"""Baseline routing policies behind the `Router` contract: `fcfs`, `mlfq`, `predictor`, `oracle`."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

from libra.scheduling.router import Request, Router, register_router
from libra.spec import Bucket, SpecError
from libra.workloads.trace import Trajectory


@register_router
class FCFSRouter(Router):
    """No length awareness: requests go to the buckets in turn, in arrival order (as one first-come-first-served
    queue feeding every instance would spread them), or all to `bucket` when given. Never migrates."""

    name = "fcfs"

    def __init__(self, buckets: Sequence[Bucket], *, bucket: int | None = None) -> None:
        super().__init__(buckets)
        if bucket is not None and not (isinstance(bucket, int) and 0 <= bucket < len(self.buckets)):
            raise SpecError(f"fcfs: bucket must be an index in 0..{len(self.buckets) - 1}, got {bucket!r}")
        self.fixed = bucket
        self._next = 0

    def _admit(self, req: Request) -> int:
        if self.fixed is not None:
            return self.fixed
        b = self._next
        self._next = (b + 1) % len(self.buckets)
        return b


@register_router
class MLFQRouter(Router):
    """Classic multi-level feedback queue: start in the smallest bucket and promote one level whenever the
    request's service crosses its level's limit. Service is the tokens it generated (`service="generated"`, the
    classic notion: tool returns are not work the engine did) or its whole context (`service="context"`).
    Blind to tool returns otherwise; every promotion moves the whole context."""

    name = "mlfq"

    def __init__(self, buckets: Sequence[Bucket], *, service: str = "generated") -> None:
        super().__init__(buckets)
        if service not in ("generated", "context"):
            raise SpecError(f"mlfq: service must be 'generated' or 'context', got {service!r}")
        self.service = service

    def _admit(self, req: Request) -> int:
        return 0

    def _level(self, req: Request) -> tuple[int, str]:
        served = req.context if self.service == "context" else req.context - req.prompt_tokens - req.tool_tokens
        if served > self.limits[req.bucket] and req.bucket < len(self.limits) - 1:
            return req.bucket + 1, "promote"
        return req.bucket, "stay"

    def _tool_return(self, req: Request, tool: str, tool_tokens: int, status: str) -> tuple[int, str]:
        return self._level(req)

    def _progress(self, req: Request) -> tuple[int, str]:
        return self._level(req)


@register_router
class PredictorRouter(Router):
    """Predict the final bucket at admission, then never move.

    `mode="history"`: the most common final bucket of the prompt's last `window` trajectories; for a prompt never
    seen, the most common final bucket of past trajectories with a similar prompt length (deciles of
    `prompt_tokens`, the one prompt feature a trace has), else of all past trajectories.
    `mode="most_common"`: everything goes to the most common final bucket seen so far (bucket 0 before any data).
    Learns only at `end_step`."""

    name = "predictor"

    def __init__(
        self, buckets: Sequence[Bucket], *, mode: str = "history", window: int = 200, num_length_bins: int = 10
    ) -> None:
        super().__init__(buckets)
        if mode not in ("history", "most_common"):
            raise SpecError(f"predictor: mode must be 'history' or 'most_common', got {mode!r}")
        if window < 1 or num_length_bins < 1:
            raise SpecError("predictor: window and num_length_bins must be >= 1")
        self.mode = mode
        self.window = window
        self.num_length_bins = num_length_bins
        self._by_prompt: dict[str, deque[int]] = {}
        self._counts: Counter[int] = Counter()
        self._edges = np.zeros(0)
        self._by_bin: list[Counter[int]] = []
        self._features: deque[tuple[int, int]] = deque(maxlen=20_000)  # (prompt_tokens, final bucket), recent

    @staticmethod
    def _majority(counts: Counter[int]) -> int:
        return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def _admit(self, req: Request) -> int:
        if not self._counts:
            return 0
        if self.mode == "most_common":
            return self._majority(self._counts)
        history = self._by_prompt.get(req.prompt_id)
        if history:
            return self._majority(Counter(history))
        if self._by_bin:
            counts = self._by_bin[int(np.searchsorted(self._edges, req.prompt_tokens, side="right"))]
            if counts:
                return self._majority(counts)
        return self._majority(self._counts)

    def _learn(self, finished: list[Trajectory]) -> None:
        for t in finished:
            b = self.bucket_for(t.total_tokens)
            self._counts[b] += 1
            self._by_prompt.setdefault(t.prompt_id, deque(maxlen=self.window)).append(b)
            self._features.append((t.prompt_tokens, b))
        if self.mode == "history" and self._features:
            lengths = np.array([f[0] for f in self._features])
            qs = np.linspace(0, 1, self.num_length_bins + 1)[1:-1]
            self._edges = np.unique(np.quantile(lengths, qs))
            self._by_bin = [Counter() for _ in range(len(self._edges) + 1)]
            for length, b in self._features:
                self._by_bin[int(np.searchsorted(self._edges, length, side="right"))][b] += 1


@register_router
class OracleRouter(Router):
    """Knows the final length (`final_tokens` at admission) and starts in its bucket: the upper bound."""

    name = "oracle"

    def _admit(self, req: Request) -> int:
        if req.final_tokens is None:
            raise SpecError("the oracle policy needs final_tokens at admission")
        return self.bucket_for(req.final_tokens)
