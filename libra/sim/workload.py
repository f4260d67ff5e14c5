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

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from libra.spec import SpecError, checks
from libra.workloads import WorkloadGenerator, group_by_step, load_trace
from libra.workloads.generators import GeneratedStep
from libra.workloads.trace import Trajectory


@attrs.frozen(kw_only=True)
class ToolLatency:
    """Tool wall time for turns that do not carry one: lognormal with this median (seconds) and log-spread."""

    median_s: float = 2.0
    sigma: float = 0.8
    per_tool_median_s: dict[str, float] = attrs.field(factory=dict, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        checks.number("ToolLatency", "median_s", self.median_s, 0.0, above=True)
        checks.number("ToolLatency", "sigma", self.sigma, 0.0)
        for tool, median in self.per_tool_median_s.items():
            checks.number("ToolLatency", f"per_tool_median_s[{tool!r}]", median, 0.0, above=True)

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
    `turn_of[i, s]` is the trajectory turn a segment belongs to. `trajectories` may be given as a function that
    makes them: they are then made on first use (only the C-MLFQ prefix tree reads them)."""

    step: int
    _trajectories: tuple[Trajectory, ...] | Callable[[], Sequence[Trajectory]] = attrs.field(
        alias="trajectories", converter=lambda v: v if callable(v) else tuple(v)
    )
    prompt_tokens: np.ndarray  # (n,)
    gen: np.ndarray  # (n, S) decode tokens of each segment
    tool_tokens: np.ndarray  # (n, S) tokens the tool call after the segment returns (0 when none)
    latency: np.ndarray  # (n, S) seconds of that tool call (0 when none)
    tool_end: np.ndarray  # (n, S) bool: a tool call follows
    turn_of: np.ndarray  # (n, S) int
    num_segments: np.ndarray  # (n,)
    num_turns: np.ndarray  # (n,) turns of each trajectory
    _sums: dict[str, np.ndarray] = attrs.field(init=False, factory=dict)  # per-request sums, made once, read-only

    @property
    def trajectories(self) -> tuple[Trajectory, ...]:
        made = self._trajectories
        if callable(made):
            made = tuple(made())
            if len(made) != self.num_requests:
                raise SpecError(f"step {self.step}: {len(made)} trajectories made for {self.num_requests} requests")
            object.__setattr__(self, "_trajectories", made)  # made once (the value is the same on every read)
        return made

    @property
    def num_requests(self) -> int:
        return len(self.num_segments)

    @property
    def total_tokens(self) -> np.ndarray:
        """(n,) each request's whole length: prompt, decoded and tool tokens (read-only)."""
        return self._sum("total", lambda: self.prompt_tokens + self.gen_tokens + self.tool_tokens.sum(axis=1))

    @property
    def gen_tokens(self) -> np.ndarray:
        """(n,) each request's decoded tokens (read-only)."""
        return self._sum("gen", lambda: self.gen.sum(axis=1))

    @property
    def tool_seconds(self) -> np.ndarray:
        """(n,) each request's seconds in tool calls (read-only)."""
        return self._sum("tool_s", lambda: self.latency.sum(axis=1))

    def _sum(self, key: str, make: Callable[[], np.ndarray]) -> np.ndarray:
        # every policy reads these of every step (a step's arrays are tens of MB at 65,536 requests)
        out = self._sums.get(key)
        if out is None:
            out = self._sums[key] = make()
            out.flags.writeable = False
        return out


def _check(step: int, n: int, chunk_tokens: int) -> None:
    if not n:
        raise SpecError(f"step {step} has no trajectories")
    if chunk_tokens < 1:
        raise SpecError(f"chunk_tokens must be >= 1, got {chunk_tokens}")


def step_work(
    step: int,
    trajectories: Sequence[Trajectory],
    *,
    latency: ToolLatency | None = None,
    seed: int = 0,
    chunk_tokens: int = 2048,
) -> StepWork:
    """Arrays for one step. A trajectory cut off on a tool turn ends there: its last tool return is never used."""
    _check(step, len(trajectories), chunk_tokens)
    n = len(trajectories)
    # one pass over the turns for their fields; the cutting into segments is array work
    num_turns = np.fromiter((len(tr.turns) for tr in trajectories), np.int64, n)
    turns = [u for tr in trajectories for u in tr.turns]
    m = len(turns)
    gen_t = np.fromiter((u.gen_tokens for u in turns), np.int64, m)
    tool_t = np.fromiter((u.tool_tokens for u in turns), np.int64, m)
    has_tool = np.fromiter((u.tool is not None for u in turns), bool, m)
    prompt = np.fromiter((tr.prompt_tokens for tr in trajectories), np.int64, n)
    traj_of, turn_no, follows_t = _turn_positions(num_turns, has_tool)
    _check_counts(step, trajectories, num_turns, prompt, gen_t, tool_t, traj_of, turn_no)
    lat_t = np.zeros(m)
    missing: list[int] = []  # turns without a recorded latency, in (request, turn) order
    for j in np.flatnonzero(follows_t).tolist():
        value = turns[j].extra.get("tool_latency_s")
        if value is None:
            missing.append(j)
        else:
            lat_t[j] = _seconds(value, step, trajectories[traj_of[j]], int(turn_no[j]))
    if missing:
        normal = content_normals(prompt, gen_t, tool_t, traj_of, turn_no, seed)
        lat_t[missing] = (latency or ToolLatency()).scale([turns[j].tool for j in missing], normal[missing])
    return _segments(
        step, trajectories, prompt, num_turns, gen_t, tool_t, lat_t, follows_t, traj_of, turn_no, chunk_tokens
    )


def _where(step: int, tr: Trajectory) -> str:
    sample = "" if tr.sample is None else f" sample {tr.sample}"
    return f"step {step}: trajectory {tr.prompt_id!r}{sample}"


def _check_counts(
    step: int,
    trajectories: Sequence[Trajectory],
    num_turns: np.ndarray,
    prompt: np.ndarray,
    gen_t: np.ndarray,
    tool_t: np.ndarray,
    traj_of: np.ndarray,
    turn_no: np.ndarray,
) -> None:
    """Trajectories made in Python (not loaded from a checked trace): at least one turn and token counts >= 0 (a
    trajectory without turns failed as an IndexError deep in the arrays, a negative count as a profile's error
    that named no trajectory)."""
    empty = np.flatnonzero(num_turns < 1)
    if empty.size:
        raise SpecError(f"{_where(step, trajectories[int(empty[0])])} has no turns; expected at least one")
    if (prompt < 0).any():
        i = int(np.flatnonzero(prompt < 0)[0])
        raise SpecError(f"{_where(step, trajectories[i])}: prompt_tokens must be >= 0, got {int(prompt[i])}")
    for field, counts in (("gen_tokens", gen_t), ("tool_tokens", tool_t)):
        bad = np.flatnonzero(counts < 0)
        if bad.size:
            j = int(bad[0])
            raise SpecError(
                f"{_where(step, trajectories[int(traj_of[j])])} turn {int(turn_no[j])}: {field} must be >= 0, "
                f"got {int(counts[j])}"
            )


def _seconds(value: object, step: int, tr: Trajectory, turn: int) -> float:
    """A turn's recorded `extra["tool_latency_s"]`: finite seconds >= 0."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise SpecError(f"{_where(step, tr)} turn {turn}: tool_latency_s must be finite seconds >= 0, got {value!r}")
    return seconds


def generated_step_work(step: GeneratedStep, *, chunk_tokens: int = 2048) -> StepWork:
    """`step_work(step.step, step.trajectories(), ...)` from the generator's arrays, with the trajectories made
    only if something reads them. Every tool turn of a generated step records its latency, so neither the seed
    nor a `ToolLatency` enters (tests/sim/test_step_arrays.py checks that the arrays are those of `step_work`)."""
    turns = step.turns()
    _check(step.step, len(turns.num_turns), chunk_tokens)
    traj_of, turn_no, follows_t = _turn_positions(turns.num_turns, turns.has_tool)
    lat_t = np.where(follows_t, turns.latency_s, 0.0)
    return _segments(
        step.step,
        step.trajectories,
        step.prompt_tokens.astype(np.int64),
        turns.num_turns,
        turns.gen_tokens,
        turns.tool_tokens,
        lat_t,
        follows_t,
        traj_of,
        turn_no,
        chunk_tokens,
    )


def _turn_positions(num_turns: np.ndarray, has_tool: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per turn: its trajectory, its index in the trajectory, and whether a tool call follows it (a tool turn that
    is not the trajectory's last)."""
    traj_of = np.repeat(np.arange(len(num_turns)), num_turns)
    turn_no = np.arange(len(has_tool)) - np.repeat(np.cumsum(num_turns) - num_turns, num_turns)
    return traj_of, turn_no, has_tool & (turn_no < num_turns[traj_of] - 1)


def _segments(
    step: int,
    trajectories: Sequence[Trajectory] | Callable[[], Sequence[Trajectory]],
    prompt: np.ndarray,
    num_turns: np.ndarray,
    gen_t: np.ndarray,
    tool_t: np.ndarray,
    lat_t: np.ndarray,
    follows_t: np.ndarray,
    traj_of: np.ndarray,
    turn_no: np.ndarray,
    chunk_tokens: int,
) -> StepWork:
    """The (n, S) segment arrays from the per-turn ones (`_turn_positions`): each turn's generation cut into
    `chunk_tokens` pieces."""
    n = len(num_turns)
    m = len(gen_t)
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
        trajectories=trajectories,
        prompt_tokens=prompt,
        gen=gen,
        tool_tokens=tool,
        latency=lat,
        tool_end=tool_end,
        turn_of=turn_of,
        num_segments=num_segments,
        num_turns=num_turns,
    )


def trace_name(path: str | Path) -> str:
    """A trace file's name without its suffixes: t.jsonl.gz and t.jsonl are both "t"."""
    return Path(Path(path).name.removesuffix(".gz")).stem


class WorkSource:
    """Steps of work, from a synthetic workload (`from_generator`) or a trace file (`from_trace`)."""

    def __init__(
        self,
        name: str,
        fetch: Callable[[int], list[Trajectory]],
        num_steps: int | None,
        latency: ToolLatency,
        seed: int,
        *,
        arrays: Callable[[int], GeneratedStep] | None = None,
        step_size: int | None = None,
    ) -> None:
        """`arrays(step)`, where given, is `fetch(step)` as a generator's arrays: the steps are built from them.
        `step_size`, where given, is the trajectories every step holds (a generator's `num_prompts *
        samples_per_prompt`): `simulate` checks it against the step `rl` trains without making a step."""
        self.name, self._fetch, self.num_steps, self.latency, self.seed = name, fetch, num_steps, latency, seed
        self._arrays = arrays
        self.step_size = step_size

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
        return cls(
            workload,
            gen.step,
            None,
            latency or ToolLatency(),
            seed,
            arrays=gen.step_arrays,
            step_size=num_prompts * samples_per_prompt,
        )

    @classmethod
    def from_trace(cls, path: str | Path, *, seed: int = 0, latency: ToolLatency | None = None) -> WorkSource:
        steps = group_by_step(load_trace(path))
        return cls(trace_name(path), lambda s: steps[s], len(steps), latency or ToolLatency(), seed)

    @classmethod
    def resampled(
        cls,
        path: str | Path,
        *,
        num_steps: int,
        num_prompts: int | None = None,
        seed: int = 0,
        latency: ToolLatency | None = None,
    ) -> WorkSource:
        """`num_steps` steps of `num_prompts` prompt groups each (default: as many as the trace's first step has),
        drawn with replacement from all the trace's prompts, a group keeping every sample the trace has of it
        (`resample_steps`, seeded by `seed`). A drawn prompt gets a new id in each step, so nothing the router
        learns of a prompt's earlier runs carries over to its copies: what carries over is what a real run's next
        steps share with its first, the population. The way to see a short trace (an agent's logs of one batch,
        one step) in the steady state of an asynchronous pipeline, which a single step never reaches."""
        from libra.sim.manyturn import resample_steps

        pool = load_trace(path)
        if num_prompts is None:
            first = group_by_step(pool)[0]
            num_prompts = len({t.prompt_id for t in first})
        steps = group_by_step(resample_steps(pool, num_steps, num_prompts, seed=seed))
        return cls(f"{trace_name(path)} (resampled)", lambda s: steps[s], len(steps), latency or ToolLatency(), seed)

    def trajectories(self, step: int) -> Sequence[Trajectory]:
        """The trajectories of `step`, without building its arrays (what a caller that only reads them needs)."""
        self._check_step(step)
        return self._fetch(step)

    def _check_step(self, step: int) -> None:
        if self.num_steps is not None and step >= self.num_steps:
            raise SpecError(f"the trace has {self.num_steps} steps; step {step} asked for")

    def step(self, step: int) -> StepWork:
        self._check_step(step)
        if self._arrays is not None:
            return generated_step_work(self._arrays(step))
        return step_work(step, self._fetch(step), latency=self.latency, seed=self.seed)
