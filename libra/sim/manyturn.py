"""A synthetic many-turn agent trace (SWE-agent-like), and steps resampled from a pool of trajectories.

`many_turn_pool` draws trajectories shaped like recorded software-engineering agents: a median of ~35 turns and up
to ~145, ~70 generated tokens per turn, tool returns of hundreds to thousands of tokens, ~21K tokens per trajectory
on average, and a tool wall time on every turn (`extra["tool_latency_s"]`). It is **synthetic** (each trajectory's
`extra["source"]` says so): the numbers are the shape the simulator must hold on (docs/sim.md, "Many-turn agents"),
not a recording. `resample_steps` builds statistically identical steps from one pool (prompt groups drawn with
replacement), the check that a simulated step does not depend on the step before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libra.spec import SpecError
from libra.workloads.trace import Trajectory, Turn

__all__ = ["many_turn_pool", "resample_steps"]

_TOOLS = ("bash", "edit", "view", "search", "run_tests")
_SOURCE = {"source": "synthetic:many-turn"}  # written to a trace and read back, it still says it is synthetic


def many_turn_pool(
    num_prompts: int,
    samples_per_prompt: int,
    *,
    seed: int = 0,
    median_turns: float = 35.0,
    max_turns: int = 145,
    gen_per_turn: float = 70.0,
    tool_median_tokens: float = 330.0,
    max_model_len: int = 40960,
    tool_median_s: float = 2.0,
) -> list[Trajectory]:
    """`num_prompts x samples_per_prompt` synthetic many-turn trajectories (samples of a prompt alike in length:
    they share the prompt's difficulty). Turns are lognormal around `median_turns`, clipped to [2, max_turns]; a
    trajectory whose context would pass `max_model_len` ends there, as an agent run does at its context limit."""
    if num_prompts < 1 or samples_per_prompt < 1:
        raise SpecError("many_turn_pool needs at least one prompt and one sample")
    rng = np.random.default_rng([seed, 35])
    out: list[Trajectory] = []
    for p in range(num_prompts):
        difficulty = rng.normal(0.0, 0.55)  # shared by the samples of a prompt
        prompt = int(rng.integers(1200, 3200))
        for s in range(samples_per_prompt):
            n = int(np.clip(round(median_turns * np.exp(difficulty + rng.normal(0.0, 0.35))), 2, max_turns))
            gen = np.maximum(8, rng.lognormal(np.log(gen_per_turn) - 0.18, 0.6, n)).astype(np.int64)
            # long runs read shorter tool outputs per turn (they fit the context by doing so)
            scale = tool_median_tokens * min(1.0, median_turns / n) ** 0.8
            tool = np.maximum(20, rng.lognormal(np.log(scale), 1.0, n)).astype(np.int64)
            lat = tool_median_s * np.exp(0.9 * rng.standard_normal(n))
            names = rng.integers(0, len(_TOOLS), n)
            ctx = prompt + np.cumsum(gen + tool)
            keep = max(1, int(np.searchsorted(ctx, max_model_len - gen_per_turn * 4, side="right")))
            n = min(n, keep)
            turns = []
            for j in range(n):
                last = j == n - 1
                turns.append(
                    Turn(
                        gen_tokens=int(gen[j]),
                        tool=None if last else _TOOLS[int(names[j])],
                        tool_status=None if last else "ok",
                        tool_tokens=0 if last else int(tool[j]),
                        extra={} if last else {"tool_latency_s": round(float(lat[j]), 3)},
                    )
                )
            out.append(
                Trajectory(
                    prompt_id=f"swe-{p}", sample=s, prompt_tokens=prompt, turns=tuple(turns), extra=dict(_SOURCE)
                )
            )
    return out


def resample_steps(pool: Sequence[Trajectory], num_steps: int, num_prompts: int, *, seed: int = 0) -> list[Trajectory]:
    """`num_steps` steps of `num_prompts` prompt groups each, drawn with replacement from the pool's prompts (a
    group keeps all its samples; a prompt in several steps of the pool is a group in each): statistically identical
    steps, labelled 0..num_steps-1. Each keeps its trajectory's `source` (a real trace's, or synthetic), nothing
    else of its `extra`."""
    groups: dict[tuple[int, str], list[Trajectory]] = {}
    for t in pool:
        groups.setdefault((-1 if t.step is None else t.step, t.prompt_id), []).append(t)
    ids = sorted(groups)
    if not ids or num_steps < 1 or num_prompts < 1:
        raise SpecError("resample_steps needs a non-empty pool, num_steps >= 1 and num_prompts >= 1")
    rng = np.random.default_rng([seed, 36])
    out: list[Trajectory] = []
    for step in range(num_steps):
        for i, g in enumerate(rng.integers(0, len(ids), num_prompts)):
            for t in groups[ids[int(g)]]:
                out.append(
                    Trajectory(
                        prompt_id=f"{t.prompt_id}@{step}.{i}",
                        sample=t.sample,
                        step=step,
                        prompt_tokens=t.prompt_tokens,
                        turns=t.turns,
                        extra={"source": t.extra["source"]} if "source" in t.extra else {},
                    )
                )
    return out
