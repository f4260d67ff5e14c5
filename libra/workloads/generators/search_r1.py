"""`search-r1`: multi-turn web search (Search-R1-like).

Each turn the policy reasons, then either issues a search or answers. A search returns retrieved passages whose
size varies with the prompt's topic and the query; the policy reads what it got, so a large payload makes the next
generation longer and makes another search likelier (the documents raise follow-up questions). Failed searches
(error, timeout) return a short message and are usually retried. Difficulty is a prompt trait that every sample of
the prompt shares, blurred per sample. Over training the policy learns to search more and reason longer.

Causality is stochastic: a payload is one noisy draw of the trajectory's verbosity, and whether to search again is
a coin whose odds it merely shifts.
"""

from __future__ import annotations

import numpy as np

from libra.workloads.generators._base import NO_TOOL, StepBatch, lognormal, sigmoid

NAME = "search-r1"
TOOLS = ("search",)
NUM_TRAITS = 2  # difficulty, topic verbosity
MAX_TURNS = 12


def prompt_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(lognormal(rng, 320.0, 0.3, n), 120, 1200).astype(np.int64)


def simulate(rng: np.random.Generator, traits: np.ndarray, ptoks: np.ndarray, progress: float) -> StepBatch:
    n = len(ptoks)
    horizon = MAX_TURNS
    # per-sample latents: shared prompt trait plus per-sample noise (same-prompt samples correlate ~0.5-0.6)
    z = 0.75 * traits[:, 0] + 0.66 * rng.standard_normal(n)  # how hard the question is for this sample
    v = 0.7 * traits[:, 1] + 0.7 * rng.standard_normal(n)  # how verbose the retrieved documents tend to be
    gen = np.zeros((n, horizon), np.int64)
    tool = np.full((n, horizon), NO_TOOL, np.int64)
    status = np.zeros((n, horizon), np.int64)
    tool_tok = np.zeros((n, horizon), np.int64)
    latency = np.zeros((n, horizon))
    num_turns = np.zeros(n, np.int64)
    alive = np.ones(n, bool)
    prev_payload = np.zeros(n)
    prev_failed = np.zeros(n, bool)
    searches = np.zeros(n)
    think_scale = 1.0 + 0.9 * progress
    for t in range(horizon):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        m = idx.size
        read = 0.22 * prev_payload[idx] * np.exp(0.25 * z[idx])  # reasoning about what was retrieved
        g = lognormal(rng, 110.0 * think_scale * np.exp(0.2 * z[idx]), 0.45, m) + read * lognormal(rng, 1.0, 0.35, m)
        gen[idx, t] = np.maximum(8, g).astype(np.int64)
        num_turns[idx] = t + 1
        logit = (1.6 + 0.8 * progress + 0.9 * z[idx] - 0.55 * t
                 + 0.5 * np.log1p(prev_payload[idx] / 1500.0) + 1.5 * prev_failed[idx])
        if t == horizon - 1:
            logit = np.full(m, -np.inf)
        search = rng.random(m) < sigmoid(logit)
        answer = idx[~search]
        gen[answer, t] += lognormal(rng, 160.0 * think_scale, 0.5, answer.size).astype(np.int64)
        alive[answer] = False
        s = idx[search]
        if s.size == 0:
            continue
        k = s.size
        u = rng.random(k)
        st = np.where(u < 0.03, 1, np.where(u < 0.05, 2, 0))  # error, timeout, ok
        # top-k passages: size follows the trajectory's verbosity; one in ten queries pulls a long document
        payload = lognormal(rng, 700.0 * np.exp(0.55 * v[s] + 0.25 * progress), 0.45, k)
        payload *= np.where(rng.random(k) < 0.1, lognormal(rng, 3.5, 0.4, k), 1.0)
        payload = np.where(st == 0, payload, rng.integers(15, 60, k))
        tool[s, t] = 0
        status[s, t] = st
        tool_tok[s, t] = payload.astype(np.int64)
        latency[s, t] = np.where(st == 2, 30.0, lognormal(rng, 0.8, 0.5, k))
        prev_payload[s] = np.where(st == 0, payload, prev_payload[s] * 0.5)
        prev_failed[s] = st != 0
        searches[s] += 1
    reward = (rng.random(n) < sigmoid(0.8 - 1.2 * z + 0.3 * np.minimum(searches, 3))).astype(float)
    return StepBatch(gen_tokens=gen, tool=tool, status=status, tool_tokens=tool_tok, tool_latency_s=latency,
                     num_turns=num_turns, reward=reward)
