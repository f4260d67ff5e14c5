"""A step's work and the synthetic many-turn pool, checked where mutation testing found them unchecked
(`scripts/mutation.sh workloads`, docs/testing.md): the refusals say what is wrong, a tool call on a run's last
turn is never run, a turn's generation is split evenly into segments, the content-keyed normals are standard
normal, and the pool's trajectories are whole, distinct and integral."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra.sim.manyturn import _TOOLS, many_turn_pool, resample_steps
from libra.sim.workload import content_normals, step_work
from libra.spec import SpecError
from libra.workloads import profile_from_trajectories, profiles_over_steps
from libra.workloads.trace import Trajectory, Turn


def _turn(gen: int, tool: str | None = None, tokens: int = 0, latency: float | None = None) -> Turn:
    extra = {} if latency is None else {"tool_latency_s": latency}
    return Turn(gen_tokens=gen, tool=tool, tool_tokens=tokens, extra=extra)


def test_the_refusals_say_what_is_wrong() -> None:
    with pytest.raises(SpecError, match="zero trajectories"):
        profile_from_trajectories([])
    one = [Trajectory(prompt_id="p", prompt_tokens=10, turns=(_turn(5),))]
    with pytest.raises(SpecError, match="chunk_tokens must be >= 1, got 0"):
        step_work(0, one, chunk_tokens=0)
    with pytest.raises(SpecError):
        resample_steps(one, 0, 1)  # no steps
    with pytest.raises(SpecError):
        resample_steps(one, 1, 0)  # no prompts


def test_a_tool_call_on_the_last_turn_is_never_run() -> None:
    """A run cut off on a tool turn ends there: its last call has no latency and no tool end; a call before it
    keeps its recorded latency."""
    run = Trajectory(
        prompt_id="p",
        prompt_tokens=100,
        turns=(_turn(40, "bash", 30, 3.5), _turn(20, "bash", 50, 7.0)),
    )
    work = step_work(0, [run])
    ends = [bool(work.tool_end[0, s]) for s in range(int(work.num_segments[0]))]
    latency = [float(work.latency[0, s]) for s in range(int(work.num_segments[0]))]
    assert ends == [True, False]
    assert latency == [3.5, 0.0]


@pytest.mark.parametrize("chunk", [1, 7, 64, 2048])
def test_a_turns_generation_is_split_evenly_into_segments(chunk: int) -> None:
    """Each turn's generated tokens are cut into pieces of at most `chunk` tokens that differ by at most one and
    sum to the turn's tokens."""
    rng = np.random.default_rng(chunk)
    runs = [
        Trajectory(
            prompt_id=f"p{i}",
            prompt_tokens=int(rng.integers(1, 500)),
            turns=tuple(_turn(int(rng.integers(1, 300)), "bash", 10, 1.0) for _ in range(int(rng.integers(1, 5)))),
        )
        for i in range(40)
    ]
    work = step_work(0, runs, chunk_tokens=chunk)
    for i, run in enumerate(runs):
        segs = int(work.num_segments[i])
        for t, turn in enumerate(run.turns):
            pieces = [int(work.gen[i, s]) for s in range(segs) if work.turn_of[i, s] == t]
            assert sum(pieces) == turn.gen_tokens
            assert max(pieces) <= chunk and max(pieces) - min(pieces) <= 1
            assert len(pieces) == -(-turn.gen_tokens // chunk)


def test_the_content_keyed_normals_are_standard_normal_and_independent() -> None:
    n = 20_000
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, 5_000, n)
    gen = rng.integers(1, 500, n)
    tool = rng.integers(0, 2_000, n)
    z = content_normals(prompt, gen, tool, np.arange(n), np.zeros(n, np.int64), seed=3)
    # Kolmogorov-Smirnov against the standard normal: the largest gap between the empirical and the normal CDF,
    # below its 0.1 % critical value 1.95 / sqrt(n)
    x = np.sort(z)
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    gap = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert gap < 1.95 / math.sqrt(n)
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.05
    # the same turn of the same content draws the same number, another seed another
    again = content_normals(prompt, gen, tool, np.arange(n), np.zeros(n, np.int64), seed=3)
    other = content_normals(prompt, gen, tool, np.arange(n), np.zeros(n, np.int64), seed=4)
    assert np.array_equal(z, again) and not np.allclose(z, other)


def test_the_many_turn_pool_is_whole_distinct_and_integral() -> None:
    pool = many_turn_pool(40, 4, seed=1)
    assert len(pool) == 160
    assert len({(t.prompt_id, t.sample) for t in pool}) == 160  # every sample of a prompt is its own run
    assert all(isinstance(u.gen_tokens, int | np.integer) for t in pool for u in t.turns)
    assert max(t.total_tokens for t in pool) <= 40960
    assert {u.tool for t in pool for u in t.turns if u.tool} == set(_TOOLS)
    assert len(many_turn_pool(1, 1)) == 1


def test_profiles_over_steps_follow_the_drift_window_by_window() -> None:
    """One profile per step, each over the `window_steps` steps ending there (fewer at the start), named after
    its last step."""
    runs = [
        Trajectory(prompt_id=f"p{k}-{i}", prompt_tokens=100, turns=(_turn(10 * (k + 1)),), step=k)
        for k in range(4)
        for i in range(k + 1)  # step k has k + 1 runs of 100 + 10 (k + 1) tokens
    ]
    profiles = profiles_over_steps(runs, window_steps=2, name="w")
    assert [p.name for p in profiles] == ["w@0", "w@1", "w@2", "w@3"]
    assert [p.num_samples for p in profiles] == [1, 3, 5, 7]
    assert sorted(profiles[2].total_lengths) == [120.0] * 2 + [130.0] * 3
    assert [len(p.total_lengths) for p in profiles_over_steps(runs)] == [1, 2, 3, 4]  # one step each by default
