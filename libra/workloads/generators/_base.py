"""Shared machinery of the synthetic workload generators: turn arrays, the length cap, Trajectory objects.

A generator simulates every trajectory of a step at once, turn by turn, with numpy arrays of shape
(trajectories, max_turns); this module turns those arrays into `Trajectory` values of the trace schema.
"""

from __future__ import annotations

import gc

import attrs
import numpy as np

from libra.workloads.trace import Trajectory, trusted_turns

NO_TOOL = -1
STATUS_NAMES = ("ok", "error", "timeout")


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


def cap_lengths(batch: StepBatch, prompt_tokens: np.ndarray, max_model_len: int) -> StepBatch:
    """Cut every trajectory at `max_model_len` total tokens, as an engine would: the turn that crosses the limit
    is shortened (its tool return first, then its generation) and becomes the last one, so a cut trajectory may
    end on a tool turn."""
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
    gen = batch.gen_tokens.copy()
    tool_tok = batch.tool_tokens.copy()
    turn = np.argmax(over, axis=1)  # the first turn that crosses the limit
    room = np.maximum(0, max_model_len - before[np.arange(rows.size), turn])
    g = np.minimum(gen[rows, turn], room)
    gen[rows, turn] = g
    tool_tok[rows, turn] = np.minimum(tool_tok[rows, turn], room - g)
    num_turns = batch.num_turns.copy()
    num_turns[rows] = turn + 1
    return attrs.evolve(batch, gen_tokens=gen, tool_tokens=tool_tok, num_turns=num_turns)


def to_trajectories(
    batch: StepBatch,
    *,
    tool_names: tuple[str, ...],
    prompt_ids: list[str],
    prompt_tokens: np.ndarray,
    samples: np.ndarray,
    step: int,
) -> list[Trajectory]:
    """Trajectory values, one per row. Each tool turn carries `tool_latency_s` in its `extra`."""
    # ~100K acyclic objects: pause the cyclic collector, which would otherwise rescan them as they are made
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(batch, tool_names, prompt_ids, prompt_tokens, samples, step)
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
    starts = [0, *ends[:-1]]
    return [
        Trajectory(prompt_id=pid, prompt_tokens=ptok, turns=tuple(turns[a:b]), sample=sample, step=step, reward=reward)
        for pid, ptok, a, b, sample, reward in zip(
            prompt_ids, prompt_tokens.tolist(), starts, ends, samples.tolist(), batch.reward.tolist()
        )
    ]
