"""Rollout-DP properties found by the whole-file mutation run of `libra/planning/rollout_dp.py` (docs/testing.md,
"Mutation testing"): every table entry is the directly computed bucket time (a middle bucket under start-small
routing, sub-token requests and a request exactly filling the KV cache included), the table is a running minimum
over the instance count even where the cost model would charge idle instances, out-of-range counts are infinite,
ties between TP degrees keep the smaller one, the instance groups' token ranges, the table's row blocks, the count
bracket's window and the work a bracketed probe does, the candidate values, and when the bisection switches to them.
"""

from __future__ import annotations

import math
import types

import attrs
import numpy as np
import pytest

from libra.planning import rollout_dp
from libra.planning.oracle import bucket_time
from libra.planning.rollout_dp import ROUTINGS, BucketChoice, CountBracket, RolloutTable, bisect_min
from libra.spec import LengthGroup
from tests.planning.instances import sized_cost_model, skewed_groups

TPS = (1, 2, 4, 8)


def _instance(seed: int, max_groups: int = 5, max_gpus: int = 8):
    cm, rng = sized_cost_model(40_000 + seed, max_gpus=max_gpus)
    groups = skewed_groups(
        rng, max_groups=max_groups, longest=cm.rollout.kv_capacity_tokens(1) * float(rng.uniform(0.3, 2.5))
    )
    return cm, groups, tuple(tp for tp in TPS if tp <= cm.cluster.gpus_per_node)


def _sub_token(cm, groups):
    """The same instance with two groups of requests shorter than one token in front (a range of them decodes
    less than one token: the DP's guards against dividing by zero must not change such ranges)."""
    tiny = (
        LengthGroup(count=1, mean_total=0.5, mean_gen=0.2, max_total=0.6, mean_turns=1.0),
        LengthGroup(count=2, mean_total=0.8, mean_gen=0.1, max_total=0.9, mean_turns=2.0),
    )
    return (*tiny, *groups[:3])


def _kv_tie(cm, groups):
    """The same instance with its longest request exactly filling one TP-1 instance's KV cache (fits: `<=`)."""
    cap = cm.rollout.kv_capacity_tokens(1)
    below = groups[-2].max_total if len(groups) > 1 else 0.0
    if not below < cap:
        return None
    last = groups[-1]
    mean = min(last.mean_total, (below + cap) / 2)
    tie = attrs.evolve(last, max_total=cap, mean_total=mean, mean_gen=last.mean_gen * mean / last.mean_total)
    return (*groups[:-1], tie)


def _cases():
    """(cm, groups, tps): skewed instances with 3-5 groups, each also with sub-token groups and with a KV tie."""
    seen = 0
    for seed in range(40):
        cm, groups, tps = _instance(seed)
        if len(groups) < 3:
            continue
        yield cm, groups, tps
        yield cm, _sub_token(cm, groups), tps
        tie = _kv_tie(cm, groups)
        if tie is not None:
            yield cm, tie, tps
        seen += 1
        if seen == 4:
            return


def _check_every_entry(cm, table: RolloutTable, groups, tps, latency: float, routing: str) -> int:
    """Every (range, TP, count) of the table against `oracle.bucket_time` (group-by-group sums, best over 1..count
    instances); counts 0 and one past the range's last are infinite. Returns the finite entries checked."""
    finite = 0
    q = len(groups)
    for start in range(q):
        for stop in range(start + 1, q + 1):
            for tp in tps:
                last = 0
                for count in range(1, table.max_gpus // tp + 1):
                    direct = bucket_time(cm, groups, start, stop, tp, count, latency, routing)
                    got = table.time(start, stop, tp, count)
                    if math.isinf(direct):
                        assert math.isinf(got), (start, stop, tp, count)
                        continue
                    # prefix sums against direct sums differ by at most 4e-15 (relative) on these instances; a
                    # sub-token range's decode-weighted context changes its time by about 2.5e-10
                    assert got == pytest.approx(direct, rel=1e-12), (start, stop, tp, count, routing)
                    finite, last = finite + 1, count
                assert math.isinf(table.time(start, stop, tp, 0))
                assert math.isinf(table.time(start, stop, tp, last + 1)), (start, stop, tp, last)
    return finite


@pytest.mark.parametrize("routing", ROUTINGS)
def test_every_table_entry_is_the_direct_bucket_time(routing: str) -> None:
    """The oracle tests compare only the buckets of optimal plans, which rarely include a middle bucket under
    start-small routing (requests both entering at its low edge and passing through to its high edge), requests
    shorter than one token, or a request exactly filling the KV cache. Here every entry of the table."""
    checked = middle = 0
    for k, (cm, groups, tps) in enumerate(_cases()):
        latency = (0.0, 2.0)[k % 2]
        table = RolloutTable(
            cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, tool_latency_s=latency, routing=routing
        )
        checked += _check_every_entry(cm, table, groups, tps, latency, routing)
        middle += len(groups) >= 3
    assert checked > 1000 and middle >= 8, (checked, middle)  # about 1,700 and 11


class _IdleCharged:
    """A rollout cost model that charges every instance `penalty` request-seconds more per request it does not
    serve (instances that would idle still cost): more instances can then be slower. Delegates the rest."""

    def __init__(self, base, penalty: float) -> None:
        self._base, self._penalty = base, penalty

    def __getattr__(self, name: str):
        return getattr(self._base, name)

    def instance_time(self, tp: int, *, num_requests, **kwargs):
        return self._base.instance_time(tp, num_requests=num_requests, **kwargs) + self._penalty / num_requests

    def instance_time_grid(self, tp: int, shares, *, num_requests, **kwargs):
        grid = self._base.instance_time_grid(tp, shares, num_requests=num_requests, **kwargs)
        return grid + self._penalty * np.asarray(shares, dtype=float)[None, :] / np.asarray(num_requests)[:, None]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_table_is_a_running_minimum_over_the_count(routing: str) -> None:
    """An instance may idle, so more instances are never slower: the table keeps the best time over 1..c instances.
    The shipped cost model is itself non-increasing in the count (every one of 168,590 entries of 400 random tables
    was already a running minimum), so a cost model that charges idle instances is used to see it."""
    rising = 0
    for cm, groups, tps in _cases():
        plain = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing)
        scale = float(np.median(np.concatenate([t[np.isfinite(t)] for t in plain.times.values()])))
        cost = _IdleCharged(cm.rollout, penalty=0.3 * scale)
        table = RolloutTable(cost, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing)
        _check_every_entry(types.SimpleNamespace(rollout=cost), table, groups, tps, 0.0, routing)
        for tp, times in table.times.items():
            offsets = table.offsets[tp]
            for a, b in zip(offsets[:-1], offsets[1:], strict=True):
                assert np.all(np.diff(times[a:b]) <= 0)
                rising += bool(np.any(np.diff(times[a:b]) == 0))  # held: the raw times rose
    assert rising >= 50, rising  # 169 and 100 on these instances


def test_the_default_tool_latency_is_zero() -> None:
    cm, groups, tps = _instance(1)
    kwargs = dict(tp_degrees=tps, max_gpus=cm.cluster.num_gpus)
    default = RolloutTable(cm.rollout, groups, **kwargs)
    zero = RolloutTable(cm.rollout, groups, tool_latency_s=0.0, **kwargs)
    for tp in zero.times:
        np.testing.assert_array_equal(default.times[tp], zero.times[tp])


def test_ties_between_degrees_keep_the_smaller_degree() -> None:
    """`min_gpus` picks per range the TP degree needing the fewest GPUs; on a tie (e.g. two TP-1 instances or one
    TP-2 instance) the smaller degree, which the bucket then reports."""
    ties = 0
    for seed in range(80):
        cm, groups, tps = _instance(seed, max_groups=4)
        table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus)
        values = np.unique(np.concatenate([t[np.isfinite(t)] for t in table.times.values()]))
        for limit in values[:: max(1, len(values) // 12)]:
            counts = table.min_counts(float(limit))
            used, buckets = table.min_gpus(float(limit))
            if not math.isfinite(used):
                continue
            for b in buckets:
                r = table._range_index(b.start, b.stop)
                gpus = {tp: int(counts[tp][r]) * tp for tp in table.tp_degrees if counts[tp][r] > 0}
                assert b.tp * b.count == min(gpus.values())
                assert b.tp == min(tp for tp, g in gpus.items() if g == b.tp * b.count), (seed, limit, gpus)
                ties += sum(g == b.tp * b.count for g in gpus.values()) > 1
    assert ties >= 30, ties  # 60 on these instances


def test_instance_groups_cover_the_lengths_bucket_by_bucket() -> None:
    """The first bucket serves from 0 tokens, each next one from where the previous ended, the last to infinity."""
    cm, _, _ = _instance(2)
    groups = tuple(
        LengthGroup(count=4, mean_total=top * 0.8, mean_gen=top * 0.5, max_total=top) for top in (3e2, 1e3, 4e3, 9e3)
    )
    table = RolloutTable(cm.rollout, groups, tp_degrees=(1,), max_gpus=4)
    buckets = [
        BucketChoice(start=0, stop=1, tp=1, count=1, time_s=1.0),
        BucketChoice(start=1, stop=3, tp=2, count=2, time_s=1.0),
        BucketChoice(start=3, stop=len(groups), tp=1, count=3, time_s=1.0),
    ]
    got = table.instance_groups(buckets)
    assert [(g.tp, g.count) for g in got] == [(1, 1), (2, 2), (1, 3)]
    assert [g.min_tokens for g in got] == [0.0, groups[0].max_total, groups[2].max_total]
    assert [g.max_tokens for g in got] == [groups[0].max_total, groups[2].max_total, math.inf]
    (only,) = table.instance_groups([BucketChoice(start=0, stop=len(groups), tp=1, count=1, time_s=1.0)])
    assert (only.min_tokens, only.max_tokens) == (0.0, math.inf)


@pytest.mark.parametrize("seed", range(6))
def test_row_blocks_partition_the_rows_greedily_within_the_size(seed: int) -> None:
    """`_row_blocks` (the table's evaluation blocks, which bound its memory): consecutive slices covering every row
    once; each block's rows times its widest row fit in `size` unless it is a single row; and a block stops only
    where the next row would not fit (so no block is needlessly small)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        caps = rng.integers(1, int(rng.choice([3, 10, 40])), size=int(rng.integers(1, 30)))
        size = int(rng.choice([1, 5, int(caps.max()), int(caps.sum()), 64]))
        blocks = rollout_dp._row_blocks(caps, size)
        assert [b.step for b in blocks] == [None] * len(blocks)
        assert [b.start for b in blocks] == [0] + [b.stop for b in blocks[:-1]]
        assert blocks[-1].stop == len(caps) and all(b.stop > b.start for b in blocks)
        for k, b in enumerate(blocks):
            rows = b.stop - b.start
            assert rows == 1 or rows * caps[b].max() <= size, (caps.tolist(), size, b)
            if k + 1 < len(blocks):
                assert (rows + 1) * caps[b.start : b.stop + 1].max() > size, (caps.tolist(), size, b)
    assert rollout_dp._row_blocks(np.array([3, 4]), 8) == [slice(0, 2)]  # exactly the size: one block
    assert rollout_dp._row_blocks(np.zeros(0, dtype=int), 8) == []


def test_a_bracket_window_is_the_nearest_limits_seen() -> None:
    """`CountBracket.window`: the floor is the positions found for the smallest limit at or above the new one, the
    ceiling those for the largest at or below it (each the tightest bound the history gives), whatever the order
    the limits came in; with none on a side, the range's own end."""
    cm, groups, tps = _instance(3)
    table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus)
    bracket = CountBracket()
    history = [5.0, 1.0, 3.0, 8.0, 2.0]
    marks = {x: np.full(len(table._all_starts), k + 100) for k, x in enumerate(history)}
    for x in history:
        bracket.add(x, marks[x])
    for limit in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 9.0):
        floor, ceil = bracket.window(table, limit)
        above = [x for x in history if x >= limit]
        below = [x for x in history if x <= limit]
        expect_floor = marks[min(above)] if above else table._all_starts
        expect_ceil = marks[max(below)] if below else table._all_ends
        np.testing.assert_array_equal(floor, expect_floor, err_msg=f"floor at {limit}")
        np.testing.assert_array_equal(ceil, expect_ceil, err_msg=f"ceil at {limit}")


class _Reads(np.ndarray):
    """A view of `_all_times` that counts its vectorised reads (one per binary-lifting level)."""

    counter = [0]

    def __getitem__(self, key):
        if isinstance(key, np.ndarray) and key.dtype.kind in "iu":  # a gather (not np.unique's boolean masks)
            self.counter[0] += 1
        return super().__getitem__(key)


def test_a_bracketed_probe_reads_a_logarithm_of_its_window() -> None:
    """A probe without a bracket lifts once per power of two up to the widest range; a probe whose limit the
    bracket has seen (a window of width 0) reads once, through `min_counts`, `min_gpus` and `candidates` alike
    (issue 16: the bracket makes a bisection's later probes cheap; no clock, the reads are counted)."""
    for seed in range(12):
        cm, groups, tps = _instance(seed, max_gpus=16)
        table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, tool_latency_s=0.5)
        widest = int(max(table._all_ends - table._all_starts, default=0))
        if widest >= 4:
            break
    assert widest >= 4
    reads = _Reads.counter
    table._all_times = table._all_times.view(_Reads)
    values = np.unique(table._all_times[np.isfinite(table._all_times)].view(np.ndarray))
    lo, hi = float(values[len(values) // 3]), float(values[2 * len(values) // 3])
    reads[0] = 0
    plain = table.min_counts(hi)
    assert reads[0] == widest.bit_length()
    window = int(max(table._first_within(lo, None) - table._first_within(hi, None)))
    between = table._first_within((lo + hi) / 2, None)
    bracket = CountBracket()
    table.min_counts(lo, bracket)
    table.min_gpus(hi, bracket)
    reads[0] = 0
    np.testing.assert_array_equal(table._first_within((lo + hi) / 2, bracket), between)
    assert reads[0] <= max(1, window.bit_length()) < widest.bit_length() + 1
    for probe in (
        lambda: table.min_counts(hi, bracket),
        lambda: table.min_gpus(hi, bracket),
        lambda: table.min_gpus(lo, bracket),
    ):
        reads[0] = 0
        probe()
        assert reads[0] <= 1, reads[0]
    reads[0] = 0
    table.candidates(lo, hi, bracket)
    assert reads[0] <= 3, reads[0]  # one per limit, one to gather the values
    for tp in plain:
        np.testing.assert_array_equal(plain[tp], table.min_counts(hi, bracket)[tp])


@pytest.mark.parametrize("routing", ROUTINGS)
def test_candidates_are_the_table_values_in_the_interval(routing: str) -> None:
    """`candidates(lo, hi)`: every distinct table value in (lo, hi], written out with a plain loop over the
    entries, with and without a bracket, at limits on table values (both ends) and between them."""
    for seed in range(6):
        cm, groups, tps = _instance(seed, max_gpus=16)
        table = RolloutTable(cm.rollout, groups, tp_degrees=tps, max_gpus=cm.cluster.num_gpus, routing=routing)
        entries = [float(x) for times in table.times.values() for x in times]
        values = sorted(set(entries))
        rng = np.random.default_rng(seed)
        bracket = CountBracket()
        for _ in range(15):
            i, j = sorted(rng.integers(0, len(values), size=2))
            lo, hi = values[i], values[j]
            if rng.random() < 0.3:
                lo, hi = lo * (1 - 1e-9), hi * (1 + 1e-9)
            expect = sorted({x for x in entries if lo < x <= hi})
            assert table.candidates(lo, hi).tolist() == expect
            assert table.candidates(lo, hi, bracket).tolist() == expect
            table.min_counts(float(rng.choice(values)), bracket)


def test_the_bisection_reaches_a_narrow_bracket_before_testing_candidates() -> None:
    """With many candidate values (a table holds thousands), the bisection narrows to a relative width of
    `switch_ratio` (1e-6) before testing them one by one: a few dozen feasibility checks, not thousands."""
    values = np.geomspace(1.0, 1000.0, 100_000)

    def candidates(lo: float, hi: float) -> np.ndarray:
        return values[(values > lo) & (values <= hi)]

    for threshold in (values[12_345], values[77_777], values[99_999]):
        calls: list[float] = []

        def feasible(t: float, threshold=threshold, calls=calls) -> bool:
            calls.append(t)
            return t >= threshold

        assert bisect_min(feasible, 0.0, 1024.0, candidates=candidates) == threshold
        assert len(calls) <= 60, len(calls)
