"""One step's trajectories as numpy arrays (the simulator's unit of work), from a generator or a trace.

A trajectory is a request with `turns` decode segments: segment t decodes `gen[i, t]` tokens, then (unless it is the
last turn) a tool call takes `latency[i, t]` seconds off the GPU and returns `tool_tokens[i, t]` tokens that are
prefilled before segment t + 1. Tool latency comes from the turn's `extra["tool_latency_s"]` when present, else
from `ToolLatency` (a lognormal per tool, seeded by step and request so every policy sees the same draws).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from libra.spec import SpecError
from libra.workloads import WorkloadGenerator, group_by_step, load_trace
from libra.workloads.trace import Trajectory


@attrs.frozen(kw_only=True)
class ToolLatency:
    """Tool wall time for turns that do not carry one: lognormal with this median (seconds) and log-spread."""

    median_s: float = 2.0
    sigma: float = 0.8
    per_tool_median_s: dict[str, float] = attrs.field(factory=dict, eq=False, hash=False)

    def draw(self, rng: np.random.Generator, tools: Sequence[str]) -> np.ndarray:
        med = np.array([self.per_tool_median_s.get(t, self.median_s) for t in tools], float)
        return med * np.exp(self.sigma * rng.standard_normal(len(tools)))


@attrs.frozen(kw_only=True, eq=False)
class StepWork:
    """All trajectories of one step, as decode **segments**: a turn's generation is cut into segments of at most
    `chunk_tokens` tokens so that a request can be promoted to a larger bucket while it generates (C-MLFQ's
    overflow rule), not only at tool returns. Arrays have shape (n, S), S the most segments; `num_segments[i]`
    are valid. `tool_end[i, s]` is True when a real tool call follows segment s (`cont` segments just continue).
    `turn_of[i, s]` is the trajectory turn a segment belongs to."""

    step: int
    trajectories: tuple[Trajectory, ...]
    prompt_tokens: np.ndarray  # (n,)
    gen: np.ndarray  # (n, S) decode tokens of each segment
    tool_tokens: np.ndarray  # (n, S) tokens the tool call after the segment returns (0 when none)
    latency: np.ndarray  # (n, S) seconds of that tool call (0 when none)
    tool_end: np.ndarray  # (n, S) bool: a tool call follows
    turn_of: np.ndarray  # (n, S) int
    num_segments: np.ndarray  # (n,)
    num_turns: np.ndarray  # (n,) turns of each trajectory

    @property
    def num_requests(self) -> int:
        return len(self.num_segments)

    @property
    def total_tokens(self) -> np.ndarray:
        return self.prompt_tokens + self.gen.sum(axis=1) + self.tool_tokens.sum(axis=1)

    @property
    def gen_tokens(self) -> np.ndarray:
        return self.gen.sum(axis=1)


def step_work(step: int, trajectories: Sequence[Trajectory], *, latency: ToolLatency | None = None,
              seed: int = 0, chunk_tokens: int = 2048) -> StepWork:
    """Arrays for one step. A trajectory cut off on a tool turn ends there: its last tool return is never used."""
    if not trajectories:
        raise SpecError(f"step {step} has no trajectories")
    if chunk_tokens < 1:
        raise SpecError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    latency = latency or ToolLatency()
    n = len(trajectories)
    rows: list[list[tuple[int, int, int, bool]]] = []  # (gen, tool tokens, turn, tool follows)
    missing: list[tuple[int, int, str]] = []
    turn_latency: dict[tuple[int, int], float] = {}
    for i, traj in enumerate(trajectories):
        last = len(traj.turns) - 1
        row = []
        for t, turn in enumerate(traj.turns):
            pieces = max(1, -(-turn.gen_tokens // chunk_tokens))
            base, extra = divmod(turn.gen_tokens, pieces)
            for p in range(pieces):
                row.append((base + (p < extra), 0, t, False))
            if turn.tool is not None and t < last:
                g, _, _, _ = row[-1]
                row[-1] = (g, turn.tool_tokens, t, True)
                value = turn.extra.get("tool_latency_s")
                if value is None:
                    missing.append((i, t, turn.tool))
                else:
                    turn_latency[(i, t)] = float(value)
        rows.append(row)
    if missing:
        draws = latency.draw(np.random.default_rng([seed, 7, step]), [m[2] for m in missing])
        for (i, t, _), value in zip(missing, draws):
            turn_latency[(i, t)] = float(value)
    width = max(len(r) for r in rows)
    gen = np.zeros((n, width), np.int64)
    tool = np.zeros((n, width), np.int64)
    lat = np.zeros((n, width))
    tool_end = np.zeros((n, width), bool)
    turn_of = np.zeros((n, width), np.int64)
    for i, row in enumerate(rows):
        for s, (g, tt, t, follows) in enumerate(row):
            gen[i, s], tool[i, s], turn_of[i, s], tool_end[i, s] = g, tt, t, follows
            if follows:
                lat[i, s] = turn_latency[(i, t)]
    return StepWork(step=step, trajectories=tuple(trajectories),
                    prompt_tokens=np.array([t.prompt_tokens for t in trajectories], np.int64),
                    gen=gen, tool_tokens=tool, latency=lat, tool_end=tool_end, turn_of=turn_of,
                    num_segments=np.array([len(r) for r in rows], np.int64),
                    num_turns=np.array([len(t.turns) for t in trajectories], np.int64))


class WorkSource:
    """Steps of work, from a synthetic workload (`from_generator`) or a trace file (`from_trace`)."""

    def __init__(self, name: str, fetch: Callable[[int], list[Trajectory]], num_steps: int | None,
                 latency: ToolLatency, seed: int) -> None:
        self.name, self._fetch, self.num_steps, self.latency, self.seed = name, fetch, num_steps, latency, seed

    @classmethod
    def from_generator(cls, workload: str, *, seed: int, num_prompts: int, samples_per_prompt: int,
                       max_model_len: int, drift_steps: int = 100, latency: ToolLatency | None = None) -> WorkSource:
        gen = WorkloadGenerator(workload, seed=seed, num_prompts=num_prompts, samples_per_prompt=samples_per_prompt,
                                max_model_len=max_model_len, drift_steps=drift_steps)
        return cls(workload, gen.step, None, latency or ToolLatency(), seed)

    @classmethod
    def from_trace(cls, path: str | Path, *, seed: int = 0, latency: ToolLatency | None = None) -> WorkSource:
        steps = group_by_step(load_trace(path))
        return cls(Path(path).stem, lambda s: steps[s], len(steps), latency or ToolLatency(), seed)

    def step(self, step: int) -> StepWork:
        if self.num_steps is not None and step >= self.num_steps:
            raise SpecError(f"the trace has {self.num_steps} steps; step {step} asked for")
        return step_work(step, self._fetch(step), latency=self.latency, seed=self.seed)
