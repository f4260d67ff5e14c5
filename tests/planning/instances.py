"""Seeded random small planning instances shared by the oracle tests (small models on small GPUs, so memory
limits, divisibility and KV capacity all bite)."""

from __future__ import annotations

import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.spec import ClusterSpec, GPUSpec, LengthGroup, ModelSpec


def random_model(rng: np.random.Generator) -> ModelSpec:
    heads = int(rng.choice([4, 8, 16]))
    kv = int(rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0]))
    head_dim = int(rng.choice([32, 64, 128]))
    layers = int(rng.choice([2, 4, 6, 8, 12]))
    moe = bool(rng.random() < 0.3)
    return ModelSpec(
        name="random",
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden_size=int(rng.choice([2, 3, 4])) * heads * head_dim,
        vocab_size=int(rng.choice([8_000, 32_000, 64_000])),
        num_experts=int(rng.choice([4, 8])) if moe else 1,
        experts_per_token=2 if moe else 1,
        moe_ffn_hidden_size=heads * head_dim if moe else None,
    )


def random_cluster(
    rng: np.random.Generator, max_gpus: int = 16, memory_gb: tuple[float, ...] = (0.5, 1, 2, 4, 16)
) -> ClusterSpec:
    gpn = int(rng.choice([2, 4, 8]))
    nodes = int(rng.integers(1, max(1, max_gpus // gpn) + 1))
    gpu = GPUSpec(
        name="g",
        memory_gb=float(rng.choice(memory_gb)),
        bf16_tflops=float(rng.uniform(50, 1000)),
        hbm_bandwidth_gbs=float(rng.uniform(500, 5000)),
        nvlink_bandwidth_gbs=float(rng.uniform(50, 500)),
        network_bandwidth_gbs=float(rng.uniform(5, 50)),
    )
    return ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpn)


def random_batch(rng: np.random.Generator) -> BatchStats:
    lengths = rng.integers(64, 4096, size=int(rng.integers(1, 64)))
    return BatchStats.from_lengths(lengths, num_sequences=int(rng.choice([8, 16, 24, 32, 64, 96])))


def random_groups(rng: np.random.Generator, max_groups: int = 3) -> tuple[LengthGroup, ...]:
    q = int(rng.integers(1, max_groups + 1))
    tops = np.sort(rng.uniform(200, 6000, size=q))
    out, low = [], 100.0
    for top in tops:
        mean_total = float(rng.uniform(low, top))
        out.append(
            LengthGroup(
                count=int(rng.integers(1, 40)),
                mean_total=mean_total,
                mean_gen=float(mean_total * rng.uniform(0.2, 0.9)),
                max_total=float(top),
                mean_turns=float(rng.integers(1, 5)),
            )
        )
        low = float(top)
    return tuple(out)


def random_cost_model(
    seed: int, max_gpus: int = 16, memory_gb: tuple[float, ...] = (0.5, 1, 2, 4, 16)
) -> tuple[CostModel, np.random.Generator]:
    rng = np.random.default_rng(seed)
    return CostModel(random_cluster(rng, max_gpus, memory_gb), random_model(rng)), rng
