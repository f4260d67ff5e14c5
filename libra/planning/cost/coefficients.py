"""Coefficients of the cost model: data, not code. `calibrate` fits them to measurements.

Most defaults are datasheet-style efficiencies. The engine overheads, the KV headroom and the preemption churn
(`tp_step_overhead_s`, `per_seq_overhead_s`, `per_request_overhead_s`, `kv_headroom_seqs`, `preemption_factor`)
were chosen by a grid search against the published measurements (docs/design.md) for Qwen3-14B on A800 (the
TP-1 x 8 against TP-8 throughput ratios at 0-2K and 16K-32K tokens, and the growth of rollout and training time from
1K to 32K tokens; `libra.planning.cost.published` checks them). They are the first to re-fit with `calibrate` on
measurements from your own cluster.
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs

from libra.spec import SpecError
from libra.spec.loaders import construct, read_mapping


@attrs.frozen(kw_only=True)
class CostCoefficients:
    # --- rollout (inference engine) ---------------------------------------------------------------------------
    gpu_memory_utilization: float = 0.90  # share of GPU memory the engine may use (vLLM's default)
    activation_reserve_gb: float = 6.0  # per GPU: activations, sampler and CUDA-graph workspace, not KV
    kv_fill: float = 0.80  # usable share of the KV pool (paging fragmentation, growth headroom, preemption)
    hbm_efficiency: float = 0.80  # achieved / peak HBM bandwidth for weight and KV reads in decode
    decode_mfu: float = 0.45  # achieved / peak FLOP/s for decode GEMMs when compute-bound
    prefill_mfu: float = 0.55  # achieved / peak FLOP/s for prefill
    kv_headroom_seqs: float = 4.0  # KV kept free for the growth of running sequences, in resident contexts
    preemption_factor: float = 12.0  # KV-bound decode slows by (1 + min(factor / B, max_churn)): preemption churn
    max_churn: float = 2.0  # cap on the churn term: a batch of one or two long sequences has little to preempt
    max_num_seqs: int = 512  # engine cap on concurrent sequences per instance
    step_overhead_s: float = 0.004  # host-side cost of one engine step (scheduling, sampling launch)
    tp_step_overhead_s: float = 0.005  # extra host/sync cost per step for a multi-GPU (TP > 1) instance
    per_seq_overhead_s: float = 30e-6  # per sequence per engine step (bookkeeping, detokenisation), one process
    per_request_overhead_s: float = 0.3  # per request, serial in one engine: admission, tokenising, output, tools I/O
    allreduce_latency_s: float = 9e-6  # per ring hop of one all-reduce (NCCL small-message latency)
    link_efficiency: float = 0.70  # achieved / peak NVLink or network bandwidth for collectives
    # --- training ---------------------------------------------------------------------------------------------
    train_mfu: float = 0.50  # achieved / peak FLOP/s of training GEMMs at large micro-batches
    train_attention_efficiency: float = 0.45  # attention kernels relative to GEMM efficiency
    microbatch_overhead_s: float = 0.0035  # per micro-batch per layer: kernel launches and synchronisation
    dp_overlap: float = 0.70  # share of the DP gradient all-reduce hidden behind backward
    optimizer_bytes_per_param: float = 16.0  # fp32 master + Adam m, v read and written per step
    logprob_forward_passes: int = 1  # extra forward passes per step (old-policy log-probs for GRPO/PPO)

    def replace(self, **changes: float) -> CostCoefficients:
        return attrs.evolve(self, **changes)


_INTEGER_FIELDS = ("max_num_seqs", "logprob_forward_passes")
_FRACTIONS = (
    "gpu_memory_utilization",
    "kv_fill",
    "hbm_efficiency",
    "decode_mfu",
    "prefill_mfu",
    "link_efficiency",
    "train_mfu",
    "train_attention_efficiency",
)  # divisors: in (0, 1]
_POSITIVE = ("max_num_seqs",)
_SHARES = ("dp_overlap",)  # shares: in [0, 1]
_LIMITS = {"max_num_seqs": 1_000_000, "logprob_forward_passes": 100}
_MAX_VALUE = 1e6  # every other coefficient (seconds, bytes, factors, GB) stays below it


def _check_value(path: Path, key: str, value: object) -> float | int:
    whole = key in _INTEGER_FIELDS
    number = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    high = _LIMITS.get(key, _MAX_VALUE)
    if key in _FRACTIONS:
        ok, kind = number and 0 < value <= 1, "a number in (0, 1]"
    elif key in _SHARES:
        ok, kind = number and 0 <= value <= 1, "a number in [0, 1]"
    elif key in _POSITIVE:
        ok, kind = number and 1 <= value <= high and float(value).is_integer(), f"a whole number in [1, {high:,}]"
    elif whole:
        ok, kind = number and 0 <= value <= high and float(value).is_integer(), f"a whole number in [0, {high:,}]"
    else:
        ok, kind = number and 0 <= value <= high, f"a finite number in [0, {high:g}]"
    if not ok:
        raise SpecError(f"{path}: {key} must be {kind}, got {value!r}")
    return int(value) if whole else value  # type: ignore[arg-type]


def load_coefficients(path_text: str | Path) -> CostCoefficients:
    """Coefficients from a YAML/JSON mapping of field names to values; fields left out keep their defaults.

    Write one from `calibrate`'s result with `json.dumps(attrs.asdict(coeffs))`. Efficiencies must lie in (0, 1],
    `dp_overlap` in [0, 1], `max_num_seqs` be a whole number in [1, 1e6], `logprob_forward_passes` in [0, 100],
    everything else a finite number in [0, 1e6]; a bad file raises a one-line SpecError naming the field
    (docs/files.md lists them all).
    """
    path = Path(path_text)
    data = read_mapping(path)
    known = {f.name for f in attrs.fields(CostCoefficients)}
    checked = {key: _check_value(path, key, value) if key in known else value for key, value in data.items()}
    return construct(CostCoefficients, checked, path)
