"""Training-parallelism search: exact against exhaustive enumeration; layouts consistent with the cluster."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning.cost import BatchStats, CostModel
from libra.planning.oracle import brute_force_training
from libra.planning.train_tree import TrainingSearch, TreeOptions, ep_degrees, pp_degrees, tp_degrees
from libra.spec import ClusterSpec, get_gpu, get_model
from tests.planning.instances import ORACLE_INSTANCES, random_batch, random_cost_model, sized_batch, sized_cost_model


@pytest.mark.slow  # 1-4 CPU-minutes each on the 2-core machine, 3-11 wall-minutes when it is loaded
def test_tree_and_frontier_equal_brute_force_on_1000_instances() -> None:
    """1,000 random instances, every GPU count of each; the oracle (`libra.planning.oracle.brute_force_training`)
    writes the layout rules out again and enumerates them with plain loops. The draw (GPU memory sized to the
    model, batches with many divisors) keeps >= 70 % of the (instance, GPU count) pairs feasible."""
    pairs = feasible = 0
    for seed in range(ORACLE_INSTANCES):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch)
        times, configs = search.frontier(cm.cluster.num_gpus)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            expected = brute_force_training(cm, batch, gpus)
            pairs += 1
            feasible += math.isfinite(expected)
            best = search.best(gpus)
            got = math.inf if best is None else best.time_s
            assert got == pytest.approx(expected, rel=1e-12) or got == expected == math.inf, (seed, gpus)
            assert times[gpus] == pytest.approx(expected, rel=1e-12) or times[gpus] == expected == math.inf
            if configs[gpus] is not None:
                assert configs[gpus].time_s == pytest.approx(times[gpus], rel=1e-12)
    print(f"training oracle: {100 * feasible / pairs:.1f} % of {pairs} (instance, GPU count) pairs feasible")
    assert ORACLE_INSTANCES < 1000 or feasible >= 0.7 * pairs, (feasible, pairs)


def _visits_without_bound_pruning(search: TrainingSearch, num_gpus: int) -> int:
    """The nodes `best` visits when only validity and memory prune: every (TP, EP, PP) node, and the leaves of
    every node whose DP is valid and whose model states fit (written out from the tree's rules)."""
    visits = 0
    for tp in tp_degrees(search.cm):
        for ep in ep_degrees(search.cm, tp):
            for pp in pp_degrees(search.cm):
                visits += 1
                dp = search.valid_dp(num_gpus, tp, pp, ep)
                if dp is not None and search._states_fit(tp, pp, ep, dp):
                    visits += len(list(search.micro_batches(dp))) * len(search.recompute_options())
    return visits


def test_bound_pruning_skips_work_on_the_default_scenario() -> None:
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8)
    cm = CostModel(cluster, get_model("Qwen3-14B"))
    batch = BatchStats.from_lengths(
        np.random.default_rng(0).lognormal(8, 0.8, 4096).clip(100, 40960), num_sequences=8192
    )
    search = TrainingSearch(cm, batch)
    best = search.best(32)
    pruned_visits = search.nodes_visited
    brute = brute_force_training(cm, batch, 32)
    assert best is not None and best.time_s == pytest.approx(brute)
    unpruned = _visits_without_bound_pruning(TrainingSearch(cm, batch), 32)
    print(f"bound pruning: {pruned_visits} of {unpruned} nodes visited")
    assert pruned_visits <= 0.7 * unpruned  # the branch bound cuts a third of the work (128 of 200 visited)


def test_published_thresholds_are_off_by_default_and_can_lose_the_optimum() -> None:
    assert TreeOptions().max_bubble is None and TreeOptions().max_comm_ratio is None
    lost = 0
    for seed in range(300):
        cm, rng = random_cost_model(seed)
        batch = random_batch(rng)
        exact = TrainingSearch(cm, batch).frontier(cm.cluster.num_gpus)[0]
        pruned = TrainingSearch(cm, batch, TreeOptions(max_bubble=0.3, max_comm_ratio=0.5)).frontier(
            cm.cluster.num_gpus
        )[0]
        assert np.all(pruned >= exact - 1e-9)  # a heuristic can only lose, never win
        lost += int(np.any(pruned > exact * (1 + 1e-9)))
    assert lost > 0  # on some instances the published thresholds discard the optimum


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_layouts_are_consistent_with_the_cluster(seed: int) -> None:
    cm, rng = random_cost_model(seed)
    batch = random_batch(rng)
    _, configs = TrainingSearch(cm, batch).frontier(cm.cluster.num_gpus)
    for gpus, config in enumerate(configs):
        if config is None:
            continue
        assert config.tp * config.pp * config.dp == gpus == config.num_gpus
        assert config.tp * config.ep <= cm.cluster.gpus_per_node  # TP and EP groups stay inside a node
        assert config.dp % config.ep == 0 and cm.model.num_experts % config.ep == 0
        assert cm.model.num_layers % config.pp == 0
        assert batch.num_sequences % (config.dp * config.micro_batch) == 0
        assert config.memory_gb * 1e9 <= cm.cluster.gpu.memory_bytes


def _branches(search: TrainingSearch, num_gpus: int):
    for tp in tp_degrees(search.cm):
        for ep in ep_degrees(search.cm, tp):
            for pp in pp_degrees(search.cm):
                dp = search.valid_dp(num_gpus, tp, pp, ep)
                if dp is not None:
                    yield tp, pp, ep, dp


def test_memory_cut_is_exactly_the_model_states() -> None:
    """`_states_fit` cuts a branch exactly when the model states alone (memory_bytes of an empty batch: no
    activations, no logits) do not fit: never more (that would lose layouts), never less (that would waste work)."""
    cut = kept = 0
    for seed in range(150):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        empty = BatchStats(num_sequences=batch.num_sequences, mean_len=0.0, mean_sq_len=0.0, max_len=0.0)
        search = TrainingSearch(cm, batch)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            for tp, pp, ep, dp in _branches(search, gpus):
                states_only = cm.training.memory_bytes(tp, pp, dp, ep, 1, True, empty)
                expected = bool(cm.training.fits(states_only))
                assert search._states_fit(tp, pp, ep, dp) == expected, (seed, tp, pp, ep, dp)
                cut += not expected
                kept += expected
    assert cut >= 20 and kept >= 20  # both sides of the cut are exercised (28 cut here)


def test_branch_bound_never_exceeds_a_leaf_below_it() -> None:
    """The bound is a lower bound on every fitting leaf (micro-batch, recompute) of its branch, and tight enough to
    be reached or nearly reached somewhere."""
    tight = 0
    for seed in range(150):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        if seed % 2:  # without latencies and per-micro-batch overheads the bound is reached exactly
            bare = cm.coeffs.replace(microbatch_overhead_s=0.0, allreduce_latency_s=0.0)
            cm = CostModel(cm.cluster, cm.model, bare)
        search = TrainingSearch(cm, batch)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            for tp, pp, ep, dp in _branches(search, gpus):
                bound = search._branch_bound(tp, pp, ep, dp)
                leaves = [
                    float(cm.training.step_time(tp, pp, dp, ep, mb, rc, batch))
                    for mb in search.micro_batches(dp)
                    for rc in (False, True)
                    if cm.training.fits(cm.training.memory_bytes(tp, pp, dp, ep, mb, rc, batch))
                ]
                assert all(bound <= t * (1 + 1e-12) for t in leaves), (seed, tp, pp, ep, dp)
                tight += bool(leaves) and min(leaves) <= bound * 1.05
    assert tight >= 10  # within 5 % of the best leaf on some branches


def test_nodes_visited_counts_every_node_and_leaf(monkeypatch) -> None:
    """With the bound switched off the search visits exactly the (TP, EP, PP) nodes and the leaves of every branch
    that is valid and whose states fit, and its layouts have integer degrees."""
    monkeypatch.setattr(TrainingSearch, "_branch_bound", lambda self, tp, pp, ep, dp: -np.inf)
    for seed in range(40):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch)
        for gpus in range(1, cm.cluster.num_gpus + 1):
            best = search.best(gpus)
            assert search.nodes_visited == _visits_without_bound_pruning(search, gpus), (seed, gpus)
            if best is not None:
                assert all(type(x) is int for x in (best.tp, best.pp, best.dp, best.ep, best.micro_batch))


@pytest.mark.parametrize("options", [TreeOptions(max_bubble=0.3), TreeOptions(max_comm_ratio=0.5)])
def test_frontier_applies_each_published_threshold_alone_as_the_tree_does(options: TreeOptions) -> None:
    for seed in range(60):
        cm, rng = sized_cost_model(seed)
        batch = sized_batch(rng)
        search = TrainingSearch(cm, batch, options)
        times, configs = search.frontier(cm.cluster.num_gpus)
        assert len(times) == len(configs) == cm.cluster.num_gpus + 1
        for gpus in range(1, cm.cluster.num_gpus + 1):
            best = search.best(gpus)
            expected = math.inf if best is None else best.time_s
            assert times[gpus] == pytest.approx(expected, rel=1e-12) or times[gpus] == expected == math.inf
