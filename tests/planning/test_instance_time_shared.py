"""`RolloutCost.instance_time_grid` (the rollout table's fast path, issue 16) equals `instance_time` on the
expanded per-entry arrays bit for bit, for random models (dense and MoE), GPUs and workloads."""

from __future__ import annotations

import attrs
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning.cost import CostModel
from tests.planning.instances import random_cost_model


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    tp=st.sampled_from([1, 2, 4, 8]),
    tool=st.sampled_from([0.0, 0.7, 3.0]),
    tails=st.booleans(),
)
def test_grid_equals_per_entry(seed: int, tp: int, tool: float, tails: bool) -> None:
    cm, rng = random_cost_model(seed, memory_gb=(16, 40, 80))
    # every engine term switched on (the default TP step overhead is 0, which hid a grid that dropped it for TP-2),
    # drawn from their own generator so the workload drawn below stays what it was
    extra = np.random.default_rng([seed, 3])
    coeffs = attrs.evolve(
        cm.coeffs,
        tp_step_overhead_s=float(extra.uniform(1e-4, 3e-3)),
        step_overhead_s=float(extra.uniform(1e-4, 3e-3)),
        per_seq_overhead_s=float(extra.uniform(1e-6, 1e-4)),
        allreduce_latency_s=float(extra.uniform(1e-6, 3e-5)),
        prefill_weight_share=float(extra.choice([1.0, 0.0, extra.uniform(0, 1)])),
    )
    cm = CostModel(cm.cluster, cm.model, coeffs)
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
    if tails:  # each request's tool seconds known: the chain of the longest decoder, in tools or in total
        most = rng.lognormal(1.0, 1.5, rows)
        last = (rng.uniform(0, 1, rows) * per_row["max_gen"], rng.lognormal(1.0, 1.5, rows))  # longest in total
        per_row["tool_tail"] = (rng.uniform(0, 1, rows) * most, rng.uniform(0, 8000, rows), most, *last)
    shares = np.arange(1, width + 1, dtype=float)
    grid = cm.rollout.instance_time_grid(tp, shares, tool_latency_s=tool, **per_row)
    assert grid.shape == (rows, width)
    row, k = np.repeat(np.arange(rows), width), np.tile(shares, rows)
    divided = ("num_requests", "decode_tokens", "prefill_tokens", "new_requests")
    expanded = {name: (v[row] / k if name in divided else v[row]) for name, v in per_row.items() if name != "tool_tail"}
    if tails:
        expanded["tool_tail"] = tuple(x[row] for x in per_row["tool_tail"])
    slow = cm.rollout.instance_time(tp, tool_latency_s=tool, **expanded)
    assert np.array_equal(grid.ravel(), slow)
