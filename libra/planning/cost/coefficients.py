"""Coefficients of the cost model: data, not code. `calibrate` fits them to measurements.

Where each default comes from (the comment on each field says which):
- [anchors: fit]: fitted with `calibrate()` to the `split: fit` rows of the published measurements in
  `libra/planning/cost/anchors/anchors.yaml` (gpt-fast batch-1 decode against TP, TensorRT-LLM static-batch
  throughput and time to first token, llm-foundry MPT training steps, NeMo AutoModel / Megatron-Bridge MoE training
  steps with expert parallelism) and checked on the held-out rows; `python -m libra.planning.cost.anchors` re-runs
  the fit and prints the MAPE per family (docs/cost-model.md).
- The engine behaviour under load (`per_seq_overhead_s`, `per_request_overhead_s`, `kv_headroom_seqs`,
  `preemption_factor`, `max_churn`) was chosen by a grid search against the published measurements
  (docs/paper.md) for Qwen3-14B on A800 (TP-1 x 8 against TP-8 throughput at 0-2K and 16K-32K tokens, growth of
  rollout and training time from 1K to 32K tokens; `libra.planning.cost.published` checks them).
- The rest are engine defaults (vLLM's memory utilisation and sequence cap) or datasheet-style values no anchor
  pins down (`decode_mfu`: decode is memory-bound in every anchor; `kv_fill`, `activation_reserve_gb`,
  `link_efficiency`, `dp_overlap`, `optimizer_bytes_per_param`).
Re-fit them with `calibrate` (or `libra profile`) on measurements from your own cluster.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import attrs

from libra.spec import SpecError
from libra.spec.loaders import construct, read_mapping


@attrs.frozen(kw_only=True)
class CostCoefficients:
    # --- rollout (inference engine) ---------------------------------------------------------------------------
    gpu_memory_utilization: float = 0.90  # share of GPU memory the engine may use (vLLM's default)
    activation_reserve_gb: float = 6.0  # per GPU: activations, sampler and CUDA-graph workspace, not KV
    kv_fill: float = 0.80  # usable share of the KV pool (paging fragmentation, growth headroom, preemption)
    hbm_efficiency: float = 0.775  # achieved / peak HBM bandwidth for weight and KV reads  [anchors: fit]
    decode_mfu: float = 0.45  # achieved / peak FLOP/s for decode GEMMs when compute-bound
    prefill_mfu: float = 0.79  # achieved / peak FLOP/s for prefill  [anchors: fit, family prefill]
    # share of the weight read a prefill pays: 1, each prefill (a prompt, a tool return, a migrated context) is a
    # forward pass of its own, as the anchors' time-to-first-token measures it (conservative); 0, it rides in a
    # decode step of the running batch, which reads the weights anyway (vLLM's chunked prefill)
    prefill_weight_share: float = 1.0
    kv_headroom_seqs: float = 4.0  # KV kept free for the growth of running sequences, in resident contexts
    preemption_factor: float = 12.0  # KV-bound decode slows by (1 + min(factor / B, max_churn)): preemption churn
    max_churn: float = 2.0  # cap on the churn term: a batch of one or two long sequences has little to preempt
    max_num_seqs: int = 512  # engine cap on concurrent sequences per instance
    step_overhead_s: float = 0.00055  # host-side cost of one engine step (scheduling, sampling)  [anchors: fit]
    tp_step_overhead_s: float = 0.0  # extra host/sync cost per step when TP > 1  [anchors: fit, family decode_tp]
    per_seq_overhead_s: float = 30e-6  # per sequence per engine step (bookkeeping, detokenisation), one process
    per_request_overhead_s: float = 0.3  # per request, serial in one engine: admission, tokenising, output, tools I/O
    allreduce_latency_s: float = 5.9e-6  # per log2 step of one small all-reduce  [anchors: fit, family decode_tp]
    link_efficiency: float = 0.70  # achieved / peak NVLink or network bandwidth for collectives
    # --- training ---------------------------------------------------------------------------------------------
    train_mfu: float = 0.586  # achieved / peak FLOP/s of training GEMMs  [anchors: fit, family train_dense]
    train_attention_efficiency: float = 0.290  # attention relative to GEMM efficiency  [anchors: train_dense]
    microbatch_overhead_s: float = 0.001  # per micro-batch per layer: launches and synchronisation  [anchors]
    dp_overlap: float = 0.70  # share of the DP gradient all-reduce hidden behind backward
    optimizer_bytes_per_param: float = 16.0  # fp32 master + Adam m, v read and written per step
    logprob_forward_passes: int = 1  # extra forward passes per step (old-policy log-probs for GRPO/PPO)
    # --- MoE (fitted to the published MoE training anchors, anchors.yaml family train_moe) ---------------------
    expert_efficiency: float = 1.0  # expert (grouped) GEMMs relative to dense ones  [anchors: fit, train_moe]
    expert_saturation_tokens: float = 1570.0  # tokens per expert GEMM at half that efficiency  [anchors: train_moe]
    # --- colocated (verl's hybrid engine: rollout and training take turns on the same GPUs) ---------------------
    # fixed seconds per switch between the two (the engine's sleep or wake): vllm-project/vime#442 measures
    # Actor.sleep() + wake_up() at 11.27 s per step (two switches) for Qwen3-0.6B on one L20 in colocate mode, where
    # moving the weights is negligible; the offload/reload and reshard terms come from bytes and bandwidths
    # (libra/planning/cost/switch.py)
    colocated_switch_s: float = 5.6
    # bytes per parameter of the trainer's state offloaded to host memory and reloaded at every switch: 0 as in
    # verl's default FSDP config (param_offload and optimizer_offload off); 16 with both on (bf16 params and grads,
    # fp32 master and Adam moments, sharded over the training GPUs)
    colocated_offload_bytes_per_param: float = 0.0
    # share of GPU memory the colocated engine may use (its KV pool follows): verl's
    # actor_rollout_ref.rollout.gpu_memory_utilization, 0.5 in its documented config (docs/examples/config.rst)
    colocated_kv_fraction: float = 0.5

    def replace(self, **changes: Any) -> CostCoefficients:
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
    "expert_efficiency",
    "colocated_kv_fraction",
)  # divisors: in (0, 1]
_POSITIVE = ("max_num_seqs",)
_SHARES = ("dp_overlap", "prefill_weight_share")  # shares: in [0, 1]
_LIMITS = {"max_num_seqs": 1_000_000, "logprob_forward_passes": 100}
_MAX_VALUE = 1e6  # every other coefficient (seconds, bytes, factors, GB) stays below it


def _check_value(path: Path, key: str, raw: object) -> float | int:
    whole = key in _INTEGER_FIELDS
    number = not isinstance(raw, bool) and isinstance(raw, int | float) and math.isfinite(raw)
    value = cast(float, raw)  # compared below only when `number` holds
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
        raise SpecError(f"{path}: {key} must be {kind}, got {raw!r}")
    return int(value) if whole else value


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
