"""Rollout cost: how long one inference instance of TP degree `tp` takes to serve a set of requests.

Notation (per instance): W = weight bytes per GPU = weights / tp; k(tp) = KV bytes per token per GPU;
K = KV capacity in tokens = (util * M - W - reserve) / k(tp); R = mean resident context while decoding,
weighted by decode tokens (per request: total - gen / 2); B = concurrent sequences
= min(max_num_seqs, kv_fill * K / R - headroom, requests).

    t_step(B)  = max(mem, compute) + tp_comm + overhead                          (one decode iteration)
    mem        = (W_active(B) + B * R * k(tp)) / (hbm_bw * hbm_eff)              (memory-bandwidth bound)
    compute    = B * (2 * active_params + 4 * layers * heads * head_dim * R) / (tp * flops * decode_mfu)
    tp_comm    = 2 * layers * (latency * (1 + log2 tp) + 2 (tp-1)/tp * B * hidden * bytes / (nvlink * link_eff))
    overhead   = step + [tp > 1] * tp_step + per_seq * B
    thr        = D / B * t_step(B)                                               (throughput phase)
    chain(t)   = max_gen * t + max_turns * tool_latency                          (the longest request, at pace t)
    T_instance = prefill + thr                                       if chain(t_step(B)) <= thr
               = prefill + thr + (1 - thr / chain(t_step(B))) * chain(t_step(1))                        otherwise

with D the decode tokens of the instance and `prefill` the prompt and tool tokens at prefill speed. The tail: the
longest request keeps pace with the batch while the throughput phase lasts, then finishes what is left of its
chain nearly alone, at the step time of a batch of one (no churn). Where each request's seconds in tool calls are
known (`tool_tail`, `chain_of`), the chain is the longest of three requests' own, each its tokens at the pace plus
its tool seconds: the one that decodes the most (`max_gen` tokens), the one that spends the most seconds in tool
calls, and the one longest in total (the rollout DP's last length group's longest decoder: it may decode little and
wait long on its tools, and `RolloutTable.chain_bound_s` prices it); and, where the caller names it (`paced_tail`,
`paced_pick`), a fourth: the request whose own chain is the longest at the pace of a batch of one, the pace the
tail runs at. A request second in both tokens and tool seconds can outlast all three (MedAgentBench gpt4o: 208
tokens and 7.9 s of tool calls against 242 tokens with 3.6 s and 57 tokens with 7.9 s; docs/sim.md). Tool
latencies are heavy-tailed: a 2 s median call of a lognormal spread takes 20-60 s once in a few thousand calls, so
in a step of short runs one slow call, not the most turns at the mean call, sets the tail.
Every function broadcasts over numpy arrays so the rollout DP evaluates whole tables at once.
"""

from __future__ import annotations

import numpy as np

from libra.planning.cost.coefficients import CostCoefficients
from libra.spec import GPUSpec, ModelSpec


def allreduce_latency(c: CostCoefficients, group: int) -> float:
    """Latency of one small all-reduce over `group` GPUs of one NVLink domain: log-depth in the group size
    (NCCL's tree / one-shot algorithms for small messages), `allreduce_latency_s` per step, 0 for one GPU."""
    return 0.0 if group <= 1 else c.allreduce_latency_s * (1.0 + float(np.log2(group)))


def chain_of(max_gen, tool_tail, step):
    """Seconds of a bucket's chain of turns at `step` seconds a decoded token, where each request's seconds in tool
    calls are known: the longest of three requests' own, tokens at that pace plus tool seconds (`tool_tail` as
    `RolloutCost.instance_time` takes it). Broadcasts over numpy arrays."""
    gen_tools, tool_gen, tool_most, last_gen, last_tools = (np.asarray(x, dtype=float) for x in _candidates(tool_tail))
    return np.maximum(max_gen * step + gen_tools, np.maximum(tool_gen * step + tool_most, last_gen * step + last_tools))


def _candidates(tool_tail) -> tuple:
    """`tool_tail`'s five fields, or one line saying what it must hold (a 3-tuple was its form before the longest
    request in total was a candidate)."""
    if len(tool_tail) != 5:
        raise ValueError(
            f"tool_tail must be (gen_tools, tool_gen, tool_most, last_gen, last_tools), 5 values, got {len(tool_tail)}"
        )
    return tuple(tool_tail)


def paced_pick(gen, tool_s, step) -> int:
    """Index of the request whose chain, `gen` tokens at `step` seconds a token plus `tool_s` seconds in tool calls,
    is the longest (the first of ties): `RolloutCost.instance_time`'s `paced_tail` candidate at the pace of a batch
    of one. Its chain is the longest of any request's at that pace, where the three of `chain_of` may each be short
    in one of the two."""
    gen, tool_s = np.asarray(gen, dtype=float), np.asarray(tool_s, dtype=float)
    if gen.shape != tool_s.shape or gen.ndim != 1 or not gen.size:
        raise ValueError(f"paced_pick needs two equal non-empty 1-D arrays, got shapes {gen.shape} and {tool_s.shape}")
    return int(np.argmax(gen * step + tool_s))


def tool_tail_of(gen, tool_s) -> tuple[float, float, float, float, float]:
    """`RolloutCost.instance_time`'s `tool_tail` of the requests ending in a bucket, one entry a request, sorted by
    total length: the tool seconds of the request decoding the most, the tokens and tool seconds of the request
    longest in tool calls (the first of ties) and of the last request, the longest in total (as the rollout DP's
    last length group's longest decoder, one request a group); zeros where there is none."""
    gen, tool_s = np.asarray(gen, dtype=float), np.asarray(tool_s, dtype=float)
    if not gen.size:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    most_gen, most_tool = int(np.argmax(gen)), int(np.argmax(tool_s))
    return float(tool_s[most_gen]), float(gen[most_tool]), float(tool_s[most_tool]), float(gen[-1]), float(tool_s[-1])


def paced_tail_of(gen, tool_s, step) -> tuple[float, float]:
    """`RolloutCost.instance_time`'s `paced_tail` of the requests ending in a bucket: the tokens and tool seconds of
    the one whose chain is the longest at `step` seconds a token, the step time of a batch of one at the bucket's
    resident context (the pace its tail runs at; `paced_pick`); zeros where there is none."""
    if not np.size(gen):
        return 0.0, 0.0
    pick = paced_pick(gen, tool_s, step)
    return float(np.asarray(gen, dtype=float)[pick]), float(np.asarray(tool_s, dtype=float)[pick])


def _paced_slot(tool_gen, tool_most, paced_tail, step1):
    """What `chain_of`'s second slot holds at the batch's pace: the `paced_tail` request in a row where it covers the
    request longest in tool calls (it decodes no fewer tokens and its chain is no shorter at `step1`, so it is no
    shorter at any slower pace, and the batch's pace is no faster than a batch of one's: four chains then cost
    three), else the request longest in tool calls. Returns (tokens, tool seconds, whether the paced request's chain
    must still be taken beside them: some row it does not cover)."""
    if paced_tail is None:
        return tool_gen, tool_most, False
    gen, tools = (np.asarray(x, dtype=float) for x in paced_tail)
    covers = (gen >= tool_gen) & (gen * step1 + tools >= tool_gen * step1 + tool_most)
    return np.where(covers, gen, tool_gen), np.where(covers, tools, tool_most), not bool(np.all(covers))


def _with_paced(chain, paced_tail, step):
    """`chain` lengthened to the `paced_tail` request's own (its tokens at `step` plus its tool seconds) where that
    is longer; `chain` as it is without one."""
    if paced_tail is None:
        return chain
    gen, tools = paced_tail
    return np.maximum(chain, np.asarray(gen, dtype=float) * step + np.asarray(tools, dtype=float))


class RolloutCost:
    """Rollout side of the cost model for one (GPU, model) pair."""

    def __init__(self, gpu: GPUSpec, model: ModelSpec, coeffs: CostCoefficients) -> None:
        self.gpu, self.model, self.c = gpu, model, coeffs
        # model-derived constants, computed once (the simulator prices tens of thousands of slices); each keeps the
        # exact operand order of the formula it stands in, so results are bit-identical
        m = model
        self._work0 = 2.0 * m.active_params
        self._attn = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self._weight_bytes = m.weight_bytes
        self._kv_bytes: dict[int, float] = {}
        self._comm: dict[int, tuple[float, float]] = {}  # tp -> (all-reduce latency, link bandwidth)

    def _kv_per_token(self, tp: int) -> float:
        got = self._kv_bytes.get(tp)
        if got is None:
            got = self._kv_bytes[tp] = self.model.kv_bytes_per_token(tp)
        return got

    # --- memory -----------------------------------------------------------------------------------------------
    def kv_capacity_tokens(self, tp: int) -> float:
        """Tokens of KV cache one instance of degree `tp` holds (0 when the weights leave no room)."""
        c, m = self.c, self.model
        free = c.gpu_memory_utilization * self.gpu.memory_bytes - m.weight_bytes / tp - c.activation_reserve_gb * 1e9
        return max(0.0, free / m.kv_bytes_per_token(tp))

    def fits(self, tp: int, max_total_tokens: float) -> bool:
        """One instance of degree `tp` can hold a request of `max_total_tokens` tokens (none where the weights leave
        no room for any KV cache)."""
        capacity = self.kv_capacity_tokens(tp)
        return capacity > 0 and capacity >= max_total_tokens

    def kv_limit(self, tp: int, resident_context):
        """Sequences the KV pool holds at once, after the headroom kept for their growth."""
        context = np.maximum(resident_context, 1.0)
        return np.maximum(1.0, self.c.kv_fill * self.kv_capacity_tokens(tp) / context - self.c.kv_headroom_seqs)

    def concurrency(self, tp: int, resident_context, num_requests):
        """Concurrent sequences B, limited by the engine cap, the KV pool and the requests available."""
        kv_limit = self.kv_limit(tp, resident_context)
        return np.maximum(1.0, np.minimum(np.minimum(self.c.max_num_seqs, kv_limit), num_requests))

    def effective_step_time(self, tp: int, batch, resident_context, num_requests):
        """Decode step time including preemption churn: when the KV pool, not the engine cap or the supply of
        requests, bounds the batch, growing sequences evict and re-prefill each other; the waste per step
        scales like 1 / B (a handful of long sequences thrash; hundreds barely notice), capped at `max_churn`
        because a batch of one or two sequences has nothing left to evict."""
        kv_limit = self.kv_limit(tp, resident_context)
        kv_bound = kv_limit < np.minimum(self.c.max_num_seqs, num_requests)
        churn = np.where(kv_bound, 1.0 + np.minimum(self.c.preemption_factor / batch, self.c.max_churn), 1.0)
        return self.decode_step_time(tp, batch, resident_context) * churn

    # --- one decode step --------------------------------------------------------------------------------------
    def decode_step_time(self, tp: int, batch, resident_context):
        """Seconds for one decode iteration of `batch` sequences with `resident_context` tokens each."""
        work = self._work0 + self._attn * resident_context
        return self._decode_step(tp, batch, resident_context, work)

    def _decode_step(self, tp: int, batch, resident_context, work_per_seq):
        """`decode_step_time` given `work_per_seq` = 2 active_params + attention FLOPs at `resident_context`
        (computed by the caller, once per distinct context)."""
        c, m, g = self.c, self.model, self.gpu
        if m.is_moe:  # a decode step reads only the experts its tokens route to
            touched = np.minimum(m.num_experts, batch * m.experts_per_token)
            weights = self._weight_bytes - m.num_layers * (m.num_experts - touched) * m.expert_params * m.dtype_bytes
        else:
            weights = self._weight_bytes
        kv_bytes = batch * resident_context * self._kv_per_token(tp)
        mem = (weights / tp + kv_bytes) / (g.hbm_bytes_per_s * c.hbm_efficiency)
        compute = batch * work_per_seq / (tp * g.flops * c.decode_mfu)
        overhead = c.step_overhead_s + c.per_seq_overhead_s * batch + (c.tp_step_overhead_s if tp > 1 else 0.0)
        return np.maximum(mem, compute) + self.tp_comm_time(tp, batch) + overhead

    def tp_comm_time(self, tp: int, tokens):
        """Two all-reduces of the hidden state per layer for `tokens` tokens inside one NVLink domain."""
        if tp == 1:
            return 0.0 * tokens
        m = self.model
        comm = self._comm.get(tp)
        if comm is None:
            comm = self._comm[tp] = (
                allreduce_latency(self.c, tp),
                self.gpu.nvlink_bandwidth_gbs * 1e9 * self.c.link_efficiency,
            )
        volume = 2.0 * (tp - 1) / tp * tokens * m.hidden_size * m.dtype_bytes
        per_allreduce = comm[0] + volume / comm[1]
        return 2 * m.num_layers * per_allreduce

    # --- prefill ----------------------------------------------------------------------------------------------
    def prefill_time(self, tp: int, tokens, context=0.0):
        """Seconds to prefill `tokens` tokens that attend to `context` earlier tokens on average (compute-bound)."""
        work = self._work0 + self._attn * context
        return self._prefill(tp, tokens, work)

    def _prefill(self, tp: int, tokens, work_per_token):
        """`prefill_time` given `work_per_token` = 2 active_params + attention FLOPs at the attended context."""
        c, g = self.c, self.gpu
        flops = tokens * work_per_token
        compute = flops / (tp * g.flops * c.prefill_mfu)
        weights = self._prefill_weights_s(tp)
        return compute + weights + self.tp_comm_time(tp, tokens)

    def _prefill_weights_s(self, tp: int) -> float:
        """The weight read one prefill pays on a TP-`tp` instance: the whole read (`prefill_weight_share` 1, the
        default: a forward pass of its own), none (0: fused into a decode step that reads the weights anyway)."""
        c, g = self.c, self.gpu
        return c.prefill_weight_share * (self._weight_bytes / tp / (g.hbm_bytes_per_s * c.hbm_efficiency))

    def prefill_terms(self, tp: int) -> tuple[float, ...]:
        """What `prefill_time(tp, tokens, context)` is made of, for a compiled caller (the simulator's slice
        kernel, libra/sim/native.py) that evaluates it in the same operand order:
        `(tokens * (work0 + attn * context)) / denom + weights + comm`, comm = `layers2 * (latency + a * tokens *
        hidden * dtype_bytes / bandwidth)` (`0.0 * tokens` at tp 1). Returns (work0, attn, tp, denom, weights, a,
        hidden, dtype_bytes, latency, bandwidth, layers2); the caller checks its results against `prefill_time`."""
        c, g, m = self.c, self.gpu, self.model
        denom = tp * g.flops * c.prefill_mfu
        weights = self._prefill_weights_s(tp)
        if tp == 1:
            comm: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)
        else:
            self.tp_comm_time(tp, 0.0)  # the all-reduce latency and bandwidth, cached
            latency, bandwidth = self._comm[tp]
            a = 2.0 * (tp - 1) / tp
            comm = (a, float(m.hidden_size), float(m.dtype_bytes), latency, bandwidth, float(2 * m.num_layers))
        return (self._work0, self._attn, float(tp), denom, weights, *comm)

    def decode_terms(self, tp: int) -> tuple[float, ...]:
        """What `decode_step_time(tp, batch, context)` is made of, for the simulator's slice kernel (as
        `prefill_terms`): (tp, weight bytes, is MoE, experts, experts per token, layers, expert parameters, dtype
        bytes, KV bytes per token, HBM bytes/s x efficiency, tp x FLOPs x decode MFU, step overhead, per-sequence
        overhead, TP step overhead, then the all-reduce terms of `prefill_terms`: a, hidden, dtype bytes,
        latency, bandwidth, 2 x layers). The caller checks its results against `decode_step_time`."""
        c, g, m = self.c, self.gpu, self.model
        comm = self.prefill_terms(tp)[5:]
        moe = (
            (1.0, float(m.num_experts), float(m.experts_per_token), float(m.num_layers), float(m.expert_params))
            if m.is_moe
            else (0.0, 0.0, 0.0, 0.0, 0.0)
        )
        return (
            float(tp),
            float(self._weight_bytes),
            *moe,
            float(m.dtype_bytes),
            self._kv_per_token(tp),
            g.hbm_bytes_per_s * c.hbm_efficiency,
            tp * g.flops * c.decode_mfu,
            c.step_overhead_s,
            c.per_seq_overhead_s,
            c.tp_step_overhead_s if tp > 1 else 0.0,
            *comm,
        )

    # --- a whole instance -------------------------------------------------------------------------------------
    def instance_time(
        self,
        tp: int,
        *,
        num_requests,
        decode_tokens,
        prefill_tokens,
        resident_context,
        max_gen,
        max_turns=1.0,
        tool_latency_s: float = 0.0,
        new_requests=None,
        queued_share=0.0,
        tool_tail=None,
        paced_tail=None,
    ):
        """Seconds for one instance to serve `num_requests` requests (totals over the instance), continuous
        batching; `max_gen` / `max_turns` describe the longest request (the tail). `new_requests` of them pay the
        per-request engine cost (all by default; a request migrated in from another instance paid it there).
        `queued_share` > 0: the longest request first queued elsewhere for that share of the result, so its chain
        at the batch's pace must fit in the rest (the instance takes at least chain / (1 - queued_share)).
        `tool_tail` = (seconds in tool calls of the request decoding `max_gen`, tokens decoded by the request
        longest in tool calls, its seconds in them, tokens decoded by the request longest in total, its seconds in
        tool calls) where known, the chain being the longest of those three requests' (`chain_of`); else
        the chain's tools are `max_turns` calls of `tool_latency_s`. `paced_tail` = (tokens, seconds in tool calls)
        of a fourth request, read with `tool_tail` only: the one whose chain is the longest at the pace of a batch
        of one (`paced_pick`); the chain is then the longest of the four (three where it covers the request longest
        in tool calls, `_paced_slot`)."""
        batch = self.concurrency(tp, resident_context, num_requests)
        fresh = num_requests if new_requests is None else new_requests
        step = self.effective_step_time(tp, batch, resident_context, num_requests)
        throughput = decode_tokens / batch * step
        step1 = self.decode_step_time(tp, 1.0, resident_context)
        if tool_tail is None:
            tools = max_turns * tool_latency_s
            chain, chain1 = max_gen * step + tools, max_gen * step1 + tools
        else:
            gen_tools, tool_gen, tool_most, last_gen, last_tools = _candidates(tool_tail)
            slot_gen, slot_tools, beside = _paced_slot(tool_gen, tool_most, paced_tail, step1)
            chain = chain_of(max_gen, (gen_tools, slot_gen, slot_tools, last_gen, last_tools), step)
            chain = _with_paced(chain, paced_tail if beside else None, step)
            chain1 = _with_paced(chain_of(max_gen, tool_tail, step1), paced_tail, step1)
        left = np.where(chain > throughput, 1.0 - throughput / np.maximum(chain, 1e-12), 0.0)
        tail = left * chain1
        prefill = self.prefill_time(tp, prefill_tokens, resident_context / 2.0)
        total = prefill + fresh * self.c.per_request_overhead_s + throughput + tail
        share = np.asarray(queued_share, dtype=float)
        if not share.any():
            return total
        return np.where(share > 0, np.maximum(total, chain / (1.0 - share)), total)

    def instance_time_grid(
        self,
        tp: int,
        shares,
        *,
        num_requests,
        decode_tokens,
        prefill_tokens,
        resident_context,
        max_gen,
        max_turns,
        tool_latency_s: float,
        new_requests,
        queued_share,
        tool_tail=None,
        paced_tail=None,
    ):
        """`instance_time` for every row and every k of `shares` at once: a (rows, len(shares)) array whose entry
        [r, j] is row r's work (per-row totals, as for `instance_time`) shared evenly by shares[j] instances; bit for
        bit `instance_time(tp, num_requests=num_requests[r] / shares[j], ..., resident_context=resident_context[r],
        ...)`, with every term that depends on the row alone (KV limit, attention work, the tail's batch-of-one step)
        computed once per row and broadcast."""
        rows = len(np.asarray(num_requests))
        return self._shared_time(
            tp,
            rows,
            lambda x: x[:, None],
            np.asarray(shares, dtype=float)[None, :],
            num_requests=num_requests,
            decode_tokens=decode_tokens,
            prefill_tokens=prefill_tokens,
            resident_context=resident_context,
            max_gen=max_gen,
            max_turns=max_turns,
            tool_latency_s=tool_latency_s,
            new_requests=new_requests,
            queued_share=queued_share,
            tool_tail=tool_tail,
            paced_tail=paced_tail,
        )

    def _shared_time(
        self,
        tp: int,
        rows: int,
        expand,
        shares,
        *,
        num_requests,
        decode_tokens,
        prefill_tokens,
        resident_context,
        max_gen,
        max_turns,
        tool_latency_s: float,
        new_requests,
        queued_share,
        tool_tail=None,
        paced_tail=None,
    ):
        """`instance_time_grid`'s body: `expand` lays a per-row array out as a column that broadcasts against the
        row of shares. Each grid-sized term is computed into a buffer that later terms overwrite (`out=`), with
        the operations and operand order of `instance_time`, so the same bits with far less memory traffic."""

        def per_row(x):
            x = np.asarray(x, dtype=float)
            return x if x.shape == (rows,) else np.broadcast_to(x, (rows,))

        ex = lambda x: expand(per_row(x))  # noqa: E731  (row value for every entry)
        c, m, g = self.c, self.model, self.gpu
        resident = per_row(resident_context)
        kv_limit = self.kv_limit(tp, resident)
        num = ex(num_requests) / shares
        batch = np.minimum(ex(np.minimum(c.max_num_seqs, kv_limit)), num)
        np.maximum(1.0, batch, out=batch)
        kv_bound = ex(kv_limit) < np.minimum(c.max_num_seqs, num, out=num)
        churn = np.divide(c.preemption_factor, batch)
        np.minimum(churn, c.max_churn, out=churn)
        np.add(1.0, churn, out=churn)
        np.copyto(churn, 1.0, where=~kv_bound)  # np.where(kv_bound, 1 + min(factor / B, max_churn), 1)
        work = 2.0 * m.active_params + 4.0 * m.num_layers * m.num_heads * m.head_dim * resident
        step = self._decode_step_grid(tp, batch, ex(resident), ex(work))
        step *= churn
        throughput = np.divide(ex(decode_tokens), shares, out=churn)
        throughput /= batch
        throughput *= step
        step1 = self.decode_step_time(tp, 1.0, resident)
        if tool_tail is None:
            tools = per_row(max_turns) * tool_latency_s
            chain = np.multiply(ex(max_gen), step, out=step)
            chain += ex(tools)
            chain1 = per_row(max_gen) * step1 + tools
        else:
            gen_tools, tool_gen, tool_most, last_gen, last_tools = (per_row(x) for x in _candidates(tool_tail))
            paced = None if paced_tail is None else tuple(per_row(x) for x in paced_tail)
            slot_gen, slot_tools, beside = _paced_slot(tool_gen, tool_most, paced, step1)
            other = np.multiply(ex(slot_gen), step)
            other += ex(slot_tools)
            last = np.multiply(ex(last_gen), step)
            last += ex(last_tools)
            np.maximum(other, last, out=other)
            if beside and paced is not None:  # the fourth request, at the batch's pace (before `step` is the chain)
                np.multiply(ex(paced[0]), step, out=last)
                last += ex(paced[1])
                np.maximum(other, last, out=other)
            chain = np.multiply(ex(max_gen), step, out=step)
            chain += ex(gen_tools)
            np.maximum(chain, other, out=chain)
            chain1 = chain_of(per_row(max_gen), (gen_tools, tool_gen, tool_most, last_gen, last_tools), step1)
            chain1 = _with_paced(chain1, paced, step1)
        left = np.maximum(chain, 1e-12)
        np.divide(throughput, left, out=left)
        np.subtract(1.0, left, out=left)
        np.copyto(left, 0.0, where=~(chain > throughput))  # np.where(chain > throughput, 1 - thr / chain, 0)
        tail = np.multiply(left, ex(chain1), out=left)
        prefill_work = 2.0 * m.active_params + 4.0 * m.num_layers * m.num_heads * m.head_dim * (resident / 2.0)
        tokens = np.divide(ex(prefill_tokens), shares, out=batch)
        total = self._tp_comm_grid(tp, tokens)  # _prefill: compute + weights + tp_comm_time
        prefill = np.multiply(tokens, ex(prefill_work), out=tokens)
        prefill /= tp * g.flops * c.prefill_mfu
        prefill += self._prefill_weights_s(tp)
        prefill += total
        np.copyto(total, prefill)  # total = prefill + fresh * per_request_overhead + throughput + tail
        fresh = np.divide(ex(new_requests), shares, out=prefill)
        fresh *= c.per_request_overhead_s
        total += fresh
        total += throughput
        total += tail
        share = per_row(queued_share)
        if not share.any():
            return total
        queued = np.divide(chain, ex(1.0 - share), out=chain)
        np.maximum(total, queued, out=queued)
        np.copyto(total, queued, where=expand(share > 0))  # np.where(share > 0, max(total, chain / (1 - share)), total)
        return total

    def _decode_step_grid(self, tp: int, batch: np.ndarray, resident_context, work_per_seq) -> np.ndarray:
        """`_decode_step` for a grid `batch`, in a new array built in place (same operations and order)."""
        c, m, g = self.c, self.model, self.gpu
        kv_bytes = np.multiply(batch, resident_context)
        kv_bytes *= self._kv_per_token(tp)
        if m.is_moe:  # a decode step reads only the experts its tokens route to
            weights = np.multiply(batch, m.experts_per_token)
            np.minimum(m.num_experts, weights, out=weights)
            np.subtract(m.num_experts, weights, out=weights)
            np.multiply(m.num_layers, weights, out=weights)
            weights *= m.expert_params
            weights *= m.dtype_bytes
            np.subtract(self._weight_bytes, weights, out=weights)
            weights /= tp
            mem = np.add(weights, kv_bytes, out=weights)
        else:
            mem = np.add(self._weight_bytes / tp, kv_bytes, out=kv_bytes)
        mem /= g.hbm_bytes_per_s * c.hbm_efficiency
        compute = np.multiply(batch, work_per_seq)
        compute /= tp * g.flops * c.decode_mfu
        step = np.maximum(mem, compute, out=mem)
        step += self._tp_comm_grid(tp, batch)
        overhead = np.multiply(c.per_seq_overhead_s, batch, out=compute)
        np.add(c.step_overhead_s, overhead, out=overhead)
        overhead += c.tp_step_overhead_s if tp > 1 else 0.0
        step += overhead
        return step

    def _tp_comm_grid(self, tp: int, tokens: np.ndarray) -> np.ndarray:
        """`tp_comm_time` for a grid of `tokens`, in a new array built in place (same operations and order)."""
        if tp == 1:
            return np.multiply(0.0, tokens)
        m = self.model
        self.tp_comm_time(tp, 1.0)  # fills the per-TP constants
        latency, bandwidth = self._comm[tp]
        out = np.multiply(2.0 * (tp - 1) / tp, tokens)
        out *= m.hidden_size
        out *= m.dtype_bytes
        out /= bandwidth
        np.add(latency, out, out=out)
        np.multiply(2 * m.num_layers, out, out=out)
        return out

    def fluid_gpu_seconds(self, tp: int, *, num_requests, decode_tokens, prefill_tokens, resident_context):
        """GPU-seconds to serve the work at full concurrency with no tail: a lower bound on any real layout. The
        decode cost per token, step(B) / B, falls with B, so the bound takes the largest batch the KV pool holds;
        without preemption churn, which an instance holding exactly that many requests does not pay."""
        batch = self.concurrency(tp, resident_context, np.inf)
        step = self.decode_step_time(tp, batch, resident_context)
        prefill = self.prefill_time(tp, prefill_tokens, resident_context / 2.0)
        return tp * (decode_tokens / batch * step + prefill + num_requests * self.c.per_request_overhead_s)
