"""`r2e-gym`: a software-engineering agent with bash, python and file-edit tools (R2E-Gym-like).

The agent explores the repository, edits files and runs tests. Errors (a failing test, a traceback) and timeouts
trigger retries and fixes: each failure raises the odds of more turns and of more failures, so a minority of
trajectories spiral into very long ones (the heavy tail: the longest 10% hold over half of all tokens). Outputs of
bash (grep, test logs) are sometimes huge. Over training the agent learns to take more turns and think longer
(mean length grows about 2.5K -> 11.5K tokens).

Causality is partial: a failure makes more work likely, not certain, and a success may still be followed by more.
"""

from __future__ import annotations

import numpy as np

from libra.workloads.generators._base import NO_TOOL, StepBatch, lognormal, sigmoid

NAME = "r2e-gym"
TOOLS = ("bash", "python", "edit")
NUM_TRAITS = 2  # difficulty, repository noisiness (how verbose tool outputs are)
MAX_TURNS = 40


def prompt_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(lognormal(rng, 650.0, 0.3, n), 250, 4000).astype(np.int64)


def simulate(rng: np.random.Generator, traits: np.ndarray, ptoks: np.ndarray, progress: float) -> StepBatch:
    n = len(ptoks)
    horizon = MAX_TURNS
    z = 0.75 * traits[:, 0] + 0.66 * rng.standard_normal(n)
    noise = 0.7 * traits[:, 1] + 0.7 * rng.standard_normal(n)
    gen = np.zeros((n, horizon), np.int64)
    tool = np.full((n, horizon), NO_TOOL, np.int64)
    status = np.zeros((n, horizon), np.int64)
    tool_tok = np.zeros((n, horizon), np.int64)
    latency = np.zeros((n, horizon))
    num_turns = np.zeros(n, np.int64)
    alive = np.ones(n, bool)
    trouble = np.zeros(n)  # decaying count of recent failures
    think = 60.0 * (1.0 + 2.2 * progress)
    for t in range(horizon):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        m = idx.size
        g = lognormal(rng, think * np.exp(0.2 * z[idx] + 0.25 * trouble[idx]), 0.6, m)
        gen[idx, t] = np.maximum(10, g).astype(np.int64)
        num_turns[idx] = t + 1
        logit = -1.0 + 2.6 * progress + 0.8 * z[idx] + 1.3 * trouble[idx] - 0.05 * t
        if t == 0:
            logit = logit + 3.0  # an agent always looks at the repository first
        if t == horizon - 1:
            logit = np.full(m, -np.inf)
        act = rng.random(m) < sigmoid(logit)
        done = idx[~act]
        gen[done, t] += lognormal(rng, 150.0 * (1.0 + progress), 0.5, done.size).astype(np.int64)  # final summary
        alive[done] = False
        s = idx[act]
        if s.size == 0:
            continue
        k = s.size
        kind = np.searchsorted(np.array([0.45, 0.7]), rng.random(k), side="right")  # bash, python, edit
        p_err = sigmoid(-2.0 + 0.7 * z[s] + 0.5 * trouble[s] + np.where(kind == 2, -0.6, 0.0))
        u = rng.random(k)
        p_timeout = np.where(kind == 2, 0.0, 0.04)
        st = np.where(u < p_err, 1, np.where(u < p_err + p_timeout, 2, 0))
        base = np.select([kind == 0, kind == 1], [300.0, 220.0], 120.0) * np.exp(0.45 * noise[s])
        size = lognormal(rng, base, 1.1, k)
        size = np.where(st == 1, size * lognormal(rng, 3.0, 0.5, k), size)  # tracebacks and failing test logs
        size = np.where(st == 2, rng.integers(20, 80, k), size)
        tool[s, t] = kind
        status[s, t] = st
        tool_tok[s, t] = np.maximum(5, size).astype(np.int64)
        latency[s, t] = np.where(
            st == 2,
            60.0,
            np.select([kind == 0, kind == 1], [lognormal(rng, 1.5, 0.8, k), lognormal(rng, 4.0, 0.8, k)], 0.3),
        )
        trouble[s] = 0.8 * trouble[s] + (st != 0)
    reward = (rng.random(n) < sigmoid(0.3 - 1.1 * z - 0.2 * trouble)).astype(float)
    return StepBatch(
        gen_tokens=gen,
        tool=tool,
        status=status,
        tool_tokens=tool_tok,
        tool_latency_s=latency,
        num_turns=num_turns,
        reward=reward,
    )
