"""The published measurements (docs/paper.md) as scenarios the cost model is checked against.

Qwen3-14B on one node of 8 A800-80GB, a batch of 512 requests:
- 0-2K tokens: eight TP-1 instances 1852 tok/s against one TP-8 instance 591 tok/s (ratio 3.13);
- 16K-32K tokens: TP-1 x 8 430 tok/s against TP-8 1220 tok/s (ratio 2.84 the other way);
- from 1K to 32K tokens rollout latency grew 95x and training time 3.9x.

The digest does not say how the 1K/32K growth was measured. We read it as: rollout = time to finish a batch of
512 requests of that length on the 8 GPUs (best layout); training = one step on the same number of tokens
(verl-style dynamic batch size packs a token budget per micro-batch), best layout. Both readings, and the
other one (same number of sequences), are printed by `published_checks()` so nobody is misled.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.train_tree import TrainingSearch
from libra.spec import ClusterSpec, get_gpu, get_model

PUBLISHED = {
    "short_tp1x8_over_tp8": 1852 / 591,
    "long_tp8_over_tp1x8": 1220 / 430,
    "rollout_growth_1k_32k": 95.0,
    "training_growth_1k_32k": 3.9,
}


@attrs.frozen(kw_only=True)
class PublishedCheck:
    name: str
    model_value: float
    published: float

    @property
    def relative_error(self) -> float:
        return self.model_value / self.published - 1.0


def _node(coeffs: CostCoefficients | None) -> CostModel:
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=8, gpus_per_node=8)
    return CostModel(cluster, get_model("Qwen3-14B"), coeffs)


def serve_batch(cm: CostModel, tp: int, totals: np.ndarray, prompt: float) -> tuple[float, float]:
    """(seconds, decode tokens/s) for 8 // tp instances of degree tp sharing `totals` evenly."""
    count = cm.cluster.gpus_per_node // tp
    totals = np.asarray(totals, dtype=float)
    gen = totals - prompt
    n = len(totals) / count
    resident = float(np.sum(gen * (totals - gen / 2)) / np.sum(gen))
    t = float(
        cm.rollout.instance_time(
            tp,
            num_requests=n,
            decode_tokens=gen.sum() / count,
            prefill_tokens=prompt * n,
            resident_context=resident,
            max_gen=gen.max(),
        )
    )
    return t, float(gen.sum() / t)


def best_training_step(cm: CostModel, batch: BatchStats) -> float:
    """Least step time over every layout of the node (the planner's own exhaustive training search)."""
    best = TrainingSearch(cm, batch).best(cm.cluster.gpus_per_node)
    return math.inf if best is None else best.time_s


def published_checks(coeffs: CostCoefficients | None = None, *, seed: int = 0) -> list[PublishedCheck]:
    cm = _node(coeffs)
    rng = np.random.default_rng(seed)
    short, long = rng.uniform(256, 2048, 512), rng.uniform(16384, 32768, 512)
    _, short_tp1 = serve_batch(cm, 1, short, 256)
    _, short_tp8 = serve_batch(cm, 8, short, 256)
    _, long_tp1 = serve_batch(cm, 1, long, 1024)
    _, long_tp8 = serve_batch(cm, 8, long, 1024)

    def rollout(length: float, prompt: float) -> float:
        totals = np.full(512, length)
        return min(serve_batch(cm, tp, totals, prompt)[0] for tp in (1, 2, 4, 8) if cm.rollout.fits(tp, length))

    tokens = 512 * 1024
    train_1k = best_training_step(cm, BatchStats.uniform(num_sequences=512, length=1024))
    train_32k_tokens = best_training_step(cm, BatchStats.uniform(num_sequences=tokens // 32768, length=32768))
    train_32k_seqs = best_training_step(cm, BatchStats.uniform(num_sequences=512, length=32768))
    return [
        PublishedCheck(
            name="short_tp1x8_over_tp8", model_value=short_tp1 / short_tp8, published=PUBLISHED["short_tp1x8_over_tp8"]
        ),
        PublishedCheck(
            name="long_tp8_over_tp1x8", model_value=long_tp8 / long_tp1, published=PUBLISHED["long_tp8_over_tp1x8"]
        ),
        PublishedCheck(
            name="rollout_growth_1k_32k",
            model_value=rollout(32768, 1024) / rollout(1024, 256),
            published=PUBLISHED["rollout_growth_1k_32k"],
        ),
        PublishedCheck(
            name="training_growth_1k_32k",
            model_value=train_32k_tokens / train_1k,
            published=PUBLISHED["training_growth_1k_32k"],
        ),
        PublishedCheck(
            name="training_growth_1k_32k_same_sequences", model_value=train_32k_seqs / train_1k, published=float("nan")
        ),
    ]
