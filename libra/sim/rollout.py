"""Timed rollout of one step: instances with continuous batching, KV-limited concurrency, tool calls, migrations.

Model (per instance k of degree tp_k; the formulas are the planner's `RolloutCost`, nothing is fitted here):
- A request is a sequence of decode segments separated by tool calls. During a tool call it is off the GPU (its KV
  is released; the prefix stays cached, so on return only the tool tokens are prefilled).
- Admission is first-come-first-served per instance while the running contexts fit in `kv_fill * K(tp)` minus
  `kv_headroom_seqs` mean contexts of growth room, and fewer than `max_num_seqs` run; an instance with nothing
  running always takes its first waiting request.
- Admitting costs the instance `prefill_time(tp, new tokens, context)` of GPU time (prompt, tool return, or the
  migrated context), plus `per_request_overhead_s` once per request: work the instance does before decoding.
- Decoding: every running sequence gains one token per engine step of `decode_step_time(tp, B, mean context)`,
  times the preemption churn `1 + min(preemption_factor / B, max_churn)` when the KV pool (not the engine cap or
  the supply of requests) bounds the batch, as in `RolloutCost.effective_step_time`.
- Time advances in slices: the engine step time of each instance is fixed within a slice (at the batch it ran at
  over the slice: predicted, then corrected once, `_decode`), a segment that ends inside a slice
  ends at its exact time, and a tool that returns inside a slice starts decoding at its return time. A slot that
  comes free inside a slice is refilled at the next boundary, but the request that takes it decodes as of when
  the slot came free (or it was ready, if later): the boundary only delays the decision, not the work. A slice
  ends at the next event (a segment end, a tool return, an instance start) but lasts at least `min_slice_s` (the
  fidelity knob: `tests/sim/test_fidelity.py` checks coarse against fine slices).
- Migration (decided by the router on a tool return): the destination either re-prefills the carried context
  (GPU time there) or receives the KV over the network (`kv bytes / bandwidth`, delaying the request); the
  cheaper is taken.
"""

from __future__ import annotations

import numpy as np

from libra.planning.cost import CostModel
from libra.sim import native
from libra.sim.admission import Admission
from libra.sim.routing import Routes
from libra.sim.slices import REFINE_TOLERANCE, SliceDecode
from libra.sim.states import DONE, RUN, STEAL_MODES, TOOL, WAIT, check_dispatch, check_steal
from libra.sim.workload import StepWork

__all__ = [
    "DONE",
    "REFINE_TOLERANCE",
    "RUN",
    "STEAL_MODES",
    "TOOL",
    "WAIT",
    "Instances",
    "RolloutRun",
    "deal",
    "water_fill",
]


class Instances:
    """The rollout instances of a step: degree, bucket, when each can start serving (`ready_at`, on the rollout's
    clock: seconds since its start), and whether it is lent."""

    def __init__(self, tp: list[int], bucket: list[int], ready_at: list[float]) -> None:
        self.tp = np.array(tp, np.int64)
        self.bucket = np.array(bucket, np.int64)
        self.ready_at = np.array(ready_at, float)
        self.active = np.ones(len(tp), bool)

    def __len__(self) -> int:
        return len(self.tp)

    def add(self, tp: int, bucket: int, ready_at: float, count: int) -> np.ndarray:
        k0 = len(self)
        self.tp = np.concatenate([self.tp, np.full(count, tp, np.int64)])
        self.bucket = np.concatenate([self.bucket, np.full(count, bucket, np.int64)])
        self.ready_at = np.concatenate([self.ready_at, np.full(count, ready_at)])
        self.active = np.concatenate([self.active, np.ones(count, bool)])
        return np.arange(k0, k0 + count)

    @property
    def num_gpus(self) -> int:
        return int(self.tp[self.active].sum())


def water_fill(load: np.ndarray, count: int) -> np.ndarray:
    """How many of `count` new requests each instance gets so that the most loaded ends as low as possible
    (ties go to lower indices). Deterministic."""
    out = np.zeros(load.size, np.int64)
    if count <= 0 or load.size == 0:
        return out
    order = np.argsort(load, kind="stable")
    sl = load[order]
    # raise the level through the sorted loads until `count` requests are placed
    fill = np.arange(1, sl.size + 1) * sl - np.cumsum(sl)  # requests needed to bring the first j+1 up to sl[j]
    j = int(np.searchsorted(fill, count, side="right")) - 1
    level_base = sl[j]
    spare = count - int(fill[j])
    width = j + 1
    level = level_base + spare // width
    extra = spare % width
    give = np.maximum(0, np.floor(level - sl[:width]).astype(np.int64))
    give[:extra] += 1
    out[order[:width]] = give
    return out


def deal(members: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Instance of each of `counts.sum()` requests in order, `counts[i]` of them to `members[i]`, dealt out in
    turn: the j-th request of instance i sits at position (j + 1/2) / counts[i] of the order (ties by index)."""
    slots = np.repeat(members, counts)
    rank = np.arange(slots.size) - np.repeat(np.cumsum(counts) - counts, counts)
    share = (rank + 0.5) / np.repeat(np.maximum(counts, 1), counts)
    return slots[np.argsort(share, kind="stable")]


class RolloutRun(SliceDecode, Admission):
    """One step's requests on `instances`, from time `start`. Call `advance(t, dt)` slice by slice. Admission
    (who starts decoding at a slice boundary, and from when) is `libra.sim.admission.Admission`; decoding a slice,
    with the turns that run inside it and the correction at its real batch, is `libra.sim.slices.SliceDecode`.

    Every time a rollout reads or writes is on its own clock, seconds since `start`: `advance` and `next_event`
    take and give such times, and `ready`, `finish` and the instances' `ready_at` hold them; `elapsed_s` is its
    length, `end_time` (`start + elapsed_s`) the only time on the caller's clock. Slice boundaries are compared
    with event times in floating point, so the same rollout on the absolute clock of a later stage would round
    them differently and move turns across boundaries (1-7 % on one r2e-gym step, docs/sim.md); on its own
    clock it is the same rollout from whatever `start`."""

    def __init__(
        self,
        cost: CostModel,
        work: StepWork,
        routes: Routes,
        instances: Instances,
        *,
        start: float,
        min_slice_s: float = 0.5,
        max_slice_s: float = 60.0,
        steal: str = "all",
        dispatch: str = "blocks",
        kv_memory: float | None = None,
    ) -> None:
        check_steal(steal)
        check_dispatch(dispatch)
        self.dispatch = dispatch
        # share of GPU memory the engines may use when not the cost model's (colocated: the engine shares the GPUs
        # with the sleeping trainer, `CostCoefficients.colocated_kv_fraction`)
        self.kv_memory = kv_memory
        self.cm, self.rc, self.c = cost, cost.rollout, cost.coeffs
        self.work, self.routes, self.inst = work, routes, instances
        self.min_slice_s, self.max_slice_s, self.steal = min_slice_s, max_slice_s, steal
        n = work.num_requests
        self.state = np.full(n, WAIT, np.int8)
        self.turn = np.zeros(n, np.int64)
        # the per-request floats a decode pass writes are the rows of one block, which a slice saves and restores
        # in one copy (`SliceDecode._save`): lag is the seconds into the current slice before a request can decode,
        # _own_debt the prefill owed for turns taken back inside a slice (`_later_debt`) that each request already
        # waited for itself
        self._floats = np.zeros((7, n))
        self.rem, self.ctx, self.pending, self.ready, self.finish, self.lag, self._own_debt = self._floats
        self.rem[:] = work.gen[:, 0]
        self.ctx[:] = work.prompt_tokens  # tokens in the context (what the KV holds while running)
        self.pending[:] = work.prompt_tokens  # tokens to prefill at the next admission
        self.ready[:] = 0.0  # (the rollout's clock: seconds since `start`)
        self.finish[:] = np.nan
        self.fresh = np.ones(n, bool)  # never admitted: pays the per-request overhead
        self.where = np.full(n, -1, np.int64)
        self.moved = np.zeros(n, bool)  # the migration before the current segment is done
        self.stolen = np.zeros(n, bool)  # started on a larger bucket's idle instance (work-conserving admission)
        self.debt = np.zeros(len(instances))  # seconds of prefill/admission work owed by each instance
        # per instance, the time up to which its busy GPU-seconds are counted (`SliceDecode._busy`)
        self._busy_until = np.full(len(instances), -np.inf)
        self.migrations = 0
        self.migrated_tokens = 0
        self.rebalanced = 0  # requests under way moved to an idle instance because theirs had no KV room
        self.rebalanced_tokens = 0
        self.busy_gpu_s = 0.0
        self.decoded = 0.0
        self.capacity_tokens = 0.0  # tokens the instances could have decoded (`_capacity`)
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # (still running, step times) after a slice
        self._later_debt = np.zeros(len(instances))  # prefill of turns taken back inside a slice, owed next slice
        # per instance: seconds decoded in the last slice over (its batch at the slice start x the slice): requests
        # leave for tools and others come back inside a slice, so the batch a slice decodes at is not its start's
        self._occupancy = np.zeros(0)
        # (instance, time) of every request that left the GPU inside the last slice (tool call, move or finish):
        # the slots the next boundary's admission refills, as if it had happened when each slot came free
        self._freed = (np.zeros(0, np.int64), np.zeros(0))
        self._refilled = np.zeros(len(instances), np.int64)  # freed slots of an instance refilled at this boundary
        self._queues: tuple[np.ndarray, np.ndarray] | None = None  # `_slice_queues` of the slice being decoded
        # requests not DONE, ascending (DONE is final): per-slice scans read only these, which matters in the long
        # tail of a rollout where most slices have a few percent of the requests left; ascending order keeps every
        # sum (bincount) in the same order as a scan of all requests, so results are identical
        self._live = np.arange(n)
        # the slice kernel's order of the queued turns under way, by readiness then index, kept across slices
        # (ext/sim/order.c): the entries, each one's readiness when it joined, whether a request has one, how many
        self._order = (np.zeros(n, np.int64), np.zeros(n), np.zeros(n, bool), np.zeros(1, np.int64))
        self.start = start
        self._now = 0.0
        self._by_state: dict[tuple[int, bool] | None, np.ndarray] = {}  # _in_state results until the next state write
        self._assign(np.arange(n), routes.bucket[:, 0])
        self._deg_key = -1
        self._deg: tuple[int, ...] = ()
        self._deg_masks: tuple[tuple[int, np.ndarray | None], ...] = ()
        self._cap = np.zeros(0)
        self._kernel: tuple | None = None  # `SliceDecode._kernel_table`, for `_kernel_key` instances
        self._kernel_key = -1
        # (slice end, instances, `next_event` there, the requests in a tool call, `load()` or None): the slice
        # kernel's decoding hands on what its last scan found, for the next boundary; any change to the rollout
        # through its methods drops it, and the next event is not used once an instance was added
        self._next: tuple[float, int, float, np.ndarray, np.ndarray | None] | None = None
        self._rows: tuple[np.ndarray, ...] | None = None  # the slice kernel's per-request arrays (`native._decode`)

    # --- bookkeeping --------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._in_state(DONE, equal=False).size == 0

    @property
    def elapsed_s(self) -> float:
        """Seconds from the start to the last finish (the rollout's clock)."""
        return float(np.nanmax(self.finish))

    @property
    def end_time(self) -> float:
        """When the last request finished, on the caller's clock: `start + elapsed_s`."""
        return self.start + self.elapsed_s

    def _grow(self) -> None:
        self._next = None
        extra = len(self.inst) - len(self.debt)
        if extra > 0:
            self.debt = np.concatenate([self.debt, np.zeros(extra)])

    def load(self) -> np.ndarray:
        """Requests assigned to each instance and not finished. Counted by the last slice's decoding in C where
        nothing changed since (`_next`, dropped by every change of a request's state or instance)."""
        handed = self._next
        if handed is not None and handed[4] is not None and handed[1] == len(self.inst):
            return handed[4].copy()
        live = self._in_state(DONE, equal=False)
        return np.bincount(self.where[live[self.where[live] >= 0]], minlength=len(self.inst))

    def _in_state(self, state: int, *, equal: bool = True) -> np.ndarray:
        """Requests in `state` (or not in it), ascending. Read-only: cached until `_set_state` changes that set
        (a set of requests not DONE stays right from slice to slice: DONE is final)."""
        got = self._by_state.get((state, equal))
        if got is None:
            live = self._live
            sl = self._by_state.get(None)  # the states of `live`, gathered once per state write
            if sl is None:
                sl = self._by_state[None] = self.state[live]
            got = live[sl == state] if equal else live[sl != state]
            self._by_state[(state, equal)] = got
        return got

    def _set_state(self, reqs: np.ndarray, state: int) -> None:
        if reqs.size == 0:  # nothing changes: keep the cached sets
            return
        self._next = None
        cache = self._by_state
        if not cache:
            self.state[reqs] = state
            return
        was = np.bincount(self.state[reqs], minlength=4)  # how many of `reqs` were in each state
        self.state[reqs] = state
        cache.pop(None, None)  # the states of `live`, gathered
        for key in [k for k in cache if k is not None]:
            if (was[key[0]] < reqs.size) if key[0] == state else (was[key[0]] > 0):  # some joined, or some left
                del cache[key]

    def _assign(self, reqs: np.ndarray, buckets: np.ndarray) -> None:
        """Send requests to the active instances of their bucket, least-loaded first (water-filling, ties by
        index); a bucket with no active instance falls back to the nearest larger one, then smaller. With
        `dispatch="blocks"` (the default) each instance gets a contiguous block of them, so the samples of one
        prompt (adjacent in a step, and alike in length) land together; with "interleaved" they are dealt out in
        turn, as a dispatcher sending them one by one to the least-loaded instance would."""
        if reqs.size == 0:
            return
        self._next = None
        load = self.load().astype(float)
        nb = int(self.inst.bucket.max()) + 1
        for b in np.unique(buckets):
            members = np.array([], np.int64)
            for alt in sorted(range(nb), key=lambda x: (x < b, abs(x - b))):
                members = np.flatnonzero((self.inst.bucket == alt) & self.inst.active)
                if members.size:
                    break
            mine = reqs[buckets == b]
            counts = water_fill(load[members], mine.size)
            self.where[mine] = deal(members, counts) if self.dispatch == "interleaved" else np.repeat(members, counts)
            load[members] += counts

    # --- one slice ----------------------------------------------------------------------------------------------
    def advance(self, t: float, dt: float) -> None:
        self._now = t
        handed, self._next = self._next, None
        self._live = self._in_state(DONE, equal=False)
        self._by_state.pop(None, None)  # gathered over the previous `_live`
        table = self._kernel_table()
        if table is not None:  # in C (libra.sim.native): the same returns, admission and decoding
            in_tool = handed[3] if handed is not None and handed[0] == t else self._live
            native.advance(self, t, dt, table, in_tool, REFINE_TOLERANCE)
            return
        self._returns(t, dt)
        self._admit(t)
        self._decode(t, dt)

    def _returns(self, t: float, dt: float) -> None:
        """Tool calls that return before the slice ends rejoin now; one that returns inside the slice starts
        decoding at its return time (admission sets `lag`), not at the next boundary."""
        table = self._kernel_table()
        if table is not None:  # in C (libra.sim.native): the same requests back, the same moves
            moving, carried = native.returns(self, t + dt)
            if moving.size:
                native.moves(self, moving, carried, t + dt, table)
            return
        tool = self._in_state(TOOL)
        back = tool[self.ready[tool] < t + dt]
        if back.size == 0:
            return
        self._set_state(back, WAIT)
        turn = self.turn[back]
        carries = np.where(self.moved[back] | self._covered(back, turn), 0, self.routes.carried[back, turn])
        moving, carried = back[carries > 0], carries[carries > 0]
        if moving.size:
            self.moved[moving] = True
            self.migrations += int(moving.size)
            self.migrated_tokens += int(carried.sum())
            self._assign(moving, self.routes.bucket[moving, self.turn[moving]])
            dst_tp = self.inst.tp[self.where[moving]]
            ctx = carried.astype(float)
            reprefill = np.zeros(moving.size)
            for tp in np.unique(dst_tp):
                sel = dst_tp == tp
                reprefill[sel] = self.rc.prefill_time(int(tp), ctx[sel], ctx[sel] / 2.0)
            bw = self.cm.cluster.gpu.network_bandwidth_gbs * 1e9 * self.c.link_efficiency
            transfer = ctx * self.cm.model.kv_bytes_per_token(1) / bw
            use_transfer = transfer < reprefill
            self.ready[moving] = np.where(use_transfer, self.ready[moving] + transfer, self.ready[moving])
            self.pending[moving] += np.where(use_transfer, 0.0, ctx)
            self._set_state(moving[use_transfer & (self.ready[moving] >= t + dt)], TOOL)  # KV still in flight

    def _covered(self, reqs: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """A stolen request's routed move is void when its instance's bucket already holds the target."""
        out = self.stolen[reqs]
        some = np.flatnonzero(out)
        if some.size:  # only stolen requests can be covered: look up their buckets alone
            r = reqs[some]
            out[some] = self.routes.bucket[r, seg[some]] <= self.inst.bucket[self.where[r]]
        return out

    def _degrees(self) -> tuple[int, ...]:
        if self._deg_key != len(self.inst):
            self._deg = tuple(int(x) for x in np.unique(self.inst.tp))
            self._cap = np.array([self.c.kv_fill * self._kv_tokens(int(tp)) for tp in self.inst.tp])
            # (degree, its instances; None when every instance has it)
            self._deg_masks = tuple((tp, None if len(self._deg) == 1 else self.inst.tp == tp) for tp in self._deg)
            self._deg_key = len(self.inst)
        return self._deg

    def _degree_masks(self) -> tuple[tuple[int, np.ndarray | None], ...]:
        """Each degree in ascending order with a mask of its instances (None: all of them)."""
        self._degrees()
        return self._deg_masks

    def _prefill_s(self, reqs: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Seconds to prefill each request's pending tokens (attending to half its context) on its instance `k`."""
        masks = self._degree_masks()
        if len(masks) == 1:
            return self.rc.prefill_time(masks[0][0], self.pending[reqs], self.ctx[reqs] / 2.0)
        secs = np.zeros(reqs.size)
        tps = self.inst.tp[k]
        for tp, _ in masks:
            sel = tps == tp
            if sel.any():
                r = reqs[sel]
                secs[sel] = self.rc.prefill_time(tp, self.pending[r], self.ctx[r] / 2.0)
        return secs

    def _kv_tokens(self, tp: int) -> float:
        if self.kv_memory is None:
            return self.rc.kv_capacity_tokens(tp)
        m, gpu = self.cm.model, self.cm.cluster.gpu
        free = self.kv_memory * gpu.memory_bytes - m.weight_bytes / tp - self.c.activation_reserve_gb * 1e9
        return max(1.0, free / m.kv_bytes_per_token(tp))

    def _cap_k(self) -> np.ndarray:
        """KV tokens each instance may fill (`kv_fill` of its pool)."""
        self._degrees()
        return self._cap

    def step_batch(self, running: np.ndarray, count_k: np.ndarray | None = None) -> np.ndarray:
        """The batch each instance is predicted to run at over the slice: its running requests, scaled by the last
        slice's occupancy. `count_k`: the running requests per instance, when the caller has counted them."""
        k_all = len(self.inst)
        b = np.bincount(self.where[running], minlength=k_all) if count_k is None else count_k
        b = b.astype(float)
        if self._occupancy.size == k_all:  # the batch over the slice, as the last slice's share of it decoded
            b = np.where(b > 0, np.maximum(1.0, b * self._occupancy), b)
        return b

    def step_times(
        self, running: np.ndarray, batch: np.ndarray | None = None, inputs: tuple | None = None
    ) -> np.ndarray:
        """Engine step seconds of every instance for its current batch (inf where nothing runs). `inputs`: what
        `_step_inputs(running)` returned, when the state it reads has not changed since."""
        b = self.step_batch(running) if batch is None else batch
        ctx, waiting = self._step_inputs(running) if inputs is None else inputs
        out = np.full(len(self.inst), np.inf)
        c = self.c
        for tp, of_tp in self._degree_masks():
            sel = b > 0 if of_tp is None else of_tp & (b > 0)
            bb = b[sel]
            if bb.size == 0:
                continue
            rr = ctx[sel] / bb
            step = self.rc.decode_step_time(tp, bb, rr)
            kv_bound = (waiting[sel] > 0) & (bb < c.max_num_seqs)
            churn = 1.0 + np.minimum(c.preemption_factor / bb, c.max_churn)  # as effective_step_time
            out[sel] = step * np.where(kv_bound, churn, 1.0)
        return out

    def _step_inputs(self, running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per instance: the running contexts' sum, and the requests queued now (not a tool returning later in the
        slice)."""
        k_all = len(self.inst)
        ctx = np.bincount(self.where[running], weights=self.ctx[running], minlength=k_all)
        queued = self._in_state(WAIT)
        if queued.size:
            queued = queued[self.ready[queued] <= self._now]
            return ctx, np.bincount(self.where[queued], minlength=k_all)
        return ctx, np.zeros(k_all, np.int64)

    def _capacity(self, t: float, dt: float, running: np.ndarray, count_k: np.ndarray | None = None) -> float:
        """Tokens the started, active instances could decode in [t, t + dt) at their largest batch: as many
        sequences as `max_num_seqs` and their KV pool allow at the running contexts (each instance's mean, or the
        mean over all running requests where one has none). `decoded / capacity` is the rollout's utilisation.
        `count_k`: the running requests per instance (None: none run)."""
        inst = self.inst
        up = np.maximum(0.0, t + dt - np.maximum(t, inst.ready_at)) * inst.active
        if not up.any():
            return 0.0
        live = self._live
        mean_all = float(self.ctx[live].mean()) if live.size else 1.0
        if count_k is None:
            ctx = np.full(len(inst), mean_all)
        else:
            ctx_k = np.bincount(self.where[running], weights=self.ctx[running], minlength=len(inst))
            ctx = np.where(count_k > 0, ctx_k / np.maximum(count_k, 1), mean_all)
        batch = np.clip(np.floor(self._cap_k() / np.maximum(ctx, 1.0)), 1, self.c.max_num_seqs)
        total = 0.0
        on = up > 0
        for tp, of_tp in self._degree_masks():
            sel = on if of_tp is None else of_tp & on
            if sel.any():
                step = self.rc.decode_step_time(tp, batch[sel], ctx[sel])
                total += float((up[sel] * batch[sel] / step).sum())
        return total

    # --- when to look again -------------------------------------------------------------------------------------
    def run_to_end(self, t: float = 0.0) -> float:
        """Advance this rollout alone (nothing else shares its instances) from `t` (its clock: seconds since
        `start`) until every request has finished, one event at a time; returns its clock at the last event."""
        while not self.done:
            dt = self.next_event(t) - t
            self.advance(t, dt)
            t += dt
        return t

    def next_event(self, t: float) -> float:
        """The next time something changes (a segment end, a tool return, an instance start), at least
        `min_slice_s` and at most `max_slice_s` ahead. Segment ends use the step times of the last slice. In C with
        the slice (`libra.sim.native`)."""
        handed = self._next  # (only the kernel hands one on)
        if handed is not None and handed[0] == t and handed[1] == len(self.inst):
            return handed[2]  # found by the last slice's decoding, nothing changed since
        if self._kernel_table() is not None:
            return native.next_event(self, t)
        nxt = t + self.max_slice_s
        running = self._in_state(RUN)
        if self._last is not None and self._last[0].size:
            still, step = self._last
            k = self.where[still]
            nxt = min(nxt, t + float(np.min(self.debt[k] + self.rem[still] * step[k])))
        elif running.size:
            nxt = t  # admitted in the last slice, not yet decoding
        tool = self._in_state(TOOL)
        if tool.size:
            nxt = min(nxt, float(self.ready[tool].min()))
        waiting = self._in_state(WAIT)
        if waiting.size:
            starting = self.inst.ready_at > t
            later = self.inst.ready_at[self.where[waiting]] if starting.any() else self.inst.ready_at[:0]
            later = later[later > t]
            if later.size:
                nxt = min(nxt, float(later.min()))
            elif not running.size:
                nxt = t  # admissible now
        return max(nxt, t + self.min_slice_s)

    # --- the elastic pool's view --------------------------------------------------------------------------------
    def idle_instances(self) -> np.ndarray:
        """Instances the elastic pool may lend: active, nothing assigned, and no unfinished request sits in their
        bucket or a smaller one (requests move up as they grow, so such a bucket has no more work coming; a rare
        move down falls back to the nearest larger bucket with an active instance). Causal: it reads only where
        requests are now."""
        free = self.inst.active & (self.load() == 0)
        if not free.any():  # (most slices: every active instance has requests)
            return np.flatnonzero(free)
        live = self._in_state(DONE, equal=False)
        seg = self.turn[live] - (self.state[live] == TOOL)  # in a tool call: the bucket it ran in so far
        lowest = int(self.routes.bucket[live, seg].min()) if live.size else np.inf
        return np.flatnonzero(free & (self.inst.bucket < lowest))

    def lend(self, instances: np.ndarray) -> None:
        """Instances lent to training (the elastic pool): inactive from now, owing nothing."""
        self.inst.active[instances] = False
        self.debt[instances] = 0.0
        self._next = None

    def rebalance(self, bucket: int) -> None:
        """Spread the not-yet-admitted waiting requests of a bucket over its active instances (after new
        instances join it)."""
        waiting = np.flatnonzero((self.state == WAIT) & self.fresh & (self.inst.bucket[self.where] == bucket))
        if waiting.size:
            self._grow()
            self.where[waiting] = -1
            self._set_state(waiting, DONE)  # hide from load() while re-assigning
            self._assign(waiting, np.full(waiting.size, bucket))
            self._set_state(waiting, WAIT)
        self._grow()
