"""Exhaustive oracles for the planner's solvers, for tests on small instances.

They share the cost functions (`CostModel.training` / `CostModel.rollout`, `BatchStats`, the length groups of
`WorkloadProfile.groups`) with the solvers and nothing else: the validity rules of a layout are written out here
again from the design (not imported from `train_tree`), the planner's batch is rebuilt from the RL settings and the
profile (not taken from the planner), and the rollout side lists every bucket split, TP degree and instance count
with plain loops, computing each bucket's work group by group (no prefix sums, no tables, no bisection, no pruning).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.spec import LengthGroup, RLSettings, WorkloadProfile

# the micro-batch sizes the design allows (sequences per micro-batch)
ORACLE_MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


@attrs.frozen(kw_only=True)
class Layout:
    tp: int
    pp: int
    dp: int
    ep: int
    micro_batch: int
    recompute: bool


def training_layouts(
    cm: CostModel, num_sequences: int, num_gpus: int, allow_recompute: bool = True
) -> Iterator[Layout]:
    """Every valid layout on exactly `num_gpus` GPUs, memory not checked. The rules, from the design: TP is a power
    of two inside a node that divides the attention heads, and the KV heads divide it or it divides them; PP
    divides the layers; DP = GPUs / (TP PP) is integral and divides the global batch; EP divides the experts and
    DP, and a TP x EP block stays inside a node (dense models: EP = 1); the micro-batch divides the sequences of
    one replica."""
    m, node = cm.model, cm.cluster.gpus_per_node
    for tp in range(1, node + 1):
        if tp & (tp - 1) or m.num_heads % tp or (m.num_kv_heads % tp and tp % m.num_kv_heads):
            continue
        for pp in range(1, m.num_layers + 1):
            if m.num_layers % pp or num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if num_sequences % dp:
                continue
            experts = m.num_experts if m.num_experts > 1 else 1
            for ep in range(1, experts + 1):
                if experts % ep or dp % ep or tp * ep > node:
                    continue
                for mb in ORACLE_MICRO_BATCHES:
                    if (num_sequences // dp) % mb:
                        continue
                    for recompute in (False, True) if allow_recompute else (False,):
                        yield Layout(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=mb, recompute=recompute)


def brute_force_training(cm: CostModel, batch: BatchStats, num_gpus: int, allow_recompute: bool = True) -> float:
    """Least step time over every valid layout on exactly `num_gpus` GPUs that fits memory (inf if none)."""
    best = math.inf
    for lay in training_layouts(cm, batch.num_sequences, num_gpus, allow_recompute):
        args = (lay.tp, lay.pp, lay.dp, lay.ep, lay.micro_batch, lay.recompute, batch)
        if cm.training.fits(cm.training.memory_bytes(*args)):
            best = min(best, float(cm.training.step_time(*args)))
    return best


def bucket_time(
    cm: CostModel,
    groups: tuple[LengthGroup, ...],
    start: int,
    stop: int,
    tp: int,
    count: int,
    tool_latency_s: float = 0.0,
    routing: str = "start-small",
    admission_delay: float = 0.5,
) -> float:
    """Time of `count` instances of degree `tp` serving bucket groups[start:stop], computed directly: each group's
    piece of work (from context lo to the end of the group or, passing through, to the bucket's limit hi) is listed
    one by one. An instance may idle, so the time is the best over 1..count instances."""
    flow = routing == "start-small"
    hi = groups[stop - 1].max_total
    lo = groups[start - 1].max_total if flow and start > 0 else 0.0
    pieces = []  # (requests, decoded tokens each, context at the end of the piece)
    for k, g in enumerate(groups):
        ratio = g.mean_gen / g.mean_total
        if start <= k < stop:
            pieces.append((g.count, ratio * (g.mean_total - lo), g.mean_total))
        elif k >= stop and flow:
            pieces.append((g.count, ratio * (hi - lo), hi))
    n = sum(p[0] for p in pieces)
    if count > math.ceil(n) or not cm.rollout.fits(tp, hi):
        return math.inf
    decode = sum(m * d for m, d, _ in pieces)
    prefill = sum(m * (end - d) for m, d, end in pieces)
    resident = sum(m * d * (end - d / 2) for m, d, end in pieces) / max(decode, 1e-9)
    fresh = (n if start == 0 else 0.0) if flow else n
    # the whole chain of the range's longest decoder (any group of the range: groups are sorted by total length, not
    # by decoded tokens), and the most turns of any request of the range; the first of ties, found by plain loops
    longest, max_turns = groups[start], 0.0
    for g in groups[start:stop]:
        if g.tail_gen > longest.tail_gen:
            longest = g
        max_turns = max(max_turns, g.tail_turns)
    max_gen = longest.tail_gen
    tool_tail = None  # the chain's three requests where tool seconds are known (`RolloutCost.instance_time`)
    paced = None
    if all(g.max_tool_s is not None and g.max_gen_tool_s is not None for g in groups):
        most = groups[start]  # the request longest in tool calls, the first of ties
        for g in groups[start:stop]:
            if (g.max_tool_s or 0.0) > (most.max_tool_s or 0.0):
                most = g
        last = groups[stop - 1]  # its longest decoder: the request longest in total
        tool_tail = (longest.max_gen_tool_s, most.max_tool_gen, most.max_tool_s, last.tail_gen, last.max_gen_tool_s)
        # the fourth: the request whose chain is the longest at the step time of a batch of one, among each group's
        # `chain_reps` (the upper hull of its requests' chains, else its longest decoder and its request longest in
        # tool calls; in that order, the first of ties)
        step1 = float(cm.rollout.decode_step_time(tp, 1.0, resident))
        best_chain = -math.inf
        for g in groups[start:stop]:
            for gen, tools in g.chain_reps:
                if step1 * gen + tools > best_chain:
                    paced, best_chain = (gen, tools), step1 * gen + tools
    best = math.inf
    for c in range(1, count + 1):
        t = cm.rollout.instance_time(
            tp,
            num_requests=n / c,
            decode_tokens=decode / c,
            prefill_tokens=prefill / c,
            resident_context=resident,
            max_gen=max_gen,
            max_turns=max_turns,
            tool_latency_s=tool_latency_s,
            new_requests=fresh / c,
            queued_share=admission_delay if flow and start > 0 else 0.0,
            tool_tail=tool_tail,
            paced_tail=paced,
        )
        best = min(best, float(t))
    return best


def _splits(q: int) -> Iterator[list[tuple[int, int]]]:
    """Every way to cut groups 0..q-1 into contiguous ranges (2^(q-1) of them), by plain recursion."""
    if q == 0:
        yield []
        return
    for first in range(q):  # the last range is [first, q)
        for head in _splits(first):
            yield head + [(first, q)]


@attrs.frozen(kw_only=True)
class RolloutOptimum:
    time_s: float
    buckets: tuple[tuple[int, int, int, int], ...]  # (start, stop, tp, count) of an optimal plan
    single_bucket_s: float  # the best plan with one bucket only

    @property
    def multi_bucket(self) -> bool:
        """The optimum needs more than one bucket: every single-bucket plan is strictly slower."""
        return math.isfinite(self.time_s) and self.time_s < self.single_bucket_s * (1 - 1e-9)


def rollout_optimum(
    cm: CostModel,
    groups: tuple[LengthGroup, ...],
    gpus: int,
    tp_options: tuple[int, ...],
    tool_latency_s: float = 0.0,
    routing: str = "start-small",
    admission_delay: float = 0.5,
) -> RolloutOptimum:
    """Least rollout makespan with at most `gpus` GPUs: every split into buckets, and for each bucket every TP
    degree and instance count within the GPUs left (depth-first over the buckets)."""
    best: tuple[float, tuple] = (math.inf, ())
    single = math.inf
    for ranges in _splits(len(groups)):

        def assign(k: int, left: int, worst: float, chosen: tuple, ranges: list = ranges) -> None:
            nonlocal best
            if worst >= best[0]:
                return  # cannot beat the best so far (equal is no better)
            if k == len(ranges):
                best = (worst, chosen)
                return
            a, b = ranges[k]
            for tp in tp_options:
                for c in range(1, left // tp + 1):
                    t = bucket_time(cm, groups, a, b, tp, c, tool_latency_s, routing, admission_delay)
                    if math.isfinite(t):
                        assign(k + 1, left - tp * c, max(worst, t), chosen + ((a, b, tp, c),))

        assign(0, gpus, 0.0, ())
        if len(ranges) == 1:
            single = best[0]
    return RolloutOptimum(time_s=best[0], buckets=best[1], single_bucket_s=single)


def brute_force_rollout(
    cm: CostModel,
    groups: tuple[LengthGroup, ...],
    gpus: int,
    tp_options: tuple[int, ...],
    tool_latency_s: float = 0.0,
    routing: str = "start-small",
) -> float:
    return rollout_optimum(cm, groups, gpus, tp_options, tool_latency_s, routing).time_s


@attrs.frozen(kw_only=True)
class PlanOptimum:
    makespan_s: float
    train_gpus: int  # GPUs the optimal training layout uses (0 when no plan exists)
    rollout: RolloutOptimum | None
    batch: BatchStats  # the training batch the oracle built from the RL settings
    groups: tuple[LengthGroup, ...]  # the rollout's length groups


def plan_optimum(
    cm: CostModel,
    rl: RLSettings,
    profile: WorkloadProfile,
    num_gpus: int,
    tp_options: tuple[int, ...],
    *,
    num_groups: int,
    routing: str = "start-small",
    admission_delay: float = 0.5,
) -> PlanOptimum:
    """Least makespan max(T_train, T_rollout) over every split of `num_gpus` GPUs, every training layout on at most
    the training share (spare GPUs may idle) and every rollout plan on the rest. The training batch is the global
    batch of `rl` (num_prompts x samples_per_prompt sequences) with the profile's lengths capped at max_model_len;
    the rollout serves that many requests, grouped by `profile.groups`."""
    sequences = rl.num_prompts * rl.samples_per_prompt
    lengths = [min(x, rl.max_model_len) for x in profile.total_lengths]
    batch = BatchStats.from_lengths(np.array(lengths), num_sequences=sequences)
    groups = attrs.evolve(profile, requests_per_step=sequences).groups(num_groups)
    exact = [math.inf] + [brute_force_training(cm, batch, u) for u in range(1, num_gpus)]
    best = PlanOptimum(makespan_s=math.inf, train_gpus=0, rollout=None, batch=batch, groups=groups)
    for t in range(1, num_gpus):
        t_train, used = math.inf, 0
        for u in range(1, t + 1):
            if exact[u] < t_train:
                t_train, used = exact[u], u
        if not math.isfinite(t_train) or t_train >= best.makespan_s:
            continue
        roll = rollout_optimum(cm, groups, num_gpus - t, tp_options, profile.mean_tool_time_s, routing, admission_delay)
        if max(t_train, roll.time_s) < best.makespan_s:
            best = PlanOptimum(
                makespan_s=max(t_train, roll.time_s), train_gpus=used, rollout=roll, batch=batch, groups=groups
            )
    return best
