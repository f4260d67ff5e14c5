"""Synthetic workloads: determinism, schema, drift, heavy tail, correlated samples, partial causality."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra.spec import SpecError
from libra.workloads import load_trace, write_trace
from libra.workloads.generators import WORKLOAD_NAMES, WorkloadGenerator, generate


def _lengths(trajectories) -> np.ndarray:
    return np.array([t.total_tokens for t in trajectories], float)


def test_names() -> None:
    assert WORKLOAD_NAMES == ("search-r1", "dapo-math", "r2e-gym", "swe-agent")


def test_unknown_workload_lists_the_names() -> None:
    with pytest.raises(SpecError, match="search-r1, dapo-math, r2e-gym, swe-agent"):
        WorkloadGenerator("swe-bench", seed=0)


@pytest.mark.parametrize(
    "bad", [{"num_prompts": 0}, {"samples_per_prompt": -1}, {"seed": -3}, {"drift_steps": 0}, {"max_model_len": 1.5}]
)
def test_bad_sizes(bad) -> None:
    kw = {"seed": 0, **bad}
    with pytest.raises(SpecError):
        WorkloadGenerator("search-r1", **kw)


def test_bad_step() -> None:
    with pytest.raises(SpecError):
        WorkloadGenerator("search-r1", seed=0).step(-1)
    with pytest.raises(SpecError):
        generate("search-r1", num_steps=0, seed=0)


def test_a_step_past_the_last_prompt_position_is_a_one_line_error() -> None:
    """A step's prompts are positions step * num_prompts + i (int64): past them a step was an IndexError or a numpy
    casting TypeError from deep inside, now it says which steps exist (the last one still works)."""
    gen = WorkloadGenerator("dapo-math", seed=0, num_prompts=4, samples_per_prompt=1)
    last = (2**63 - 1) // 4 - 1
    assert len(gen.step(last)) == 4
    for step in (last + 1, 2**61, 2**70):
        with pytest.raises(SpecError, match=f"step must be at most {last:,} with 4 prompts per step"):
            gen.step(step)
        with pytest.raises(SpecError, match="step must be at most"):
            gen.prompt_indices(step)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_deterministic_whatever_the_call_order(name) -> None:
    a = WorkloadGenerator(name, seed=7, num_prompts=8, samples_per_prompt=4)
    b = WorkloadGenerator(name, seed=7, num_prompts=8, samples_per_prompt=4)
    forward = [a.step(s) for s in range(5)]
    backward = {s: b.step(s) for s in reversed(range(5))}
    for s in range(5):
        assert forward[s] == backward[s]
    c = WorkloadGenerator(name, seed=8, num_prompts=8, samples_per_prompt=4)
    assert c.step(0) != forward[0]


def test_generate_concatenates_steps() -> None:
    out = generate("dapo-math", num_steps=3, seed=1, num_prompts=4, samples_per_prompt=2, start_step=5)
    assert [t.step for t in out] == [5] * 8 + [6] * 8 + [7] * 8
    assert out[8:16] == WorkloadGenerator("dapo-math", seed=1, num_prompts=4, samples_per_prompt=2).step(6)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_schema_and_cap(name, tmp_path) -> None:
    gen = WorkloadGenerator(name, seed=3, num_prompts=32, samples_per_prompt=8, max_model_len=8000)
    trajectories = gen.step(80)
    assert len(trajectories) == 256
    assert all(t.total_tokens <= 8000 for t in trajectories)
    cut = [t for t in trajectories if t.total_tokens == 8000]
    assert cut, "a cap of 8000 tokens must cut some trajectories"
    for t in trajectories:
        assert all(turn.tool is not None for turn in t.turns[:-1])
        for turn in t.turns:
            if turn.tool is not None:
                assert turn.tool in gen.tools
                assert turn.tool_status in ("ok", "error", "timeout")
                assert turn.extra["tool_latency_s"] > 0
    path = tmp_path / "trace.jsonl"
    write_trace(path, trajectories)
    assert load_trace(path) == trajectories


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_every_generated_trajectory_says_it_is_synthetic(name, tmp_path) -> None:
    """docs/design.md: generated data is called synthetic. Before, a generated trajectory had no `source` (real
    imported ones do), so a trace written by `libra trace generate` and read back looked like real data."""
    trajectories = generate(name, num_steps=2, seed=1, num_prompts=1, samples_per_prompt=3)
    assert len(trajectories) == 6 and all(t.extra == {"source": f"synthetic:{name}"} for t in trajectories)
    assert len({id(t.extra) for t in trajectories}) == 6  # each its own: a reader may add keys to one
    path = tmp_path / "trace.jsonl"
    write_trace(path, trajectories)
    assert [t.extra for t in load_trace(path)] == [{"source": f"synthetic:{name}"}] * 6


def test_samples_per_prompt_layout() -> None:
    trajectories = WorkloadGenerator("search-r1", seed=0, num_prompts=5, samples_per_prompt=3).step(2)
    ids = [t.prompt_id for t in trajectories]
    assert [t.sample for t in trajectories] == [0, 1, 2] * 5
    assert all(len(set(ids[i : i + 3])) == 1 for i in range(0, 15, 3))
    assert len(set(ids)) == 5


def test_prompts_recur_across_steps() -> None:
    gen = WorkloadGenerator("search-r1", seed=0, num_prompts=16, num_dataset_prompts=64)
    seen = [set(gen.prompt_indices(s).tolist()) for s in range(8)]
    assert set().union(*seen[:4]) == set(range(64))  # one epoch covers the data set
    assert seen[4] & set().union(*seen[:4])


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_lengths_drift_upwards(name) -> None:
    gen = WorkloadGenerator(name, seed=0, num_prompts=128, drift_steps=100)
    start, end = _lengths(gen.step(0)).mean(), _lengths(gen.step(100)).mean()
    assert end > 1.7 * start
    assert _lengths(gen.step(300)).mean() == pytest.approx(_lengths(gen.step(300)).mean())


def test_r2e_gym_drift_and_heavy_tail() -> None:
    gen = WorkloadGenerator("r2e-gym", seed=0, num_prompts=512)
    first = np.sort(_lengths(gen.step(0)))
    last = _lengths(gen.step(100))
    assert 2000 < first.mean() < 3200
    assert 9500 < last.mean() < 13500
    top = first[int(0.9 * len(first)) :].sum() / first.sum()
    assert top > 0.5


def _prompt_share_of_variance(trajectories) -> float:
    logs = np.log(_lengths(trajectories))
    groups: dict[str, list[float]] = {}
    for t, x in zip(trajectories, logs):
        groups.setdefault(t.prompt_id, []).append(x)
    means = np.array([np.mean(g) for g in groups.values()])
    return float(np.var(means) / np.var(logs))


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_same_prompt_samples_are_correlated_but_differ(name) -> None:
    trajectories = WorkloadGenerator(name, seed=2, num_prompts=128).step(40)
    share = _prompt_share_of_variance(trajectories)
    assert 0.15 < share < 0.85


def test_search_payload_informs_but_does_not_decide_the_rest() -> None:
    trajectories = WorkloadGenerator("search-r1", seed=4, num_prompts=256).step(30)
    first, rest = [], []
    for t in trajectories:
        if len(t.turns) >= 2:
            first.append(math.log1p(t.turns[0].tool_tokens))
            rest.append(math.log1p(t.total_tokens - t.context_after(1)))
    r = float(np.corrcoef(first, rest)[0, 1])
    assert 0.1 < r < 0.8


def test_r2e_gym_failures_raise_the_rest_without_deciding_it() -> None:
    trajectories = WorkloadGenerator("r2e-gym", seed=4, num_prompts=256).step(30)
    rest = {"ok": [], "failed": []}
    for t in trajectories:
        if len(t.turns) >= 2:
            key = "ok" if t.turns[0].tool_status == "ok" else "failed"
            rest[key].append(t.total_tokens - t.context_after(1))
    ok, failed = np.array(rest["ok"]), np.array(rest["failed"])
    assert failed.mean() > 2 * ok.mean()
    assert np.mean(failed < np.median(ok)) > 0.05  # some failures are followed by little more work
    assert np.mean(ok > np.median(failed)) > 0.05  # and some successes by a lot
