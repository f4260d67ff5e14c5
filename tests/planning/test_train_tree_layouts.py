"""Training-tree properties the time-only oracle comparison cannot see (found by mutation testing,
docs/testing.md): the frontier names the layout of every time it reports, and the EP candidates keep a TP x EP block
inside a node."""

from __future__ import annotations

import math

from libra.planning.train_tree import TrainingSearch, ep_degrees, tp_degrees
from tests.planning.instances import sized_batch, sized_cost_model


def test_every_frontier_time_comes_with_the_layout_that_achieves_it() -> None:
    checked = 0
    for seed in range(40):
        cm, rng = sized_cost_model(40_000 + seed)
        search = TrainingSearch(cm, sized_batch(rng))
        times, configs = search.frontier(cm.cluster.num_gpus)
        assert len(configs) == len(times)
        for gpus, (t, config) in enumerate(zip(times, configs, strict=True)):
            if math.isinf(t):
                assert config is None
                continue
            assert config is not None and config.num_gpus == gpus, (seed, gpus)
            assert config.tp * config.pp * config.dp == gpus and config.time_s == t
            checked += 1
    assert checked >= 100, checked


def test_ep_candidates_are_the_expert_divisors_inside_a_node() -> None:
    """For a MoE model, EP degree e is a candidate under TP t exactly when e divides the experts and the t x e block
    fits in a node (written out with plain loops here)."""
    moe = 0
    for seed in range(200):
        cm, _ = sized_cost_model(50_000 + seed)
        m, node = cm.model, cm.cluster.gpus_per_node
        for tp in tp_degrees(cm):
            expected = [e for e in range(1, m.num_experts + 1) if m.num_experts % e == 0 and tp * e <= node]
            assert ep_degrees(cm, tp) == (expected if m.is_moe else [1]), (seed, tp)
        moe += m.is_moe
    assert moe >= 30, moe
