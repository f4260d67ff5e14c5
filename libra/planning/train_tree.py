"""Training-parallelism search: the best layout for a given number of training GPUs.

The decision tree of the published system (docs/design.md), TP -> EP -> PP -> DP x micro-batch (x activation
recompute), with two kinds of pruning that can never discard the optimum:

- memory: a branch whose model states (weights, grads, optimizer shards) already exceed GPU memory at the
  largest DP it could have is cut; activations only add to that;
- bounds: the branch's own step time at micro-batch 1 without recompute, with per-message latencies and
  per-micro-batch overheads zeroed, is a lower bound on every leaf below the branch (every remaining term is
  linear in the micro-batch size, so `m` micro-batches of `mb` sequences cost at least `N/dp` of one, the bubble
  `(pp - 1)` stages at least `pp - 1` stages of one sequence, and recompute only adds a pass, which the bound
  counts when micro-batch 1 without recompute does not fit memory, since memory grows with the micro-batch; the
  DP all-reduce and the optimizer do not depend on the micro-batch). A branch whose bound is not below the
  incumbent is cut.

Validity rules: TP divides the attention heads and stays inside a node; EP divides the experts and `dp`, and a
TP x EP block stays inside a node; PP divides the layers; DP is integral and divides the global batch; the
micro-batch divides the sequences per replica. The published heuristic thresholds (bubble > 0.3, communication
ratio > 0.5) exist as options, off by default, because they can discard the optimum.

`frontier(max_gpus)` tabulates the best time for every GPU count at once (numpy over DP); it is what the global
planner uses, and tests check it against the tree and against exhaustive enumeration (`libra.planning.oracle`).
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.spec import TrainConfig

MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


@attrs.frozen(kw_only=True)
class TreeOptions:
    micro_batches: tuple[int, ...] = MICRO_BATCHES
    allow_recompute: bool = True
    max_bubble: float | None = None  # published heuristic: drop layouts whose bubble exceeds it (0.3); off
    max_comm_ratio: float | None = None  # published heuristic: drop layouts with comm/compute above it (0.5); off


@attrs.frozen(kw_only=True)
class Shape:
    """A layout without its DP degree."""

    tp: int
    pp: int
    ep: int
    micro_batch: int
    recompute: bool


def tp_degrees(cm: CostModel) -> list[int]:
    m, node = cm.model, cm.cluster.gpus_per_node
    return [
        tp
        for tp in (1, 2, 4, 8, 16)
        if tp <= node and m.num_heads % tp == 0 and (m.num_kv_heads % tp == 0 or tp % m.num_kv_heads == 0)
    ]


def ep_degrees(cm: CostModel, tp: int) -> list[int]:
    m = cm.model
    if not m.is_moe:
        return [1]
    node = cm.cluster.gpus_per_node
    return [ep for ep in range(1, m.num_experts + 1) if m.num_experts % ep == 0 and tp * ep <= node]


def pp_degrees(cm: CostModel) -> list[int]:
    return [pp for pp in range(1, cm.model.num_layers + 1) if cm.model.num_layers % pp == 0]


def _heuristics_pass(cm: CostModel, opts: TreeOptions, shape: Shape, dp: int, batch: BatchStats) -> bool:
    if opts.max_bubble is not None:
        m = batch.num_sequences / (dp * shape.micro_batch)
        if (shape.pp - 1) / (shape.pp + m - 1) > opts.max_bubble:
            return False
    if opts.max_comm_ratio is not None:
        full = cm.training.stage_time(shape.tp, shape.pp, shape.ep, shape.micro_batch, shape.recompute, batch)
        compute_only = attrs.evolve(cm.coeffs, allreduce_latency_s=0.0, microbatch_overhead_s=0.0)
        bare = CostModel(cm.cluster, cm.model, compute_only).training
        stripped = bare.stage_time(1, shape.pp, 1, shape.micro_batch, shape.recompute, batch) / shape.tp
        if (full - stripped) / max(stripped, 1e-12) > opts.max_comm_ratio:
            return False
    return True


class TrainingSearch:
    """Best training layout per GPU count for one batch (the sequences of one step)."""

    def __init__(self, cm: CostModel, batch: BatchStats, options: TreeOptions | None = None) -> None:
        self.cm, self.batch = cm, batch
        self.options = options or TreeOptions()
        self.nodes_visited = 0
        bare = attrs.evolve(cm.coeffs, allreduce_latency_s=0.0, microbatch_overhead_s=0.0)
        self._bare = CostModel(cm.cluster, cm.model, bare).training

    # --- leaves -----------------------------------------------------------------------------------------------
    def _leaf(self, shape: Shape, dp: int) -> TrainConfig | None:
        cm, b = self.cm, self.batch
        mem = float(cm.training.memory_bytes(shape.tp, shape.pp, dp, shape.ep, shape.micro_batch, shape.recompute, b))
        if not cm.training.fits(mem) or not _heuristics_pass(cm, self.options, shape, dp, b):
            return None
        t = float(cm.training.step_time(shape.tp, shape.pp, dp, shape.ep, shape.micro_batch, shape.recompute, b))
        return TrainConfig(
            num_gpus=shape.tp * shape.pp * dp,
            tp=shape.tp,
            pp=shape.pp,
            dp=dp,
            ep=shape.ep,
            micro_batch=shape.micro_batch,
            recompute=shape.recompute,
            time_s=t,
            memory_gb=mem / 1e9,
        )

    def _states_fit(self, tp: int, pp: int, ep: int, dp: int) -> bool:
        """Model states alone (no activations) fit: a memory bound for the whole subtree."""
        dense, expert = self.cm.training.params_per_gpu(tp, pp, ep)
        states = 6.0 * (dense + expert) + 12.0 * (dense / dp + expert / max(dp / ep, 1))
        return bool(self.cm.training.fits(states))

    def _branch_bound(self, tp: int, pp: int, ep: int, dp: int) -> float:
        """A lower bound on the step time of every leaf (micro-batch, recompute) below the branch: the least time
        without latencies and per-micro-batch overheads over its micro-batches. Memory grows with the micro-batch,
        so when micro-batch 1 without recompute does not fit, every leaf that fits recomputes."""
        b = self.batch
        must_recompute = not self.cm.training.fits(self.cm.training.memory_bytes(tp, pp, dp, ep, 1, False, b))
        # The bare time of each micro-batch, not only of micro-batch 1: expert GEMMs get more efficient with more
        # tokens per expert, so for an MoE model a larger micro-batch can be faster even without overheads.
        return min(
            (float(self._bare.step_time(tp, pp, dp, ep, mb, must_recompute, b)) for mb in self.micro_batches(dp)),
            default=float("inf"),
        )

    def valid_dp(self, num_gpus: int, tp: int, pp: int, ep: int) -> int | None:
        if num_gpus % (tp * pp):
            return None
        dp = num_gpus // (tp * pp)
        if self.batch.num_sequences % dp or dp % ep:
            return None
        return dp

    def micro_batches(self, dp: int) -> Iterator[int]:
        per_replica = self.batch.num_sequences // dp
        yield from (mb for mb in self.options.micro_batches if per_replica % mb == 0)

    def recompute_options(self) -> tuple[bool, ...]:
        return (False, True) if self.options.allow_recompute else (False,)

    # --- the tree ---------------------------------------------------------------------------------------------
    def best(self, num_gpus: int) -> TrainConfig | None:
        """The fastest layout on exactly `num_gpus` GPUs, or None when no layout is valid and fits."""
        best: TrainConfig | None = None
        self.nodes_visited = 0
        for tp in tp_degrees(self.cm):
            for ep in ep_degrees(self.cm, tp):
                for pp in pp_degrees(self.cm):
                    self.nodes_visited += 1
                    dp = self.valid_dp(num_gpus, tp, pp, ep)
                    if dp is None or not self._states_fit(tp, pp, ep, dp):
                        continue
                    if best is not None and self._branch_bound(tp, pp, ep, dp) >= best.time_s:
                        continue
                    for mb in self.micro_batches(dp):
                        for recompute in self.recompute_options():
                            self.nodes_visited += 1
                            leaf = self._leaf(Shape(tp=tp, pp=pp, ep=ep, micro_batch=mb, recompute=recompute), dp)
                            if leaf is not None and (best is None or leaf.time_s < best.time_s):
                                best = leaf
        return best

    # --- all GPU counts at once -------------------------------------------------------------------------------
    def shapes(self) -> Iterator[Shape]:
        for tp in tp_degrees(self.cm):
            for ep in ep_degrees(self.cm, tp):
                for pp in pp_degrees(self.cm):
                    for mb in self.options.micro_batches:
                        for recompute in self.recompute_options():
                            yield Shape(tp=tp, pp=pp, ep=ep, micro_batch=mb, recompute=recompute)

    def frontier(self, max_gpus: int) -> tuple[np.ndarray, list[TrainConfig | None]]:
        """`times[t]` = best step time on exactly t GPUs (inf where no layout exists), t = 0..max_gpus, and the
        layout achieving it. Same validity rules and tie order as `best`; exhaustive over DP, vectorised."""
        times, owners = self.frontier_owners(max_gpus)
        return times, [self.config_of(o) for o in owners]

    def config_of(self, owner: tuple[Shape, int] | None) -> TrainConfig | None:
        """The layout of one `frontier_owners` entry (None for None)."""
        return None if owner is None else self._leaf(owner[0], owner[1])

    def unit_sizes(self) -> tuple[int, ...]:
        """The GPUs of one node-resident unit (a stage's TP x EP block, `placement/problem.py`) of every layout."""
        return tuple(sorted({tp * ep for tp in tp_degrees(self.cm) for ep in ep_degrees(self.cm, tp)}))

    def frontier_owners(
        self, max_gpus: int, unit_sizes: tuple[int, ...] | None = None
    ) -> tuple[np.ndarray, list[tuple[Shape, int] | None]]:
        """`frontier` with each layout as its (shape, dp) owner, built into a `TrainConfig` only on demand
        (`config_of`): the planner reads one of the up to `max_gpus` layouts. With `unit_sizes`, only the layouts
        whose TP x EP block has one of those sizes (the planner's node-packing classes)."""
        times = np.full(max_gpus + 1, np.inf)
        owner_shape = np.full(max_gpus + 1, -1)  # per GPU count, the index in `shapes` of the owner, and its DP
        owner_dp = np.zeros(max_gpus + 1, dtype=int)
        shapes: list[Shape] = []
        cm, b, n = self.cm, self.batch, self.batch.num_sequences
        valid: dict[tuple[int, int, int], np.ndarray] = {}  # DP degrees per (TP x PP block, EP, micro-batch)
        for shape in self.shapes():
            if unit_sizes is not None and shape.tp * shape.ep not in unit_sizes:
                continue
            block = shape.tp * shape.pp
            key = (block, shape.ep, shape.micro_batch)
            dps = valid.get(key)
            if dps is None:
                dps = np.arange(1, max_gpus // block + 1)
                ok = (n % dps == 0) & (dps % shape.ep == 0)
                ok &= (n // np.maximum(dps, 1)) % shape.micro_batch == 0
                dps = valid[key] = dps[ok]
            if dps.size == 0:
                continue
            mem = cm.training.memory_bytes(shape.tp, shape.pp, dps, shape.ep, shape.micro_batch, shape.recompute, b)
            dps = dps[cm.training.fits(mem)]
            if self.options.max_bubble is not None or self.options.max_comm_ratio is not None:
                dps = np.array([d for d in dps if _heuristics_pass(cm, self.options, shape, int(d), b)], dtype=int)
            if dps.size == 0:
                continue
            t = np.atleast_1d(
                cm.training.step_time(shape.tp, shape.pp, dps, shape.ep, shape.micro_batch, shape.recompute, b)
            )
            gpus = dps * block
            better = t < times[gpus]  # one shape's GPU counts are distinct: the same as entry by entry
            if better.any():
                won = gpus[better]
                times[won], owner_shape[won], owner_dp[won] = t[better], len(shapes), dps[better]
                shapes.append(shape)
        owners = owner_shape.tolist()
        dp_of = owner_dp.tolist()
        return times, [None if k < 0 else (shapes[k], dp_of[g]) for g, k in enumerate(owners)]
