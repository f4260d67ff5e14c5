"""`swe-agent`: a software-engineering agent calibrated against the real coding agents of the corpus (synthetic).

What the real coding trajectories of data/corpus show (docs/corpus.md: SWE-agent demonstrations, mini-swe-agent
with gemini-3-pro on SWE-bench Verified) and `r2e-gym` does not: many short turns (a median of 11-36 turns, up to
145; generations of about 70 tokens per turn), small tool returns (median 70-160 tokens, P90 600-1,100), few
failures (2-11 % of returns are errors, timeouts rare), a prompt of 1.5-2.5K tokens (system prompt, instructions,
the issue) and a thin tail (the longest 10 % hold about 20 % of the tokens). This generator keeps those per-turn
shapes and `r2e-gym`'s drift of the mean length over training (about 2.7K -> 11.5K tokens, the paper's R2E-Gym
curve): the agent takes more turns as it learns, each turn stays small. The number of turns is set by a stop hazard
that rises with the turn count (an agent wraps up after a while), which keeps the tail thin; a per-prompt difficulty
and recent failures (a failed command is retried or followed by a fix) delay the stop.
"""

from __future__ import annotations

import numpy as np

from libra.workloads.generators._base import NO_TOOL, StepBatch, lognormal, sigmoid

NAME = "swe-agent"
TOOLS = ("bash", "edit", "view")
NUM_TRAITS = 2  # difficulty, repository verbosity (how long outputs are)
MAX_TURNS = 150


def prompt_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(lognormal(rng, 1500.0, 0.3, n), 600, 5000).astype(np.int64)


def simulate(rng: np.random.Generator, traits: np.ndarray, ptoks: np.ndarray, progress: float) -> StepBatch:
    n = len(ptoks)
    horizon = MAX_TURNS
    z = 0.6 * traits[:, 0] + 0.5 * rng.standard_normal(n)  # how much work this sample takes
    verbose = 0.5 * traits[:, 1] + 0.4 * rng.standard_normal(n)
    gen = np.zeros((n, horizon), np.int64)
    tool = np.full((n, horizon), NO_TOOL, np.int64)
    status = np.zeros((n, horizon), np.int64)
    tool_tok = np.zeros((n, horizon), np.int64)
    latency = np.zeros((n, horizon))
    num_turns = np.zeros(n, np.int64)
    alive = np.ones(n, bool)
    trouble = np.zeros(n)  # decaying count of recent failures
    think = 55.0 * (1.0 + 0.4 * progress)
    # the stop hazard: its base falls with training (more turns), it rises with the turn count
    base = -0.4 - 3.5 * progress
    for t in range(horizon):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        m = idx.size
        gen[idx, t] = np.maximum(5, lognormal(rng, think * np.exp(0.15 * z[idx]), 0.8, m)).astype(np.int64)
        num_turns[idx] = t + 1
        stop = base - 0.9 * z[idx] - 0.8 * trouble[idx] + (0.06 - 0.01 * progress) * t
        if t == 0:
            stop = stop - 4.0  # an agent always looks at the repository first
        if t == horizon - 1:
            stop = np.full(m, np.inf)
        done = idx[rng.random(m) < sigmoid(stop)]
        gen[done, t] += lognormal(rng, 120.0, 0.6, done.size).astype(np.int64)  # the submission
        alive[done] = False
        s = np.flatnonzero(alive[idx])
        s = idx[s]
        if s.size == 0:
            continue
        k = s.size
        kind = np.searchsorted(np.array([0.6, 0.8]), rng.random(k), side="right")  # bash, edit, view
        p_err = sigmoid(-2.9 + 0.4 * z[s] + 0.6 * trouble[s] + np.where(kind == 1, -0.5, 0.0))
        u = rng.random(k)
        p_timeout = np.where(kind == 0, 0.006, 0.0)
        st = np.where(u < p_err, 1, np.where(u < p_err + p_timeout, 2, 0))
        median = np.select([kind == 0, kind == 1], [110.0, 60.0], 260.0) * np.exp(0.4 * verbose[s])
        size = lognormal(rng, median, 1.3, k)
        size = np.where(st == 1, size * lognormal(rng, 1.5, 0.5, k), size)  # tracebacks, failing test logs
        size = np.where(st == 2, rng.integers(15, 60, k), size)
        tool[s, t] = kind
        status[s, t] = st
        tool_tok[s, t] = np.maximum(3, size).astype(np.int64)
        latency[s, t] = np.where(
            st == 2,
            60.0,
            np.select([kind == 0, kind == 1], [lognormal(rng, 1.2, 0.8, k), 0.2], 0.1),
        )
        trouble[s] = 0.7 * trouble[s] + (st != 0)
    reward = (rng.random(n) < sigmoid(0.5 - 0.8 * z - 0.2 * trouble)).astype(float)
    return StepBatch(
        gen_tokens=gen,
        tool=tool,
        status=status,
        tool_tokens=tool_tok,
        tool_latency_s=latency,
        num_turns=num_turns,
        reward=reward,
    )
