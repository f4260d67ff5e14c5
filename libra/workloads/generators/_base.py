"""Shared machinery of the synthetic workload generators: turn arrays, the length cap, Trajectory objects.

A generator simulates every trajectory of a step at once, turn by turn, with numpy arrays of shape
(trajectories, max_turns); this module turns those arrays into `Trajectory` values of the trace schema.
"""

from __future__ import annotations

import gc

import attrs
import numpy as np

from libra.workloads.trace import TRAJECTORY_FIELDS, Trajectory, trusted_turns, trusted_values

NO_TOOL = -1
STATUS_NAMES = ("ok", "error", "timeout")
SYNTHETIC = "synthetic:"  # every generated trajectory's `extra["source"]` is this + the workload's name


def synthetic_source(workload: str) -> str:
    """The `source` a generated trajectory carries (real traces carry the name their importer was given), so that
    a generated trace, written and read back, still says it is synthetic (docs/design.md: generated data is
    called synthetic)."""
    return SYNTHETIC + workload


@attrs.frozen(kw_only=True)
class PromptPool:
    """The data set a run samples prompts from: per prompt a token count and latent traits (difficulty,
    verbosity, ...) that every sample of the prompt shares. Samples of one prompt are therefore correlated."""

    prompt_tokens: np.ndarray  # (num_dataset_prompts,) int
    traits: np.ndarray  # (num_dataset_prompts, num_traits) float, standard normal


@attrs.frozen(kw_only=True)
class StepBatch:
    """What a step simulation hands back; `num_turns[i]` turns of row i are valid. `tool[i, t]` is an index into
    the workload's tool names or NO_TOOL; the last valid turn of a finished trajectory has NO_TOOL."""

    gen_tokens: np.ndarray  # (n, T) int
    tool: np.ndarray  # (n, T) int
    status: np.ndarray  # (n, T) int index into STATUS_NAMES
    tool_tokens: np.ndarray  # (n, T) int
    tool_latency_s: np.ndarray  # (n, T) float
    num_turns: np.ndarray  # (n,) int
    reward: np.ndarray  # (n,) float


def lognormal(rng: np.random.Generator, median: np.ndarray | float, sigma: float, size: int) -> np.ndarray:
    """Lognormal draws with the given median (`exp(mu)`) and log-space spread."""
    return np.asarray(median) * np.exp(sigma * rng.standard_normal(size))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def cap_lengths(batch: StepBatch, prompt_tokens: np.ndarray, max_model_len: int, *, copy: bool = True) -> StepBatch:
    """Cut every trajectory at `max_model_len` total tokens, as an engine would: the turn that crosses the limit
    is shortened (its tool return first, then its generation) and becomes the last one, so a cut trajectory may
    end on a tool turn. `copy=False` writes the cuts into `batch`'s arrays (for a caller that owns them: a step's
    arrays are tens of MB and few rows are cut)."""
    n, horizon = batch.gen_tokens.shape
    valid = np.arange(horizon)[None, :] < batch.num_turns[:, None]
    per_turn = batch.gen_tokens + batch.tool_tokens
    np.multiply(per_turn, valid, out=per_turn)  # 0 past a row's turns (one temporary: a step's arrays are large)
    if per_turn.min(initial=0) >= 0:
        # no negative count: only a row whose whole length is over the limit has a turn that crosses it, so the
        # running sums are taken over those rows alone
        rows = np.flatnonzero(prompt_tokens + per_turn.sum(axis=1) > max_model_len)
    else:
        rows = np.arange(n)
    some = per_turn[rows]
    before = prompt_tokens[rows, None] + np.cumsum(some, axis=1) - some  # context at the start of each turn
    over = valid[rows] & (before + some > max_model_len)
    crossing = over.any(axis=1)
    rows, before, over = rows[crossing], before[crossing], over[crossing]
    if rows.size == 0:
        return batch
    gen = batch.gen_tokens.copy() if copy else batch.gen_tokens
    tool_tok = batch.tool_tokens.copy() if copy else batch.tool_tokens
    turn = np.argmax(over, axis=1)  # the first turn that crosses the limit
    room = np.maximum(0, max_model_len - before[np.arange(rows.size), turn])
    g = np.minimum(gen[rows, turn], room)
    gen[rows, turn] = g
    tool_tok[rows, turn] = np.minimum(tool_tok[rows, turn], room - g)
    num_turns = batch.num_turns.copy() if copy else batch.num_turns
    num_turns[rows] = turn + 1
    return attrs.evolve(batch, gen_tokens=gen, tool_tokens=tool_tok, num_turns=num_turns)


@attrs.frozen(kw_only=True, eq=False)
class TurnFields:
    """Per-turn arrays of a step's trajectories, row-major; `num_turns[i]` turns belong to trajectory i."""

    num_turns: np.ndarray  # (n,) int64
    gen_tokens: np.ndarray  # (m,) int64
    tool_tokens: np.ndarray  # (m,) int64, 0 on a turn without a tool
    has_tool: np.ndarray  # (m,) bool
    latency_s: np.ndarray  # (m,) float, each tool turn's `tool_latency_s` (rounded to ms, as in the turn's extra)


@attrs.frozen(kw_only=True, eq=False)
class GeneratedStep:
    """One generated step as arrays, before any `Trajectory` is made (the simulator reads the arrays; the
    trajectories are built only for a reader that needs them: `trajectories()`)."""

    step: int
    batch: StepBatch  # length-capped
    workload: str
    tool_names: tuple[str, ...]
    prompts: np.ndarray  # (n,) int, each row's prompt: its index in the workload's data set
    prompt_tokens: np.ndarray  # (n,) int
    samples: np.ndarray  # (n,) int

    def trajectories(self) -> list[Trajectory]:
        return to_trajectories(
            self.batch,
            tool_names=self.tool_names,
            prompt_ids=[f"{self.workload}-p{i}" for i in self.prompts.tolist()],
            prompt_tokens=self.prompt_tokens,
            samples=self.samples,
            step=self.step,
            source=synthetic_source(self.workload),
        )

    def turns(self) -> TurnFields:
        """The fields of every valid turn, row-major (the turns of row 0, then of row 1, ...): what
        `trajectories()` puts in its `Turn` values, as arrays."""
        b = self.batch
        valid = np.arange(b.gen_tokens.shape[1])[None, :] < b.num_turns[:, None]
        kind = b.tool[valid]
        has_tool = kind != NO_TOOL
        return TurnFields(
            num_turns=b.num_turns.astype(np.int64, copy=False),
            gen_tokens=b.gen_tokens[valid].astype(np.int64, copy=False),
            tool_tokens=np.where(has_tool, b.tool_tokens[valid], 0).astype(np.int64, copy=False),
            has_tool=has_tool,
            latency_s=np.where(has_tool, np.round(b.tool_latency_s[valid], 3), 0.0),
        )


def to_trajectories(
    batch: StepBatch,
    *,
    tool_names: tuple[str, ...],
    prompt_ids: list[str],
    prompt_tokens: np.ndarray,
    samples: np.ndarray,
    step: int,
    source: str,
) -> list[Trajectory]:
    """Trajectory values, one per row, each with `extra["source"] = source`. Each tool turn carries
    `tool_latency_s` in its `extra`."""
    # ~100K acyclic objects: pause the cyclic collector, which would otherwise rescan them as they are made
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(batch, tool_names, prompt_ids, prompt_tokens, samples, step, source)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build(
    batch: StepBatch,
    tool_names: tuple[str, ...],
    prompt_ids: list[str],
    prompt_tokens: np.ndarray,
    samples: np.ndarray,
    step: int,
    source: str,
) -> list[Trajectory]:
    valid = np.arange(batch.gen_tokens.shape[1])[None, :] < batch.num_turns[:, None]
    # every valid turn, row-major (the turns of row 0, then of row 1, ...), as python values; the names are looked
    # up by array indexing (NO_TOOL = -1 picks the trailing None)
    kind = batch.tool[valid]
    no_tool = kind == NO_TOOL
    tools = np.array([*tool_names, None], object)[kind].tolist()
    statuses = np.where(no_tool, np.array(None, object), np.array(STATUS_NAMES, object)[batch.status[valid]]).tolist()
    tool_tok = np.where(no_tool, 0, batch.tool_tokens[valid]).tolist()
    latency = np.round(batch.tool_latency_s[valid], 3).tolist()
    extras = [{} if name is None else {"tool_latency_s": lat} for name, lat in zip(tools, latency)]
    turns = trusted_turns(batch.gen_tokens[valid].tolist(), tools, statuses, tool_tok, extras)
    ends = np.cumsum(batch.num_turns).tolist()
    rows = len(ends)
    turns_of = [tuple(turns[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    columns = (prompt_ids, prompt_tokens.tolist(), turns_of, samples.tolist(), [step] * rows, batch.reward.tolist())
    return trusted_values(Trajectory, TRAJECTORY_FIELDS, (*columns, [{"source": source} for _ in range(rows)]))
