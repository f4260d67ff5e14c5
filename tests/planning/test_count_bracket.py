"""`CountBracket` (issue 16): the planner's bisection narrows each probe's per-range count search to the positions
found for earlier limits. With any history of limits, in any order, the counts, the bucket choice and the candidate
values must be those of a search without it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning.rollout_dp import CountBracket, RolloutTable
from tests.planning.instances import sized_cost_model, skewed_groups


def _table(seed: int) -> RolloutTable:
    cm, rng = sized_cost_model(seed, max_gpus=64)
    groups = skewed_groups(rng, max_groups=6, longest=cm.rollout.kv_capacity_tokens(1) * 1.5)
    tps = tuple(tp for tp in (1, 2, 4, 8) if tp <= cm.cluster.gpus_per_node)
    return RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, tool_latency_s=0.7)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=25))
def test_a_bracketed_search_answers_as_a_plain_one(seed: int, picks: list[int]) -> None:
    table = _table(seed)
    values = np.unique(np.concatenate([*table.times.values(), [0.0, math.inf]]))
    # limits at table values (ties), between them, and beyond both ends, in an arbitrary order
    limits = [float(values[p % len(values)]) * (1.0 + 1e-9 * ((p // len(values)) % 3 - 1)) for p in picks]
    bracket = CountBracket()
    for limit in limits:
        plain, narrowed = table.min_counts(limit), table.min_counts(limit, bracket)
        assert plain.keys() == narrowed.keys()
        for tp in plain:
            np.testing.assert_array_equal(plain[tp], narrowed[tp])
        assert table.min_gpus(limit) == table.min_gpus(limit, bracket)
    for lo, hi in zip(sorted(limits), sorted(limits)[1:], strict=False):
        np.testing.assert_array_equal(table.candidates(lo, hi), table.candidates(lo, hi, bracket))
