"""`search-r1`: multi-hop question answering with a search tool (Search-R1-like).

A question needs a number of hops (a prompt trait: the samples of a prompt search about equally often). How much a
search returns depends on the query style the policy picks for this sample: focused queries get a few short
passages, broad ones many passages, deep dives whole documents. The first query sets the style, and later queries
mostly keep it (the policy continues its own strategy), but any query may switch; broad and deep returns are read
at length and raise follow-up questions more often. A search that fails (error, timeout) is retried. Which styles
a question invites is a prompt trait; over training the policy learns to search more and dig deeper (drift).

Causality is stochastic and partial: a large first return makes a long trajectory likely, not certain (the style
may switch, the question may need one hop or six), and how many hops remain is never written in a tool return.
"""

from __future__ import annotations

import numpy as np

from libra.workloads.generators._base import NO_TOOL, StepBatch, lognormal, sigmoid

NAME = "search-r1"
TOOLS = ("search",)
NUM_TRAITS = 2  # number of hops, appetite for broad queries
MAX_TURNS = 16
_STYLE_MEDIAN = np.array([350.0, 1800.0, 5500.0])  # focused, broad, deep dive: tokens returned per search
_STYLE_FOLLOW_UP = np.array([0.0, 0.25, 0.45])  # chance that a return raises one more question


def prompt_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(lognormal(rng, 320.0, 0.3, n), 120, 1200).astype(np.int64)


def _draw_style(rng: np.random.Generator, appetite: np.ndarray, progress: float) -> np.ndarray:
    """0 focused, 1 broad, 2 deep dive; broader for prompts with appetite and later in training."""
    x = appetite + 0.5 * progress + 0.4 * rng.standard_normal(len(appetite))
    return np.where(x < 0.3, 0, np.where(x < 1.6, 1, 2))


def simulate(rng: np.random.Generator, traits: np.ndarray, ptoks: np.ndarray, progress: float) -> StepBatch:
    n = len(ptoks)
    horizon = MAX_TURNS
    hops = np.clip(np.rint(2.2 + 1.0 * traits[:, 0] + 0.8 * progress), 1, 7)
    planned = hops + (rng.random(n) < 0.1 + 0.2 * progress) - ((rng.random(n) < 0.08) & (hops > 1))
    appetite = traits[:, 1]
    style = _draw_style(rng, appetite, progress)
    gen = np.zeros((n, horizon), np.int64)
    tool = np.full((n, horizon), NO_TOOL, np.int64)
    status = np.zeros((n, horizon), np.int64)
    tool_tok = np.zeros((n, horizon), np.int64)
    latency = np.zeros((n, horizon))
    num_turns = np.zeros(n, np.int64)
    done_searches = np.zeros(n)
    prev_payload = np.zeros(n)
    alive = np.ones(n, bool)
    think = 220.0 * (1.0 + 0.8 * progress)
    for t in range(horizon):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        m = idx.size
        g = lognormal(rng, think, 0.3, m) + 0.3 * prev_payload[idx] * lognormal(rng, 1.0, 0.2, m)
        gen[idx, t] = np.maximum(8, g).astype(np.int64)
        num_turns[idx] = t + 1
        search = done_searches[idx] < planned[idx]
        if t == horizon - 1:
            search[:] = False
        answer = idx[~search]
        gen[answer, t] += lognormal(rng, 200.0 * (1.0 + progress), 0.4, answer.size).astype(np.int64)
        alive[answer] = False
        s = idx[search]
        if s.size == 0:
            continue
        k = s.size
        switch = (done_searches[s] > 0) & (rng.random(k) < 0.15)
        style[s] = np.where(switch, _draw_style(rng, appetite[s], progress), style[s])
        u = rng.random(k)
        st = np.where(u < 0.03, 1, np.where(u < 0.05, 2, 0))  # error, timeout, ok
        payload = lognormal(rng, _STYLE_MEDIAN[style[s]], 0.3, k)
        payload = np.where(st == 0, payload, rng.integers(15, 60, k))
        tool[s, t] = 0
        status[s, t] = st
        tool_tok[s, t] = payload.astype(np.int64)
        latency[s, t] = np.where(st == 2, 30.0, lognormal(rng, 0.8, 0.5, k) * (1.0 + 0.5 * style[s]))
        prev_payload[s] = payload
        done_searches[s] += st == 0  # a failed search is retried
        planned[s] += (st == 0) & (rng.random(k) < _STYLE_FOLLOW_UP[style[s]])
    reward = (rng.random(n) < sigmoid(1.0 - 0.5 * hops + 0.5 * (done_searches >= hops))).astype(float)
    return StepBatch(
        gen_tokens=gen,
        tool=tool,
        status=status,
        tool_tokens=tool_tok,
        tool_latency_s=latency,
        num_turns=num_turns,
        reward=reward,
    )
