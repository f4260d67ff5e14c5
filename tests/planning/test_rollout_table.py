"""Rollout table and bisection properties the oracle comparisons cannot see (found by mutation testing,
docs/testing.md): input errors, the chunked table build, a table with no usable TP degree, and how many
feasibility checks the exact bisection spends."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra.planning import rollout_dp
from libra.planning.rollout_dp import ROUTINGS, RolloutTable, bisect_min
from libra.spec import SpecError
from tests.planning.instances import sized_cost_model, skewed_groups


def _instance(seed: int = 3):
    cm, rng = sized_cost_model(seed, max_gpus=16)
    groups = skewed_groups(rng, max_groups=5, longest=cm.rollout.kv_capacity_tokens(1) * 1.5)
    return cm, groups


def test_bad_routing_and_admission_delay_are_one_clear_error() -> None:
    cm, groups = _instance()
    with pytest.raises(SpecError, match="unknown rollout routing 'oracle'; expected one of start-small, final-length"):
        RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=4, routing="oracle")
    for delay in (-0.1, 1.0, math.nan):
        with pytest.raises(SpecError, match="admission_delay must be in"):
            RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=4, admission_delay=delay)
    RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=4, admission_delay=0.0)  # both ends of [0, 1)
    RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=4, admission_delay=0.999)


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_table_does_not_depend_on_the_chunk_size(monkeypatch, routing: str, chunk: int) -> None:
    """The table is evaluated in blocks of about `_GRID` grid entries to bound memory; every blocking gives the same
    table bit for bit (the default block holds these small tables in one piece, so it is the reference)."""
    for seed in (0, 1, 9):
        cm, groups = _instance(seed)
        tps = tuple(tp for tp in (1, 2, 4) if tp <= cm.cluster.gpus_per_node)
        kwargs = dict(tp_degrees=tps, max_gpus=cm.cluster.num_gpus, tool_latency_s=1.0, routing=routing)
        reference = RolloutTable(cm.rollout, groups, **kwargs)
        assert reference.num_entries > 2 * chunk  # several chunks below
        monkeypatch.setattr(rollout_dp, "_GRID", chunk)
        chunked = RolloutTable(cm.rollout, groups, **kwargs)
        monkeypatch.undo()
        assert reference.times.keys() == chunked.times.keys()
        for tp in reference.times:
            np.testing.assert_array_equal(reference.offsets[tp], chunked.offsets[tp])
            np.testing.assert_array_equal(reference.times[tp], chunked.times[tp])


def test_a_table_without_a_usable_degree_has_no_plan() -> None:
    cm, groups = _instance()
    table = RolloutTable(cm.rollout, groups, tp_degrees=(2, 4), max_gpus=1)
    assert table.tp_degrees == () and table.num_entries == 0
    assert table.candidates(0.0, math.inf).size == 0
    assert table.min_gpus(math.inf) == (math.inf, [])
    assert table.fluid_gpu_seconds() == math.inf


def _counting(threshold: float):
    calls = []

    def feasible(t: float) -> bool:
        calls.append(t)
        return t >= threshold

    return feasible, calls


@pytest.mark.parametrize("threshold", [3e-4, 0.37, 0.9, 7.5, 1234.5])
def test_bisection_is_exact_and_switches_to_the_candidates(threshold: float) -> None:
    """With the candidates given, the bisection narrows the bracket to a relative width of `switch_ratio` (about
    20 halvings of the log width from a factor of 2) and then tests the candidates in the bracket: the exact answer
    in few feasibility checks, sub-second answers included."""
    values = np.array(sorted({threshold, threshold * (1 + 1e-9), threshold * 0.5, threshold * 3}))

    def candidates(lo: float, hi: float) -> np.ndarray:
        return values[(values > lo) & (values <= hi)]

    feasible, calls = _counting(threshold)
    hi = 1.0
    while hi < threshold:
        hi *= 4.0
    assert bisect_min(feasible, 0.0, hi, candidates=candidates) == threshold
    assert len(calls) <= 50, len(calls)


@pytest.mark.parametrize("threshold", [3e-4, 0.37, 7.5])
def test_bisection_without_candidates_stops_at_adjacent_floats(threshold: float) -> None:
    """Without candidates the bisection ends once no float lies strictly between the bracket's ends (the answer is
    then the smallest feasible float), well before its iteration cap."""
    feasible, calls = _counting(threshold)
    got = bisect_min(feasible, 0.0, 8192.0)
    assert got == threshold  # the threshold is a float: the smallest feasible one
    assert np.nextafter(got, 0.0) < threshold
    assert len(calls) < 150, len(calls)
