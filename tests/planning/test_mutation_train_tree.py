"""Training-tree properties found by the whole-file mutation run of `libra/planning/train_tree.py`
(docs/testing.md, "Mutation testing"): exact ties are broken as the frontier breaks them, a pruned branch skips only
itself, a branch without an allowed micro-batch is cut, and the frontier's layouts have integer degrees."""

from __future__ import annotations

import math
import warnings

import attrs

from libra.planning.cost import BatchStats, CostModel
from libra.planning.oracle import brute_force_training, training_layouts
from libra.planning.train_tree import (
    Shape,
    TrainingSearch,
    TreeOptions,
    _heuristics_pass,
    ep_degrees,
    pp_degrees,
    tp_degrees,
)
from tests.planning.instances import sized_batch, sized_cost_model


def _without_overheads(cm: CostModel) -> CostModel:
    """No per-message latencies and no per-micro-batch overheads: micro-batches of powers of two then often cost
    exactly the same, so many GPU counts have several optimal layouts."""
    return CostModel(cm.cluster, cm.model, cm.coeffs.replace(microbatch_overhead_s=0.0, allreduce_latency_s=0.0))


def test_the_tree_keeps_the_first_of_exactly_tied_layouts_as_the_frontier_does() -> None:
    """`best` and `frontier` enumerate in the same order and keep the first layout of an exact tie, so both return
    the same layout, not only the same time."""
    tied = 0
    for seed in range(20):
        cm, rng = sized_cost_model(seed)
        cm = _without_overheads(cm)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch)
        times, configs = search.frontier(cm.cluster.num_gpus)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            assert search.best(gpus) == configs[gpus], (seed, gpus)
            optimal = 0
            for lay in training_layouts(cm, batch.num_sequences, gpus):
                args = (lay.tp, lay.pp, lay.dp, lay.ep, lay.micro_batch, lay.recompute, batch)
                if cm.training.fits(cm.training.memory_bytes(*args)):
                    optimal += float(cm.training.step_time(*args)) == times[gpus]
            tied += optimal > 1
    assert tied >= 20, tied  # exact ties are common here (65 GPU counts)


def test_a_branch_bound_equal_to_the_incumbent_cuts_the_branch_and_only_it() -> None:
    """A branch whose bound is not below the incumbent is cut (`>=`, not `>`), and the search goes on with the next
    branch (`continue`, not `break`). Real costs never tie a bound with the incumbent exactly, so every leaf here
    costs 1 s and every bound is 1 s: once a leaf is found, every later branch is cut, and the visits are every
    (TP, EP, PP) node plus the leaves of the branches up to the first one with a fitting leaf."""
    first_found_before_the_end = 0
    for seed in range(20):
        cm, rng = sized_cost_model(seed)
        search = TrainingSearch(cm, sized_batch(rng))
        real_leaf = search._leaf
        search._leaf = _one_second(real_leaf)
        search._branch_bound = lambda tp, pp, ep, dp: 1.0
        for gpus in range(1, cm.cluster.num_gpus + 1):
            best = search.best(gpus)
            visits, found, cut = 0, False, 0
            for tp, ep, pp, dp in _nodes(search, gpus):
                visits += 1
                if dp is None or not search._states_fit(tp, pp, ep, dp):
                    continue
                if found:
                    cut += 1
                    continue
                for mb in search.micro_batches(dp):
                    for recompute in search.recompute_options():
                        visits += 1
                        found |= real_leaf(_shape(tp, pp, ep, mb, recompute), dp) is not None
            assert search.nodes_visited == visits, (seed, gpus)
            assert (best is not None) == found
            first_found_before_the_end += cut > 0
    assert first_found_before_the_end >= 20, first_found_before_the_end


def test_a_pruned_branch_does_not_end_the_search_over_larger_pp_degrees() -> None:
    """Seed 249 on 12 GPUs: a branch is cut and a larger PP degree under the same TP and EP holds the optimum
    (a search that leaves the PP loop at the first cut returns 7.967 s instead of 7.838 s)."""
    cm, rng = sized_cost_model(249)
    batch = sized_batch(rng)
    search = TrainingSearch(cm, batch)
    best = search.best(12)
    assert best is not None and math.isclose(best.time_s, brute_force_training(cm, batch, 12), rel_tol=1e-12)
    smaller = [pp for pp in pp_degrees(cm) if pp < best.pp and search.valid_dp(12, best.tp, pp, best.ep) is not None]
    assert smaller  # the optimum is not the first PP degree of its (TP, EP) branch
    for gpus in range(1, cm.cluster.num_gpus + 1):
        got = search.best(gpus)
        assert math.isclose(got.time_s if got else math.inf, brute_force_training(cm, batch, gpus), rel_tol=1e-12)


def test_a_branch_without_an_allowed_micro_batch_is_cut() -> None:
    """With micro-batches of 2 only, a branch whose replicas hold an odd number of sequences has no leaf: its bound
    is infinite (the branch is cut), and the tree still equals the frontier."""
    empty = 0
    opts = TreeOptions(micro_batches=(2,))
    for seed in range(30):
        cm, rng = sized_cost_model(seed)
        search = TrainingSearch(cm, sized_batch(rng), opts)
        times, _ = search.frontier(cm.cluster.num_gpus)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            for tp, ep, pp, dp in _nodes(search, gpus):
                if dp is not None and not list(search.micro_batches(dp)):
                    assert search._branch_bound(tp, pp, ep, dp) == math.inf
                    empty += 1
            got = search.best(gpus)
            assert (got.time_s if got else math.inf) == times[gpus] or math.isclose(got.time_s, times[gpus])
    assert empty >= 10, empty


def test_frontier_layouts_have_integer_degrees() -> None:
    for seed in range(10):
        cm, rng = sized_cost_model(seed)
        _, configs = TrainingSearch(cm, sized_batch(rng)).frontier(cm.cluster.num_gpus)
        layouts = [c for c in configs if c is not None]
        assert layouts
        for c in layouts:
            assert all(type(x) is int for x in (c.num_gpus, c.tp, c.pp, c.dp, c.ep, c.micro_batch)), c


def _one_second(leaf_of):
    """`_leaf` with every fitting leaf's time set to 1 s."""
    return lambda shape, dp: (leaf := leaf_of(shape, dp)) and attrs.evolve(leaf, time_s=1.0)


def _nodes(search: TrainingSearch, gpus: int):
    """The (TP, EP, PP) nodes of `best` in its order, with their DP degree (None where invalid)."""
    for tp in tp_degrees(search.cm):
        for ep in ep_degrees(search.cm, tp):
            for pp in pp_degrees(search.cm):
                yield tp, ep, pp, search.valid_dp(gpus, tp, pp, ep)


def _shape(tp: int, pp: int, ep: int, mb: int, recompute: bool) -> Shape:
    return Shape(tp=tp, pp=pp, ep=ep, micro_batch=mb, recompute=recompute)


def test_frontier_never_evaluates_a_dp_degree_of_zero() -> None:
    """DP runs from 1: a DP of 0 would divide by zero (numpy warns and carries on; here the warning is an error)."""
    for seed in range(10):
        cm, rng = sized_cost_model(seed)
        search = TrainingSearch(cm, sized_batch(rng))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            times, _ = search.frontier(cm.cluster.num_gpus)
        assert times[0] == math.inf


def test_the_bubble_threshold_is_the_published_pipeline_bubble() -> None:
    """`max_bubble` drops a layout exactly when its pipeline bubble (pp - 1) / (pp - 1 + m), with m = sequences per
    replica / micro-batch micro-batches, exceeds the threshold: kept at the bubble itself, dropped just below it."""
    cm, _ = sized_cost_model(0)
    checked = 0
    for n in (8, 24, 64):
        batch = BatchStats(num_sequences=n, mean_len=100.0, mean_sq_len=1e4, max_len=100.0)
        for pp in (1, 2, 3, 4, 8):
            for dp in (d for d in (1, 2, 4, 8) if n % d == 0):
                for mb in (x for x in (1, 2, 4, 8) if (n // dp) % x == 0):
                    shape = Shape(tp=1, pp=pp, ep=1, micro_batch=mb, recompute=False)
                    bubble = (pp - 1) / (pp - 1 + n // dp // mb)
                    assert _heuristics_pass(cm, TreeOptions(max_bubble=bubble), shape, dp, batch), (n, pp, dp, mb)
                    below = TreeOptions(max_bubble=bubble * (1 - 1e-9) - 1e-12)
                    assert not _heuristics_pass(cm, below, shape, dp, batch), (n, pp, dp, mb)
                    checked += 1
    assert checked >= 100, checked


def _compute_only(cm: CostModel, tp: int, pp: int, mb: int, recompute: bool, batch: BatchStats) -> float:
    """A stage's compute time on `tp` GPUs: its time on one GPU (no TP communication, EP 1), without latencies and
    per-micro-batch overheads, split evenly over the TP group."""
    bare = CostModel(cm.cluster, cm.model, cm.coeffs.replace(microbatch_overhead_s=0.0, allreduce_latency_s=0.0))
    return float(bare.training.stage_time(1, pp, 1, mb, recompute, batch)) / tp


def test_the_communication_threshold_is_communication_over_compute() -> None:
    """`max_comm_ratio` drops a layout exactly when (stage time - compute time) / compute time exceeds it, the
    compute time being the stage's on one GPU without latencies and overheads, split over its TP group; with
    neither latency nor overhead, a TP-1 dense stage has a ratio of exactly 0 and is kept at threshold 0."""
    checked = with_comm = 0
    for seed in range(12):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch)
        for shape in search.shapes():
            dp = shape.ep * 2
            if batch.num_sequences % (dp * shape.micro_batch):
                continue
            args = (shape.tp, shape.pp, shape.ep, shape.micro_batch, shape.recompute, batch)
            full = float(cm.training.stage_time(*args))
            compute = _compute_only(cm, shape.tp, shape.pp, shape.micro_batch, shape.recompute, batch)
            ratio = (full - compute) / compute
            keep = TreeOptions(max_comm_ratio=ratio * (1 + 1e-6) + 1e-9)
            assert _heuristics_pass(cm, keep, shape, dp, batch), (seed, shape)
            if ratio > 1e-6:
                drop = TreeOptions(max_comm_ratio=ratio * (1 - 1e-6))
                assert not _heuristics_pass(cm, drop, shape, dp, batch), (seed, shape)
                with_comm += shape.tp > 1
            checked += 1
        bare = CostModel(cm.cluster, cm.model, cm.coeffs.replace(microbatch_overhead_s=0.0, allreduce_latency_s=0.0))
        if not cm.model.is_moe:
            shape = Shape(tp=1, pp=1, ep=1, micro_batch=1, recompute=False)
            assert _heuristics_pass(bare, TreeOptions(max_comm_ratio=0.0), shape, 1, batch)
    assert checked >= 200 and with_comm >= 50, (checked, with_comm)


def test_a_layout_reports_its_own_degrees_time_and_memory() -> None:
    """Every layout of the tree and the frontier costs, recomputed from its own fields, exactly its time and memory;
    the recompute flag is a bool (some optima use EP > 1 and some recompute, so neither field can be dropped)."""
    expert_parallel = recomputed = 0
    for seed in range(20):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch)
        _, configs = search.frontier(cm.cluster.num_gpus)
        layouts = [c for c in configs if c is not None]
        layouts += [c for c in (search.best(g) for g in range(1, cm.cluster.num_gpus + 1)) if c is not None]
        for c in layouts:
            args = (c.tp, c.pp, c.dp, c.ep, c.micro_batch, c.recompute, batch)
            assert c.time_s == float(cm.training.step_time(*args)), (seed, c)
            assert c.memory_gb == float(cm.training.memory_bytes(*args)) / 1e9, (seed, c)
            assert type(c.recompute) is bool
            expert_parallel += c.ep > 1
            recomputed += c.recompute
    assert expert_parallel >= 5 and recomputed >= 5, (expert_parallel, recomputed)


def test_without_recompute_the_search_equals_the_oracle_without_recompute() -> None:
    """`allow_recompute=False` searches only layouts that keep their activations: the tree and the frontier equal
    the oracle restricted the same way, no layout recomputes, and some GPU counts lose their only layout."""
    lost = 0
    opts = TreeOptions(allow_recompute=False)
    for seed in range(15):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch, opts)
        times, configs = search.frontier(cm.cluster.num_gpus)
        with_recompute = TrainingSearch(cm, batch).frontier(cm.cluster.num_gpus)[0]
        for gpus in range(1, cm.cluster.num_gpus + 1):
            expected = brute_force_training(cm, batch, gpus, allow_recompute=False)
            best = search.best(gpus)
            for got in (times[gpus], math.inf if best is None else best.time_s):
                assert got == expected or math.isclose(got, expected, rel_tol=1e-12), (seed, gpus)
            assert all(c is None or not c.recompute for c in (best, configs[gpus]))
            lost += math.isinf(expected) and math.isfinite(with_recompute[gpus])
    assert lost >= 3, lost


def test_a_search_that_has_not_run_the_tree_has_visited_no_node() -> None:
    """`nodes_visited` counts the nodes of the last `best` call: 0 before any (the frontier does not walk the tree)."""
    cm, rng = sized_cost_model(0)
    search = TrainingSearch(cm, sized_batch(rng))
    assert search.nodes_visited == 0
    search.frontier(cm.cluster.num_gpus)
    assert search.nodes_visited == 0


def test_tp_candidates_are_the_powers_of_two_inside_a_node_that_fit_the_heads() -> None:
    """TP degree t is a candidate exactly when it is a power of two within a node, divides the attention heads, and
    the KV heads divide it or it divides them (written out with plain loops here)."""
    degrees = set()
    for seed in range(200):
        cm, _ = sized_cost_model(60_000 + seed)
        m, node = cm.model, cm.cluster.gpus_per_node
        expected = [
            t
            for t in range(1, node + 1)
            if not t & (t - 1) and m.num_heads % t == 0 and (m.num_kv_heads % t == 0 or t % m.num_kv_heads == 0)
        ]
        assert tp_degrees(cm) == expected, (seed, node, m.num_heads, m.num_kv_heads)
        degrees.update(expected)
    assert degrees == {1, 2, 4, 8}, degrees
    cm, _ = sized_cost_model(0)
    big = CostModel(
        attrs.evolve(cm.cluster, gpus_per_node=16, num_nodes=1),
        attrs.evolve(cm.model, num_heads=32, num_kv_heads=8, hidden_size=32 * cm.model.head_dim),
    )
    assert tp_degrees(big) == [1, 2, 4, 8, 16]  # 16 GPUs to a node: TP 16
