"""Training cost: one RL training step (the policy update on a step's trajectories) for a parallel layout.

Notation: N sequences per step, mean length L, mean squared length L2, longest Lmax; layout tp x pp x dp (ep for
MoE experts, taken from dp), `mb` sequences per micro-batch, m = N / (dp * mb) micro-batches per replica,
f = 3 passes (fwd + bwd) + 1 if activations are recomputed.

    t_stage  = f * mb * (L * 2 * active_params + L2 * 2 * layers * heads * head_dim / attn_eff)
                   / (pp * tp * flops * mfu)
               + layers/pp * (tp all-reduces + ep all-to-alls + launch overhead)            (one micro-batch)
    T_pipe   = (m + pp - 1) * t_stage                                                   (1F1B with its bubble)
    T_logp   = extra forward passes for old-policy log-probs, pipelined the same way
    T_dp     = (1 - overlap) * 2 (dp-1)/dp * grad_bytes_per_gpu / bw_dp                  (partly overlapped)
    T_opt    = optimizer bytes per GPU / (hbm_bw * eff)                                  (distributed optimizer)
    T_step   = T_pipe + T_logp + T_dp + T_opt

Memory per GPU: bf16 weights + fp32 main grads (6 bytes per parameter) + fp32 master and Adam moments (12 bytes)
sharded over the data-parallel ranks (distributed optimizer) + activations of the micro-batches in flight
(1F1B keeps up to pp on the first stage) + fp32 logits of one micro-batch on the last stage.
Everything broadcasts over numpy arrays of `dp` so the planner tabulates all GPU counts at once.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from libra.planning.cost.coefficients import CostCoefficients
from libra.planning.cost.rollout import allreduce_latency
from libra.spec import ClusterSpec, ModelSpec, SpecError


@attrs.frozen(kw_only=True)
class BatchStats:
    """The sequences of one training step."""

    num_sequences: int
    mean_len: float
    mean_sq_len: float
    max_len: float

    def __attrs_post_init__(self) -> None:
        if isinstance(self.num_sequences, bool) or not isinstance(self.num_sequences, int | np.integer):
            raise SpecError(f"BatchStats: num_sequences must be a whole number, got {self.num_sequences!r}")
        if self.num_sequences < 0:
            raise SpecError(f"BatchStats: num_sequences must be >= 0, got {self.num_sequences}")
        for name in ("mean_len", "mean_sq_len", "max_len"):
            value = getattr(self, name)
            if not (isinstance(value, int | float | np.number) and math.isfinite(value) and value >= 0):
                raise SpecError(f"BatchStats: {name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def from_lengths(cls, lengths, *, num_sequences: int | None = None) -> BatchStats:
        """The statistics of `lengths`, for a step of `num_sequences` sequences (default: one per length)."""
        arr = np.asarray(lengths, dtype=float)
        if arr.size == 0:
            raise SpecError("BatchStats.from_lengths needs at least one length")
        return cls(
            num_sequences=int(len(arr) if num_sequences is None else num_sequences),
            mean_len=float(arr.mean()),
            mean_sq_len=float((arr**2).mean()),
            max_len=float(arr.max()),
        )

    @classmethod
    def uniform(cls, *, num_sequences: int, length: float) -> BatchStats:
        return cls(num_sequences=num_sequences, mean_len=length, mean_sq_len=length**2, max_len=length)


class TrainingCost:
    """Training side of the cost model for one (cluster, model) pair."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, coeffs: CostCoefficients) -> None:
        self.cluster, self.model, self.c = cluster, model, coeffs
        self.gpu = cluster.gpu

    # --- parameters per GPU -----------------------------------------------------------------------------------
    def params_per_gpu(self, tp: int, pp: int, ep: int = 1) -> tuple[float, float]:
        """(dense parameters, expert parameters) held by one GPU."""
        m = self.model
        expert = m.num_layers * m.num_experts * m.expert_params if m.is_moe else 0.0
        dense = m.num_params - expert
        return dense / (tp * pp), expert / (tp * pp * ep)

    def memory_bytes(self, tp: int, pp: int, dp, ep: int, micro_batch: int, recompute: bool, batch: BatchStats):
        m = self.model
        dense, expert = self.params_per_gpu(tp, pp, ep)
        states = 6.0 * (dense + expert) + 12.0 * (dense / dp + expert / np.maximum(dp / ep, 1))
        tokens = micro_batch * batch.max_len
        layers = m.num_layers / pp
        # layer inputs are kept (recompute) or all activations (34 * s * h bytes); sequence parallel shards both
        per_layer = tokens * m.hidden_size * m.dtype_bytes * (1.0 if recompute else 34.0) / tp
        in_flight = np.minimum(pp, np.maximum(1.0, batch.num_sequences / (dp * micro_batch)))
        working = tokens * m.hidden_size * m.dtype_bytes * 34.0 / tp  # one layer's full activations
        logits = tokens * m.vocab_size / tp * 4.0
        return states + per_layer * layers * in_flight + working + logits

    def fits(self, memory_bytes) -> np.ndarray:
        return np.asarray(memory_bytes) <= self.gpu.memory_bytes * 0.95

    # --- time -------------------------------------------------------------------------------------------------
    def _collective_bw(self, group_span_gpus) -> np.ndarray:
        """Bandwidth of a collective over a group of consecutive ranks: NVLink inside a node, network across."""
        g, c = self.gpu, self.c
        inside = np.asarray(group_span_gpus) <= self.cluster.gpus_per_node
        return np.where(inside, g.nvlink_bandwidth_gbs, g.network_bandwidth_gbs) * 1e9 * c.link_efficiency

    def expert_efficiency(self, ep: int, micro_batch: int, batch: BatchStats) -> float:
        """Efficiency of the grouped expert GEMMs relative to dense ones. Each expert of a rank multiplies the
        tokens routed to it from the `ep` ranks of its group: mb * L * k * ep / E per micro-batch. Small GEMMs run
        below peak: efficiency = expert_efficiency * t / (t + expert_saturation_tokens). This is how expert
        parallelism pays besides memory: the same micro-batch gives each expert ep times more tokens."""
        m, c = self.model, self.c
        if not m.is_moe:
            return 1.0
        tokens = micro_batch * batch.mean_len * m.experts_per_token * ep / m.num_experts
        return c.expert_efficiency * tokens / (tokens + c.expert_saturation_tokens)

    def stage_time(
        self,
        tp: int,
        pp: int,
        ep: int,
        micro_batch: int,
        recompute: bool,
        batch: BatchStats,
        passes: float | None = None,
    ) -> float:
        """Seconds for one micro-batch through one pipeline stage (forward and backward unless `passes` given)."""
        m, c, g = self.model, self.c, self.gpu
        f = passes if passes is not None else 3.0 + (1.0 if recompute else 0.0)
        expert_active = m.num_layers * m.experts_per_token * m.expert_params if m.is_moe else 0.0
        dense = micro_batch * batch.mean_len * 2.0 * (m.active_params - expert_active)
        experts = micro_batch * batch.mean_len * 2.0 * expert_active
        if experts:  # no tokens, no expert GEMMs (their efficiency at 0 tokens is 0: 0 / 0)
            experts /= self.expert_efficiency(ep, micro_batch, batch)
        attention = micro_batch * batch.mean_sq_len * 2.0 * m.num_layers * m.num_heads * m.head_dim
        compute = f * (dense + experts + attention / c.train_attention_efficiency) / (pp * tp * g.flops * c.train_mfu)
        layers = m.num_layers / pp
        act_bytes = micro_batch * batch.mean_len * m.hidden_size * m.dtype_bytes
        comm = 0.0
        if tp > 1:
            per = allreduce_latency(c, tp) + 2.0 * (tp - 1) / tp * act_bytes / (
                g.nvlink_bandwidth_gbs * 1e9 * c.link_efficiency
            )
            comm += layers * (4.0 / 3.0) * f * per  # 4 all-reduces per layer per fwd+bwd (3 passes)
        if m.is_moe and ep > 1:
            bw = float(self._collective_bw(tp * ep))
            a2a = (ep - 1) / ep * act_bytes * m.experts_per_token / bw + (ep - 1) * c.allreduce_latency_s
            comm += layers * (4.0 / 3.0) * f * a2a  # dispatch + combine, forward and backward
        overhead = layers * c.microbatch_overhead_s * f / 3.0
        return compute + comm + overhead

    def step_time(self, tp: int, pp: int, dp, ep: int, micro_batch: int, recompute: bool, batch: BatchStats):
        """Seconds for one training step; `dp` may be an array (all other factors fixed)."""
        m, c, g = self.model, self.c, self.gpu
        dp = np.asarray(dp, dtype=float)
        num_micro = batch.num_sequences / (dp * micro_batch)
        t_stage = self.stage_time(tp, pp, ep, micro_batch, recompute, batch)
        t_fwd = self.stage_time(tp, pp, ep, micro_batch, False, batch, passes=1.0)
        pipe = (num_micro + pp - 1) * t_stage
        logp = c.logprob_forward_passes * (num_micro + pp - 1) * t_fwd
        p2p = 0.0
        if pp > 1:  # activations forward and gradients backward across each stage boundary, on the critical path
            act = micro_batch * batch.mean_len * m.hidden_size * m.dtype_bytes / tp
            p2p = 2.0 * (num_micro + pp - 1) * act / self._collective_bw(tp * dp * pp)
        dense, expert = self.params_per_gpu(tp, pp, ep)
        grad_bytes = (dense + expert) * m.dtype_bytes
        dp_bw = self._collective_bw(tp * dp)
        ring = 2.0 * (dp - 1) / dp * grad_bytes / dp_bw + 2 * (dp - 1) * c.allreduce_latency_s
        allreduce = np.where(dp > 1, ring, 0.0)
        optimizer = (
            (dense / dp + expert / np.maximum(dp / ep, 1))
            * c.optimizer_bytes_per_param
            / (g.hbm_bytes_per_s * c.hbm_efficiency)
        )
        return pipe + logp + p2p + (1.0 - c.dp_overlap) * allreduce + optimizer

    def ideal_step_time(self, num_gpus, batch: BatchStats):
        """Compute-only time at perfect scaling (no bubble, communication, overhead or recompute): a lower bound
        on `step_time` for any layout with `num_gpus` GPUs."""
        m, c, g = self.model, self.c, self.gpu
        linear = batch.mean_len * 2.0 * m.active_params
        attention = batch.mean_sq_len * 2.0 * m.num_layers * m.num_heads * m.head_dim
        passes = 3.0 + c.logprob_forward_passes
        work = batch.num_sequences * passes * (linear + attention / c.train_attention_efficiency)
        return work / (np.asarray(num_gpus, dtype=float) * g.flops * c.train_mfu)
