"""Shared machinery of the synthetic workload generators: turn arrays, the length cap, Trajectory objects.

A generator simulates every trajectory of a step at once, turn by turn, with numpy arrays of shape
(trajectories, max_turns); this module turns those arrays into `Trajectory` values of the trace schema.
"""

from __future__ import annotations

import gc

import attrs
import numpy as np

from libra.workloads.trace import Trajectory, Turn

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
    gen = batch.gen_tokens.copy()
    tool_tok = batch.tool_tokens.copy()
    n, horizon = gen.shape
    valid = np.arange(horizon)[None, :] < batch.num_turns[:, None]
    per_turn = np.where(valid, gen + tool_tok, 0)
    before = prompt_tokens[:, None] + np.cumsum(per_turn, axis=1) - per_turn  # context at the start of each turn
    over = valid & (before + per_turn > max_model_len)
    cut_rows = np.flatnonzero(over.any(axis=1))
    num_turns = batch.num_turns.copy()
    for i in cut_rows:
        t = int(np.argmax(over[i]))
        room = max(0, max_model_len - int(before[i, t]))
        g = min(int(gen[i, t]), room)
        gen[i, t] = g
        tool_tok[i, t] = min(int(tool_tok[i, t]), room - g)
        num_turns[i] = t + 1
    return attrs.evolve(batch, gen_tokens=gen, tool_tokens=tool_tok, num_turns=num_turns)


def to_trajectories(batch: StepBatch, *, tool_names: tuple[str, ...], prompt_ids: list[str],
                    prompt_tokens: np.ndarray, samples: np.ndarray, step: int) -> list[Trajectory]:
    """Trajectory values, one per row. Each tool turn carries `tool_latency_s` in its `extra`."""
    # ~100K acyclic objects: pause the cyclic collector, which would otherwise rescan them as they are made
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(batch, tool_names, prompt_ids, prompt_tokens, samples, step)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build(batch: StepBatch, tool_names: tuple[str, ...], prompt_ids: list[str], prompt_tokens: np.ndarray,
           samples: np.ndarray, step: int) -> list[Trajectory]:
    num_turns = batch.num_turns.tolist()
    valid = np.arange(batch.gen_tokens.shape[1])[None, :] < batch.num_turns[:, None]
    gen = batch.gen_tokens[valid].tolist()  # row-major: the turns of row 0, then of row 1, ...
    tool = batch.tool[valid].tolist()
    status = batch.status[valid].tolist()
    tool_tok = batch.tool_tokens[valid].tolist()
    latency = np.round(batch.tool_latency_s[valid], 3).tolist()
    ptoks = prompt_tokens.tolist()
    sample_list = samples.tolist()
    reward = batch.reward.tolist()
    out = []
    pos = 0
    for i, k in enumerate(num_turns):
        turns = []
        for j in range(pos, pos + k):
            kind = tool[j]
            if kind == NO_TOOL:
                turns.append(Turn(gen_tokens=gen[j]))
            else:
                turns.append(Turn(gen_tokens=gen[j], tool=tool_names[kind], tool_status=STATUS_NAMES[status[j]],
                                  tool_tokens=tool_tok[j], extra={"tool_latency_s": latency[j]}))
        pos += k
        out.append(Trajectory(prompt_id=prompt_ids[i], prompt_tokens=ptoks[i], turns=tuple(turns),
                              sample=sample_list[i], step=step, reward=reward[i]))
    return out
