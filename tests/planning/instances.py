"""Seeded random small planning instances shared by the oracle tests (small models on small GPUs, so memory
limits, divisibility and KV capacity all bite)."""

from __future__ import annotations

import math
import os

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.rollout_dp import bisect_min
from libra.spec import ClusterSpec, GPUSpec, LengthGroup, ModelSpec

# instances per oracle test; scripts/mutation.sh lowers it (the share thresholds are asserted at >= 1,000 only)
ORACLE_INSTANCES = int(os.environ.get("LIBRA_ORACLE_INSTANCES", "1000"))


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


# --- instances drawn to be mostly feasible, with heterogeneous lengths (the oracle tests' distribution) -------------
def sized_cost_model(
    seed: int, max_gpus: int = 16, headroom: tuple[float, float] = (0.5, 6.0)
) -> tuple[CostModel, np.random.Generator]:
    """A random model on GPUs whose memory is the rollout engine's fixed reserve plus `headroom` times the model's
    bf16 weights (log-uniform), so that most layouts and instances fit somewhere while memory still decides
    between them."""
    rng = np.random.default_rng(seed)
    model = random_model(rng)
    cluster = random_cluster(rng, max_gpus)
    factor = float(np.exp(rng.uniform(np.log(headroom[0]), np.log(headroom[1]))))
    reserve = CostCoefficients().activation_reserve_gb / CostCoefficients().gpu_memory_utilization
    gpu = attrs.evolve(cluster.gpu, memory_gb=reserve + model.weight_bytes * factor / 1e9)
    return CostModel(attrs.evolve(cluster, gpu=gpu), model), rng


def sized_batch(rng: np.random.Generator) -> BatchStats:
    lengths = rng.integers(64, 4096, size=int(rng.integers(1, 64)))
    return BatchStats.from_lengths(lengths, num_sequences=int(rng.choice([48, 96, 120, 240, 360, 720])))


def skewed_groups(
    rng: np.random.Generator, max_groups: int = 3, longest: float | None = None
) -> tuple[LengthGroup, ...]:
    """Length groups whose sizes fall and whose lengths grow geometrically: many short requests, a few long ones
    (the long tail that makes several buckets pay). `longest`: the longest request (e.g. a multiple of one
    instance's KV capacity, so that the tail needs a larger TP degree than the bulk)."""
    q = int(rng.integers(2, max_groups + 1)) if rng.random() < 0.9 else 1
    growth = float(rng.uniform(2.0, 6.0))
    base = float(rng.uniform(200, 800)) if longest is None else max(64.0, longest / growth ** (q - 1))
    count = int(rng.integers(4, 40))
    out, low = [], 50.0
    for k in range(q):
        top = base * growth**k
        mean_total = float(rng.uniform(max(low, top / 2), top))
        out.append(
            LengthGroup(
                count=max(1, count // (k * 3 + 1)),
                mean_total=mean_total,
                mean_gen=float(mean_total * rng.uniform(0.3, 0.9)),
                max_total=float(top),
                mean_turns=float(rng.integers(1, 5)),
            )
        )
        low = top
    return tuple(out)


def with_tool_tails(groups: tuple[LengthGroup, ...], rng: np.random.Generator) -> tuple[LengthGroup, ...]:
    """The groups with each request's seconds in tool calls known, as a profile with `tool_s` makes them: the
    request longest in tool calls (lognormal, heavy-tailed: sometimes far above the most turns at a 2 s call) with
    its decoded tokens, and the tool seconds of the longest decoder. Drawn from their own `rng`, so the instances
    drawn before them stay what they were."""
    out = []
    for g in groups:
        most = float(g.tail_turns * 2.0 * rng.lognormal(0.0, 1.2))
        out.append(
            attrs.evolve(
                g,
                max_tool_s=most,
                max_tool_gen=float(rng.uniform(0.0, g.tail_gen)),
                max_gen_tool_s=float(rng.uniform(0.0, most)),
            )
        )
    return tuple(out)


def table_optimum(table, gpus: int) -> float:
    """The least rollout time of a `RolloutTable`'s plans on `gpus` GPUs: the smallest limit whose fewest GPUs fit
    (inf when no limit does)."""

    def feasible(limit: float) -> bool:
        return table.min_gpus(limit)[0] <= gpus

    hi = 1.0
    while not feasible(hi):
        hi *= 4.0
        if hi > 1e30:
            return math.inf
    return bisect_min(feasible, 0.0, hi, candidates=table.candidates)
