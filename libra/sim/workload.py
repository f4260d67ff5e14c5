"""One step's trajectories as numpy arrays (the simulator's unit of work), from a generator or a trace.

A trajectory is a request with `turns` decode segments: segment t decodes `gen[i, t]` tokens, then (unless it is the
last turn) a tool call takes `latency[i, t]` seconds off the GPU and returns `tool_tokens[i, t]` tokens that are
prefilled before segment t + 1. Tool latency comes from the turn's `extra["tool_latency_s"]` when present, else
from `ToolLatency`: a lognormal per tool whose draw is a pure function of the trajectory's content (its token counts
turn by turn), the turn and the seed, so every policy sees the same draws and the same trajectory gets the same tool
times in any step and any order (three identical steps simulate alike; a resampled step differs only by what it
drew).
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

    def scale(self, tools: Sequence[str | None], normal: np.ndarray) -> np.ndarray:
        """Latencies from standard normal deviates, one per tool call."""
        med = np.array([self.median_s if t is None else self.per_tool_median_s.get(t, self.median_s) for t in tools])
        return med * np.exp(self.sigma * normal)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def content_normals(
    prompt_tokens: np.ndarray, gen: np.ndarray, tool: np.ndarray, traj_of: np.ndarray, turn_no: np.ndarray, seed: int
) -> np.ndarray:
    """One standard normal deviate per turn, a pure function of (the trajectory's token counts turn by turn, the
    turn's index, the seed): a trajectory that appears again, in another step or order, draws the same numbers."""
    with np.errstate(over="ignore"):
        per_turn = _mix(
            gen.astype(np.uint64) * _GOLDEN
            + _mix(tool.astype(np.uint64) + np.uint64(0x632BE59BD9B4E019))
            + turn_no.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        )
        fp = np.zeros(len(prompt_tokens), np.uint64)
        np.add.at(fp, traj_of, per_turn)
        fp = _mix(fp + _mix(prompt_tokens.astype(np.uint64)) + np.uint64(seed % (1 << 64)) * _GOLDEN)
        key = fp[traj_of] + turn_no.astype(np.uint64) * _GOLDEN
        a, b = _mix(key ^ np.uint64(0xA5A5A5A5A5A5A5A5)), _mix(key + np.uint64(0x5851F42D4C957F2D))
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)
    u2 = (b >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


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


def step_work(
    step: int,
    trajectories: Sequence[Trajectory],
    *,
    latency: ToolLatency | None = None,
    seed: int = 0,
    chunk_tokens: int = 2048,
) -> StepWork:
    """Arrays for one step. A trajectory cut off on a tool turn ends there: its last tool return is never used."""
    if not trajectories:
        raise SpecError(f"step {step} has no trajectories")
    if chunk_tokens < 1:
        raise SpecError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    latency = latency or ToolLatency()
    n = len(trajectories)
    # one pass over the turns for their fields; the cutting into segments is array work
    num_turns = np.fromiter((len(tr.turns) for tr in trajectories), np.int64, n)
    turns = [u for tr in trajectories for u in tr.turns]
    m = len(turns)
    gen_t = np.fromiter((u.gen_tokens for u in turns), np.int64, m)
    tool_t = np.fromiter((u.tool_tokens for u in turns), np.int64, m)
    has_tool = np.fromiter((u.tool is not None for u in turns), bool, m)
    traj_of = np.repeat(np.arange(n), num_turns)
    turn_no = np.arange(m) - np.repeat(np.cumsum(num_turns) - num_turns, num_turns)
    follows_t = has_tool & (turn_no < num_turns[traj_of] - 1)
    lat_t = np.zeros(m)
    missing: list[int] = []  # turns without a recorded latency, in (request, turn) order
    for j in np.flatnonzero(follows_t).tolist():
        value = turns[j].extra.get("tool_latency_s")
        if value is None:
            missing.append(j)
        else:
            lat_t[j] = float(value)
    if missing:
        prompt = np.fromiter((tr.prompt_tokens for tr in trajectories), np.int64, n)
        normal = content_normals(prompt, gen_t, tool_t, traj_of, turn_no, seed)
        lat_t[missing] = latency.scale([turns[j].tool for j in missing], normal[missing])
    pieces = np.maximum(1, -(-gen_t // chunk_tokens))
    base, extra = np.divmod(gen_t, pieces)
    seg_turn = np.repeat(np.arange(m), pieces)
    piece = np.arange(seg_turn.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    ends_turn = piece == pieces[seg_turn] - 1
    follows = ends_turn & follows_t[seg_turn]
    seg_traj = traj_of[seg_turn]
    num_segments = np.bincount(seg_traj, minlength=n).astype(np.int64)
    pos = np.arange(seg_turn.size) - np.repeat(np.cumsum(num_segments) - num_segments, num_segments)
    width = int(num_segments.max())
    gen = np.zeros((n, width), np.int64)
    tool = np.zeros((n, width), np.int64)
    lat = np.zeros((n, width))
    tool_end = np.zeros((n, width), bool)
    turn_of = np.zeros((n, width), np.int64)
    gen[seg_traj, pos] = base[seg_turn] + (piece < extra[seg_turn])
    tool[seg_traj, pos] = np.where(follows, tool_t[seg_turn], 0)
    lat[seg_traj, pos] = np.where(follows, lat_t[seg_turn], 0.0)
    tool_end[seg_traj, pos] = follows
    turn_of[seg_traj, pos] = turn_no[seg_turn]
    return StepWork(
        step=step,
        trajectories=tuple(trajectories),
        prompt_tokens=np.fromiter((t.prompt_tokens for t in trajectories), np.int64, n),
        gen=gen,
        tool_tokens=tool,
        latency=lat,
        tool_end=tool_end,
        turn_of=turn_of,
        num_segments=num_segments,
        num_turns=num_turns,
    )


class WorkSource:
    """Steps of work, from a synthetic workload (`from_generator`) or a trace file (`from_trace`)."""

    def __init__(
        self,
        name: str,
        fetch: Callable[[int], list[Trajectory]],
        num_steps: int | None,
        latency: ToolLatency,
        seed: int,
    ) -> None:
        self.name, self._fetch, self.num_steps, self.latency, self.seed = name, fetch, num_steps, latency, seed

    @classmethod
    def from_generator(
        cls,
        workload: str,
        *,
        seed: int,
        num_prompts: int,
        samples_per_prompt: int,
        max_model_len: int,
        drift_steps: int = 100,
        latency: ToolLatency | None = None,
    ) -> WorkSource:
        gen = WorkloadGenerator(
            workload,
            seed=seed,
            num_prompts=num_prompts,
            samples_per_prompt=samples_per_prompt,
            max_model_len=max_model_len,
            drift_steps=drift_steps,
        )
        return cls(workload, gen.step, None, latency or ToolLatency(), seed)

    @classmethod
    def from_trace(cls, path: str | Path, *, seed: int = 0, latency: ToolLatency | None = None) -> WorkSource:
        steps = group_by_step(load_trace(path))
        name = Path(Path(path).name.removesuffix(".gz")).stem  # (t.jsonl.gz and t.jsonl are both "t")
        return cls(name, lambda s: steps[s], len(steps), latency or ToolLatency(), seed)

    def step(self, step: int) -> StepWork:
        if self.num_steps is not None and step >= self.num_steps:
            raise SpecError(f"the trace has {self.num_steps} steps; step {step} asked for")
        return step_work(step, self._fetch(step), latency=self.latency, seed=self.seed)
