"""`RolloutCost.instance_time_shared` (the rollout table's fast path, issue 16) equals `instance_time` on the
expanded per-entry arrays bit for bit, for random models (dense and MoE), GPUs and workloads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.planning.instances import random_cost_model


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), tp=st.sampled_from([1, 2, 4, 8]), tool=st.sampled_from([0.0, 0.7, 3.0]))
def test_shared_equals_per_entry(seed: int, tp: int, tool: float) -> None:
    cm, rng = random_cost_model(seed, memory_gb=(16, 40, 80))
    rows = int(rng.integers(1, 12))
    caps = rng.integers(0, 9, size=rows)
    row = np.repeat(np.arange(rows), caps)
    shares = (np.arange(caps.sum()) - np.repeat(np.cumsum(caps) - caps, caps) + 1).astype(float)
    per_row = dict(
        num_requests=rng.uniform(1, 300, rows),
        decode_tokens=rng.uniform(1e2, 1e6, rows),
        prefill_tokens=rng.uniform(0, 1e6, rows),
        resident_context=rng.uniform(0.5, 9000, rows),
        max_gen=rng.uniform(10, 8000, rows),
        max_turns=rng.integers(1, 30, rows).astype(float),
        new_requests=rng.uniform(0, 300, rows) * (rng.random(rows) < 0.7),
        queued_share=np.where(rng.random(rows) < 0.5, rng.uniform(0, 0.9, rows), 0.0),
    )
    fast = cm.rollout.instance_time_shared(tp, caps, shares, tool_latency_s=tool, **per_row)
    divided = ("num_requests", "decode_tokens", "prefill_tokens", "new_requests")
    expanded = {k: (v[row] / shares if k in divided else v[row]) for k, v in per_row.items()}
    slow = cm.rollout.instance_time(tp, tool_latency_s=tool, **expanded)
    assert np.array_equal(fast, slow)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), tp=st.sampled_from([1, 2, 4, 8]), tool=st.sampled_from([0.0, 0.7, 3.0]))
def test_grid_equals_shared(seed: int, tp: int, tool: float) -> None:
    """`instance_time_grid` (the rollout table's blocks) is `instance_time_shared` laid out as rows x counts."""
    cm, rng = random_cost_model(seed, memory_gb=(16, 40, 80))
    rows, width = int(rng.integers(1, 12)), int(rng.integers(1, 9))
    per_row = dict(
        num_requests=rng.uniform(1, 300, rows),
        decode_tokens=rng.uniform(1e2, 1e6, rows),
        prefill_tokens=rng.uniform(0, 1e6, rows),
        resident_context=rng.uniform(0.5, 9000, rows),
        max_gen=rng.uniform(10, 8000, rows),
        max_turns=rng.integers(1, 30, rows).astype(float),
        new_requests=rng.uniform(0, 300, rows) * (rng.random(rows) < 0.7),
        queued_share=np.where(rng.random(rows) < 0.5, rng.uniform(0, 0.9, rows), 0.0),
    )
    shares = np.arange(1, width + 1, dtype=float)
    grid = cm.rollout.instance_time_grid(tp, shares, tool_latency_s=tool, **per_row)
    flat = cm.rollout.instance_time_shared(
        tp, np.full(rows, width), np.tile(shares, rows), tool_latency_s=tool, **per_row
    )
    assert grid.shape == (rows, width)
    assert np.array_equal(grid.ravel(), flat)
