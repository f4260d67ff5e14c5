"""When expert parallelism pays (docs/cost-model.md): the grouped expert GEMMs of an MoE layer get ep times more
tokens per expert under EP, and small GEMMs run below peak (fitted to the published MoE training anchors)."""

from __future__ import annotations

import attrs
import pytest

from libra.planning.cost import BatchStats, CostModel
from libra.planning.train_tree import TrainingSearch
from libra.spec import ClusterSpec, get_gpu, get_model


def _search(gpu: str, length: int, coeffs=None) -> TrainingSearch:
    cluster = ClusterSpec.from_total(gpu=get_gpu(gpu), num_gpus=64, gpus_per_node=8)
    cm = CostModel(cluster, get_model("Qwen3-30B-A3B"), coeffs)
    return TrainingSearch(cm, BatchStats.uniform(num_sequences=512, length=length))


def test_expert_efficiency_grows_with_tokens_per_expert() -> None:
    tc = _search("H100-80GB", 4096).cm.training
    batch = BatchStats.uniform(num_sequences=512, length=4096)
    effs = [tc.expert_efficiency(ep, 1, batch) for ep in (1, 2, 4, 8)]
    assert effs == sorted(effs) and effs[0] < 0.5 * effs[-1] and effs[-1] <= 1.0
    dense = ClusterSpec.from_total(gpu=get_gpu("H100-80GB"), num_gpus=8, gpus_per_node=8)
    assert CostModel(dense, get_model("Qwen3-14B")).training.expert_efficiency(1, 1, batch) == 1.0


@pytest.mark.parametrize("gpus", [16, 32])
def test_ep_pays_for_qwen3_30b_a3b_on_h100(gpus: int) -> None:
    """With 16+ H100s EP-8 beats every EP-1 layout (PP or TP to fit the experts); without the GEMM-size effect
    (expert_saturation_tokens = 0) the same search never picks EP > 1: that effect is why EP pays."""
    best = _search("H100-80GB", 2048).best(gpus)
    assert best is not None and best.ep > 1
    flat = _search("H100-80GB", 2048).cm.coeffs
    no_effect = _search("H100-80GB", 2048, attrs.evolve(flat, expert_saturation_tokens=0.0)).best(gpus)
    assert no_effect is not None and no_effect.ep == 1


def test_ep_does_not_fit_on_one_node_without_sharding_the_rest() -> None:
    """On 8 GPUs the dense parameters, grads and activations of Qwen3-30B-A3B at EP-8 x DP-8 exceed 80 GB in this
    model (NeMo AutoModel's 8-GPU EP-8 anchor also shards them with FSDP), so the search uses TP/PP instead."""
    best = _search("H100-80GB", 2048).best(8)
    assert best is not None and best.ep == 1


@pytest.mark.parametrize("ep", [1, 8])
def test_an_moe_step_of_zero_tokens_costs_no_more_than_one_of_one_token(ep: int) -> None:
    """At zero tokens the expert GEMMs' efficiency is 0 and their work 0: the step time was 0 / 0
    (ZeroDivisionError); no tokens means no expert GEMMs, and more tokens never cost less."""
    tc = _search("H100-80GB", 4096).cm.training
    times = [
        float(tc.step_time(1, 1, 16, ep, 1, False, BatchStats.uniform(num_sequences=64, length=n)))
        for n in (0.0, 1.0, 100.0)
    ]
    assert all(t > 0 for t in times) and times == sorted(times), times
