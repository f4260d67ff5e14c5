"""Exhaustive oracles for the planner's solvers, for tests on small instances. They share the cost model with
the solvers and nothing else: plain enumeration, no pruning, no bisection, no tables."""

from __future__ import annotations

import itertools
import math

import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.planning.train_tree import TrainingSearch, ep_degrees, pp_degrees, tp_degrees
from libra.spec import LengthGroup


def brute_force_training(cm: CostModel, batch: BatchStats, num_gpus: int, search: TrainingSearch) -> float:
    """Least step time over every valid layout on exactly `num_gpus` GPUs (inf if none)."""
    best = math.inf
    opts = search.options
    for tp, pp in itertools.product(tp_degrees(cm), pp_degrees(cm)):
        for ep in ep_degrees(cm, tp):
            if num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if batch.num_sequences % dp or dp % ep:
                continue
            for mb in opts.micro_batches:
                if (batch.num_sequences // dp) % mb:
                    continue
                for recompute in (False, True) if opts.allow_recompute else (False,):
                    mem = cm.training.memory_bytes(tp, pp, dp, ep, mb, recompute, batch)
                    if cm.training.fits(mem):
                        best = min(best, float(cm.training.step_time(tp, pp, dp, ep, mb, recompute, batch)))
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
    one by one."""
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
    last = groups[stop - 1]
    max_gen, max_turns = last.tail_gen, last.tail_turns  # the whole chain of the longest request
    best = math.inf  # an instance may idle: c instances are never slower than fewer
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
        )
        best = min(best, float(t))
    return best


def _compositions(q: int):
    """Every way to cut groups 0..q-1 into contiguous ranges."""
    for cuts in itertools.product((False, True), repeat=q - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [q]
        yield list(zip(bounds, bounds[1:]))


def brute_force_rollout(
    cm: CostModel,
    groups: tuple[LengthGroup, ...],
    gpus: int,
    tp_options: tuple[int, ...],
    tool_latency_s: float = 0.0,
    routing: str = "start-small",
) -> float:
    """Least rollout makespan with at most `gpus` GPUs: every partition into buckets, every (tp, count) each."""
    best = math.inf
    for ranges in _compositions(len(groups)):
        options = []
        for a, b in ranges:
            opts = [
                (tp * c, bucket_time(cm, groups, a, b, tp, c, tool_latency_s, routing))
                for tp in tp_options
                for c in range(1, gpus // tp + 1)
            ]
            options.append([o for o in opts if math.isfinite(o[1])])
        for combo in itertools.product(*options):
            if sum(g for g, _ in combo) <= gpus:
                best = min(best, max(t for _, t in combo))
    return best


def brute_force_plan(
    cm: CostModel,
    batch: BatchStats,
    groups: tuple[LengthGroup, ...],
    num_gpus: int,
    tp_options: tuple[int, ...],
    search: TrainingSearch,
    tool_latency_s: float = 0.0,
    routing: str = "start-small",
) -> float:
    """Least makespan max(T_train, T_rollout) over every split, training layout and rollout plan."""
    train = np.array([math.inf] + [brute_force_training(cm, batch, t, search) for t in range(1, num_gpus + 1)])
    best = math.inf
    for t in range(1, num_gpus):
        t_train = float(np.min(train[: t + 1]))  # spare training GPUs may idle
        if not math.isfinite(t_train):
            continue
        best = min(
            best, max(t_train, brute_force_rollout(cm, groups, num_gpus - t, tp_options, tool_latency_s, routing))
        )
    return best
