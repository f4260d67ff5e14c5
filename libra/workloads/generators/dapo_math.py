"""`dapo-math`: competition math with long chains of thought (DAPO-Math-17K-like).

Most trajectories are one long generation with no tool. Some samples call a python interpreter a few times to
check arithmetic; the output is short, an error (a traceback) makes the policy think longer before it retries.
Lengths spread widely: the reasoning budget follows the prompt's difficulty with a wide per-sample spread, and it
grows as the policy learns to think longer.
"""

from __future__ import annotations

import numpy as np

from libra.workloads.generators._base import NO_TOOL, StepBatch, lognormal, sigmoid

NAME = "dapo-math"
TOOLS = ("python",)
NUM_TRAITS = 2  # difficulty, tool affinity
MAX_TURNS = 6


def prompt_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(lognormal(rng, 180.0, 0.35, n), 60, 800).astype(np.int64)


def simulate(rng: np.random.Generator, traits: np.ndarray, ptoks: np.ndarray, progress: float) -> StepBatch:
    n = len(ptoks)
    horizon = MAX_TURNS
    z = 0.8 * traits[:, 0] + 0.6 * rng.standard_normal(n)
    budget = lognormal(rng, 2600.0 * (1.0 + 1.6 * progress) * np.exp(0.55 * z), 0.55, n)  # total reasoning tokens
    uses_tools = rng.random(n) < sigmoid(-1.6 + 1.2 * traits[:, 1])
    gen = np.zeros((n, horizon), np.int64)
    tool = np.full((n, horizon), NO_TOOL, np.int64)
    status = np.zeros((n, horizon), np.int64)
    tool_tok = np.zeros((n, horizon), np.int64)
    latency = np.zeros((n, horizon))
    num_turns = np.ones(n, np.int64)
    remaining = budget.copy()
    alive = uses_tools.copy()
    for t in range(horizon - 1):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        m = idx.size
        share = remaining[idx] * rng.uniform(0.15, 0.5, m)  # reasoning before this python call
        gen[idx, t] = np.maximum(20, share).astype(np.int64)
        remaining[idx] -= share
        u = rng.random(m)
        st = np.where(u < 0.18 + 0.06 * np.clip(z[idx], -2, 2), 1, np.where(u < 0.22, 2, 0))
        tool[idx, t] = 0
        status[idx, t] = st
        tool_tok[idx, t] = np.where(st == 1, lognormal(rng, 260.0, 0.5, m), lognormal(rng, 40.0, 0.8, m)).astype(
            np.int64
        )
        latency[idx, t] = np.where(st == 2, 10.0, lognormal(rng, 0.3, 0.6, m))
        remaining[idx] += np.where(st != 0, lognormal(rng, 600.0, 0.6, m), 0.0)  # a failure costs more thinking
        num_turns[idx] = t + 2
        alive[idx] = rng.random(m) < np.where(st != 0, 0.75, 0.35)
    last = num_turns - 1
    rows = np.arange(n)
    gen[rows, last] = np.maximum(30, remaining).astype(np.int64)
    reward = (rng.random(n) < sigmoid(0.5 - 1.3 * z)).astype(float)
    return StepBatch(
        gen_tokens=gen,
        tool=tool,
        status=status,
        tool_tokens=tool_tok,
        tool_latency_s=latency,
        num_turns=num_turns,
        reward=reward,
    )
