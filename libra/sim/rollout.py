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
from libra.sim.admission import Admission
from libra.sim.routing import Routes
from libra.sim.states import DONE, RUN, STEAL_MODES, TOOL, WAIT, check_dispatch, check_steal
from libra.sim.workload import StepWork

# a slice is decoded again at the batch it ran at when that changes its engine step time by more than this
REFINE_TOLERANCE = 0.01

__all__ = ["DONE", "RUN", "STEAL_MODES", "TOOL", "WAIT", "Instances", "RolloutRun", "deal", "water_fill"]


class Instances:
    """The rollout instances of a step: degree, bucket, when each can start serving, and whether it is lent."""

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


def _grouped(items: np.ndarray, k: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`items` and their instances `k` in `order` (which must keep each instance's items together), and each
    item's rank inside its instance's group."""
    items, k = items[order], k[order]
    first = np.concatenate(([True], k[1:] != k[:-1])) if k.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    rank = np.arange(k.size) - starts[np.cumsum(first) - 1] if k.size else np.zeros(0, np.int64)
    return items, k, rank


class RolloutRun(Admission):
    """One step's requests on `instances`, from time `start`. Call `advance(t, dt)` slice by slice. Admission
    (who starts decoding at a slice boundary, and from when) is `libra.sim.admission.Admission`."""

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
        self.rem = work.gen[:, 0].astype(float)
        self.ctx = work.prompt_tokens.astype(float)  # tokens in the context (what the KV holds while running)
        self.pending = work.prompt_tokens.astype(float)  # tokens to prefill at the next admission
        self.ready = np.full(n, start)
        self.finish = np.full(n, np.nan)
        self.fresh = np.ones(n, bool)  # never admitted: pays the per-request overhead
        self.where = np.full(n, -1, np.int64)
        self.lag = np.zeros(n)  # seconds into the current slice before a request can decode
        self.moved = np.zeros(n, bool)  # the migration before the current segment is done
        self.stolen = np.zeros(n, bool)  # started on a larger bucket's idle instance (work-conserving admission)
        self.debt = np.zeros(len(instances))  # seconds of prefill/admission work owed by each instance
        self.migrations = 0
        self.migrated_tokens = 0
        self.rebalanced = 0  # requests under way moved to an idle instance because theirs had no KV room
        self.rebalanced_tokens = 0
        self.busy_gpu_s = 0.0
        self.decoded = 0.0
        self.capacity_tokens = 0.0  # tokens the instances could have decoded (`_capacity`)
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # (still running, step times) after a slice
        self._later_debt = np.zeros(len(instances))  # prefill of turns taken back inside a slice, owed next slice
        self._own_debt = np.zeros(n)  # ... of which each request already waited for its own
        # per instance: seconds decoded in the last slice over (its batch at the slice start x the slice): requests
        # leave for tools and others come back inside a slice, so the batch a slice decodes at is not its start's
        self._occupancy = np.zeros(0)
        # (instance, time) of every request that left the GPU inside the last slice (tool call, move or finish):
        # the slots the next boundary's admission refills, as if it had happened when each slot came free
        self._freed = (np.zeros(0, np.int64), np.zeros(0))
        self._refilled = np.zeros(len(instances), np.int64)  # freed slots of an instance refilled at this boundary
        # requests not DONE, ascending (DONE is final): per-slice scans read only these, which matters in the long
        # tail of a rollout where most slices have a few percent of the requests left; ascending order keeps every
        # sum (bincount) in the same order as a scan of all requests, so results are identical
        self._live = np.arange(n)
        self._now = start
        self._by_state: dict[tuple[int, bool] | None, np.ndarray] = {}  # _in_state results until the next state write
        self._assign(np.arange(n), routes.bucket[:, 0])
        self._deg_key = -1
        self._deg: tuple[int, ...] = ()
        self._cap = np.zeros(0)

    # --- bookkeeping --------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._in_state(DONE, equal=False).size == 0

    @property
    def end_time(self) -> float:
        return float(np.nanmax(self.finish))

    def _grow(self) -> None:
        extra = len(self.inst) - len(self.debt)
        if extra > 0:
            self.debt = np.concatenate([self.debt, np.zeros(extra)])

    def load(self) -> np.ndarray:
        """Requests assigned to each instance and not finished."""
        live = self._in_state(DONE, equal=False)
        return np.bincount(self.where[live[self.where[live] >= 0]], minlength=len(self.inst))

    def _in_state(self, state: int, *, equal: bool = True) -> np.ndarray:
        """Requests in `state` (or not in it), ascending. Read-only: cached until `_set_state`."""
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
        self.state[reqs] = state
        self._by_state.clear()

    def _assign(self, reqs: np.ndarray, buckets: np.ndarray) -> None:
        """Send requests to the active instances of their bucket, least-loaded first (water-filling, ties by
        index); a bucket with no active instance falls back to the nearest larger one, then smaller. With
        `dispatch="blocks"` (the default) each instance gets a contiguous block of them, so the samples of one
        prompt (adjacent in a step, and alike in length) land together; with "interleaved" they are dealt out in
        turn, as a dispatcher sending them one by one to the least-loaded instance would."""
        if reqs.size == 0:
            return
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
        self._live = self._in_state(DONE, equal=False)
        self._by_state.pop(None, None)  # gathered over the previous `_live`
        self._returns(t, dt)
        self._admit(t)
        self._decode(t, dt)

    def _returns(self, t: float, dt: float) -> None:
        """Tool calls that return before the slice ends rejoin now; one that returns inside the slice starts
        decoding at its return time (admission sets `lag`), not at the next boundary."""
        tool = self._in_state(TOOL)
        back = tool[self.ready[tool] < t + dt]
        if back.size == 0:
            return
        self._set_state(back, WAIT)
        turn = self.turn[back]
        carried = np.where(self.moved[back] | self._covered(back, turn), 0, self.routes.carried[back, turn])
        moving = back[carried > 0]
        if moving.size:
            self.moved[moving] = True
            self.migrations += int(moving.size)
            self.migrated_tokens += int(carried[carried > 0].sum())
            self._assign(moving, self.routes.bucket[moving, self.turn[moving]])
            dst_tp = self.inst.tp[self.where[moving]]
            ctx = carried[carried > 0].astype(float)
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
        return self.stolen[reqs] & (self.routes.bucket[reqs, seg] <= self.inst.bucket[self.where[reqs]])

    def _degrees(self) -> tuple[int, ...]:
        if self._deg_key != len(self.inst):
            self._deg = tuple(int(x) for x in np.unique(self.inst.tp))
            self._cap = np.array([self.c.kv_fill * self._kv_tokens(int(tp)) for tp in self.inst.tp])
            self._deg_key = len(self.inst)
        return self._deg

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

    def step_batch(self, running: np.ndarray) -> np.ndarray:
        """The batch each instance is predicted to run at over the slice: its running requests, scaled by the last
        slice's occupancy."""
        k_all = len(self.inst)
        b = np.bincount(self.where[running], minlength=k_all).astype(float)
        if self._occupancy.size == k_all:  # the batch over the slice, as the last slice's share of it decoded
            b = np.where(b > 0, np.maximum(1.0, b * self._occupancy), b)
        return b

    def step_times(
        self, running: np.ndarray, batch: np.ndarray | None = None, inputs: tuple | None = None
    ) -> np.ndarray:
        """Engine step seconds of every instance for its current batch (inf where nothing runs). `inputs`: what
        `_step_inputs(running)` returned, when the state it reads has not changed since."""
        inst, k_all = self.inst, len(self.inst)
        b = self.step_batch(running) if batch is None else batch
        ctx, waiting = self._step_inputs(running) if inputs is None else inputs
        out = np.full(k_all, np.inf)
        for tp in self._degrees():
            sel = (inst.tp == tp) & (b > 0)
            if not sel.any():
                continue
            bb, rr = b[sel], ctx[sel] / b[sel]
            step = self.rc.decode_step_time(int(tp), bb, rr)
            kv_bound = (waiting[sel] > 0) & (bb < self.c.max_num_seqs)
            churn = 1.0 + np.minimum(self.c.preemption_factor / bb, self.c.max_churn)  # as effective_step_time
            out[sel] = step * np.where(kv_bound, churn, 1.0)
        return out

    def _step_inputs(self, running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per instance: the running contexts' sum, and the requests queued now (not a tool returning later in the
        slice)."""
        k_all = len(self.inst)
        ctx = np.bincount(self.where[running], weights=self.ctx[running], minlength=k_all)
        queued = self._in_state(WAIT)
        queued = queued[self.ready[queued] <= self._now]
        return ctx, np.bincount(self.where[queued], minlength=k_all)

    def _decode(self, t: float, dt: float) -> None:
        """Decode the slice [t, t + dt). A request may run several segments inside one slice: a segment that ends
        at a chunk boundary goes on at once, and one that ends in a tool call whose result comes back before the
        slice ends takes its slot again (when its instance has nobody queued and KV room for it) and decodes from
        its return, so results do not depend on how many turns fit in a slice (`_continue_in_slice`).

        The engine step time of a slice depends on the batch over the slice, which requests leaving for tools and
        coming back inside it change: the slice is decoded once at the batch predicted from its start (the running
        requests, scaled by the last slice's occupancy), then, where the batch it actually ran at (batch-seconds
        decoded over the instance's busy span) changes its step time by more than `REFINE_TOLERANCE`, decoded
        again at that batch (`_decode_pass`)."""
        running = self._in_state(RUN)
        k_all = len(self.inst)
        busy_k = np.minimum(self.debt, dt)
        self._last = None
        self._later_debt = np.zeros(k_all)
        if running.size:
            k = self.where[running]
            saved = self._save()
            used = self.step_batch(running)
            inputs = self._step_inputs(running)
            step, real = self._decode_pass(t, dt, running, used, inputs)
            real = np.where(real > 0, real, used)
            step_real = self.step_times(running, real)
            fin = np.isfinite(step)
            off = np.abs(step_real[fin] - step[fin]) > REFINE_TOLERANCE * step[fin]
            if off.any():
                self._restore(saved)  # the state `inputs` read, as it was
                self._decode_pass(t, dt, running, real, inputs)
            has_run = np.bincount(k, minlength=k_all) > 0
            busy_k = np.where(has_run, dt, busy_k)
        self.busy_gpu_s += float((busy_k * self.inst.tp).sum())
        self.capacity_tokens += self._capacity(t, dt, running)
        self.debt = np.maximum(0.0, self.debt - dt) + self._later_debt

    def _save(self) -> tuple:
        return (
            self.state.copy(),
            self.turn.copy(),
            self.rem.copy(),
            self.ctx.copy(),
            self.pending.copy(),
            self.ready.copy(),
            self.finish.copy(),
            self.lag.copy(),
            self.moved.copy(),
            self._own_debt.copy(),
            self._freed,
            self.decoded,
        )

    def _restore(self, saved: tuple) -> None:
        (
            self.state,
            self.turn,
            self.rem,
            self.ctx,
            self.pending,
            self.ready,
            self.finish,
            self.lag,
            self.moved,
            self._own_debt,
            self._freed,
            self.decoded,
        ) = saved
        self._by_state.clear()
        self._later_debt = np.zeros(len(self.inst))

    def _decode_pass(
        self, t: float, dt: float, running: np.ndarray, batch: np.ndarray, inputs: tuple
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode the slice with every instance at `batch`; returns its step times and the batch each instance
        actually ran at: batch-seconds decoded over its busy span (from its first request's start to its last
        one's end, or the slice end)."""
        k_all = len(self.inst)
        step = self.step_times(running, batch, inputs)
        avail = np.maximum(0.0, dt - self.debt)
        k = self.where[running]
        lag = self.lag[running]
        # the instance's owed prefill stalls it at the slice start: a request that becomes ready later is not
        # held by it (one that decodes as of before the boundary, lag < 0, is, after its credit)
        owed = np.minimum(self.debt[k], dt)
        delay = np.where(lag < 0, owed + lag, np.maximum(owed, lag))
        advance = np.maximum(0.0, dt - delay) / step[k]
        rem0 = self.rem[running]
        took = np.minimum(advance, rem0)
        self._decoded_s = np.bincount(k, weights=took * step[k], minlength=k_all)
        self.rem[running] = rem0 - took
        self.ctx[running] += took
        self.decoded += float(took.sum())
        end = rem0 <= advance
        still = [running[~end]]
        ended = running[end]
        self.lag[running] = 0.0
        first = np.full(k_all, t + dt)
        np.minimum.at(first, k, t + np.minimum(delay, dt))
        self._span_end = np.full(k_all, t)
        if ended.size:
            ke = k[end]
            at = t + delay[end] + rem0[end] * step[ke]
            np.maximum.at(self._span_end, ke, at)
            still.append(self._continue_in_slice(ended, at, t + dt, step))
        still_all = np.concatenate(still)
        self._span_end[self.where[still_all]] = t + dt
        start_b = np.bincount(k, minlength=k_all)
        occ = np.ones(k_all)
        open_s = np.maximum(1e-9, (avail * start_b))
        np.divide(self._decoded_s, open_s, out=occ, where=(start_b > 0) & (avail > 0))
        self._occupancy = np.minimum(1.0, occ)
        self._last = (still_all, step)
        # a turn taken inside the slice already waited for its own prefill; its instance owes it to the others
        self.lag[still_all] = -self._own_debt[still_all]
        self._own_debt[:] = 0.0
        span = self._span_end - first
        real = np.zeros(k_all)
        np.divide(self._decoded_s, span, out=real, where=span > 1e-9)
        return step, np.maximum(real, np.where(start_b > 0, 1.0, 0.0))

    def _capacity(self, t: float, dt: float, running: np.ndarray) -> float:
        """Tokens the started, active instances could decode in [t, t + dt) at their largest batch: as many
        sequences as `max_num_seqs` and their KV pool allow at the running contexts (each instance's mean, or the
        mean over all running requests where one has none). `decoded / capacity` is the rollout's utilisation."""
        inst = self.inst
        up = np.maximum(0.0, t + dt - np.maximum(t, inst.ready_at)) * inst.active
        if not up.any():
            return 0.0
        k_all = len(inst)
        b = np.bincount(self.where[running], minlength=k_all)
        ctx_k = np.bincount(self.where[running], weights=self.ctx[running], minlength=k_all)
        live = self._live
        mean_all = float(self.ctx[live].mean()) if live.size else 1.0
        ctx = np.where(b > 0, ctx_k / np.maximum(b, 1), mean_all)
        batch = np.clip(np.floor(self._cap_k() / np.maximum(ctx, 1.0)), 1, self.c.max_num_seqs)
        total = 0.0
        for tp in self._degrees():
            sel = (inst.tp == tp) & (up > 0)
            if sel.any():
                step = self.rc.decode_step_time(int(tp), batch[sel], ctx[sel])
                total += float((up[sel] * batch[sel] / step).sum())
        return total

    def _continue_in_slice(self, ended: np.ndarray, at: np.ndarray, slice_end: float, step: np.ndarray) -> np.ndarray:
        """Segments `ended` at times `at`; the requests that go on decoding inside this slice (`_end_segments`)
        run their next segment from when they can, at their instance's step time of the slice, until no segment
        ends before `slice_end`. Returns the requests still decoding at the slice end."""
        still = []
        while ended.size:
            cont, start = self._end_segments(ended, at, slice_end)
            if cont.size == 0:
                break
            k = self.where[cont]
            advance = np.maximum(0.0, slice_end - start) / step[k]
            rem0 = self.rem[cont]
            took = np.minimum(advance, rem0)
            self._decoded_s += np.bincount(k, weights=took * step[k], minlength=len(self._decoded_s))
            self.rem[cont] = rem0 - took
            self.ctx[cont] += took
            self.decoded += float(took.sum())
            end = rem0 <= advance
            still.append(cont[~end])
            ended, at = cont[end], start[end] + rem0[end] * step[k[end]]
        return np.concatenate(still) if still else ended[:0]

    def _end_segments(self, ended: np.ndarray, at: np.ndarray, slice_end: float) -> tuple[np.ndarray, np.ndarray]:
        """Segments that ended at times `at`: the request finishes, calls its tool, moves to another bucket
        (through the same path, with no tool time), or goes on with its next chunk in place. Returns the requests
        that go on decoding inside this slice and when each starts: a chunk boundary at once; and the requests
        that take a slot freed inside this slice (`_refill`)."""
        w = self.work
        seg = self.turn[ended]
        last = seg >= w.num_segments[ended] - 1
        fin = ended[last]
        self._set_state(fin, DONE)
        self.finish[fin] = at[last]
        self._note_freed(fin, at[last])
        go, sg, ag = ended[~last], seg[~last], at[~last]
        keep = ~w.tool_end[go, sg] & ((self.routes.carried[go, sg + 1] == 0) | self._covered(go, sg + 1))
        stay = go[keep]  # a chunk boundary with no migration: nothing happens
        self.turn[stay] += 1
        self.rem[stay] = w.gen[stay, self.turn[stay]].astype(float)
        self.lag[stay] = 0.0
        go, sg, ag = go[~keep], sg[~keep], ag[~keep]
        if go.size:
            tool_tok = w.tool_tokens[go, sg].astype(float)
            self.ctx[go] += tool_tok
            self.pending[go] = tool_tok
            self.ready[go] = ag + w.latency[go, sg]
            self.turn[go] = sg + 1
            self.moved[go] = False
            self.rem[go] = w.gen[go, sg + 1].astype(float)
            self._set_state(go, TOOL)
            self._note_freed(go, ag)
        back, start = self._refill(slice_end)
        return np.concatenate([stay, back]), np.concatenate([at[~last][keep], start])

    def _refill(self, slice_end: float) -> tuple[np.ndarray, np.ndarray]:
        """Slots freed inside this slice go to turns under way inside it, not at the next boundary, so a request
        can run several turns in one slice. Candidates on an instance with freed slots: turns queued there and
        turns whose tool returns inside this slice and that stay on their instance (a routed move waits for the
        boundary); as many as its KV room holds, by readiness. Turn i takes the first slot freed once it is back
        and after turn i - 1's, s_i = max(s_(i-1) + 1, g_i), when new requests queue on the instance (they take
        the slots no turn is back for, at the boundary, as of when each came free: `_credit`); with none queued
        the i-th turn takes the i-th slot. A taker decodes from max(slot free, ready) plus the prefill of its tool
        tokens, which its instance owes at the next slice. Returns the requests taken and when each starts."""
        fk, ft = self._freed
        none = (np.zeros(0, np.int64), np.zeros(0))
        if fk.size == 0:
            return none
        k_all = len(self.inst)
        slots_k = np.bincount(fk, minlength=k_all)
        waiting = self._in_state(WAIT)
        fresh = self.fresh[waiting]
        new_k = np.bincount(self.where[waiting[fresh]], minlength=k_all)
        tool = self._in_state(TOOL)
        tool = tool[self.ready[tool] < slice_end]
        if tool.size:
            turn = self.turn[tool]
            tool = tool[self.moved[tool] | self._covered(tool, turn) | (self.routes.carried[tool, turn] == 0)]
        cand = np.concatenate([waiting[~fresh], tool])
        cand = cand[slots_k[self.where[cand]] > 0]
        if cand.size == 0:
            return none
        # the KV room the boundary's admission would see now (contexts as of the slice end: a little cautious)
        running = self._in_state(RUN)
        run_k = np.bincount(self.where[running], minlength=k_all)
        used_k = np.bincount(self.where[running], weights=self.ctx[running], minlength=k_all)
        room = self._cap_k() - used_k - self.c.kv_headroom_seqs * used_k / np.maximum(run_k, 1)
        k = self.where[cand]
        cand, k, rank = _grouped(cand, k, np.lexsort((self.ready[cand], k)))
        need = self.ctx[cand]
        cs = np.cumsum(need)
        within = cs - (cs - need)[np.flatnonzero(rank == 0)][np.cumsum(rank == 0) - 1]
        fits = (within <= room[k]) | ((rank == 0) & (run_k[k] == 0))
        cand, k, rank = cand[fits], k[fits], rank[fits]
        sorder = np.lexsort((ft, fk))
        fk, ft = fk[sorder], ft[sorder]
        first_slot = np.searchsorted(fk, np.arange(k_all), side="left")
        span = float(ft.max() - ft.min()) + 1.0
        key = fk * span + (ft - ft.min())
        g = np.searchsorted(key, k * span + (self.ready[cand] - ft.min()), side="left") - first_slot[k]
        big = float(cand.size + fk.size + 1)
        chain = rank + np.maximum.accumulate(g - rank + k * big) - k * big
        s = np.where(new_k[k] > 0, chain, rank).astype(np.int64)
        ok = s < slots_k[k]
        cand, k, slot = cand[ok], k[ok], first_slot[k[ok]] + s[ok]
        secs = np.zeros(cand.size)
        tps = self.inst.tp[k]
        for tp in np.unique(tps):
            sel = tps == tp
            secs[sel] = self.rc.prefill_time(int(tp), self.pending[cand[sel]], self.ctx[cand[sel]] / 2.0)
        start = np.maximum(ft[slot], self.ready[cand]) + secs
        inside = start < slice_end
        if not inside.any():
            return none
        cand, k, slot, secs, start = cand[inside], k[inside], slot[inside], secs[inside], start[inside]
        self._later_debt += np.bincount(k, weights=secs, minlength=k_all)
        self._own_debt[cand] += secs
        self.pending[cand] = 0.0
        self.lag[cand] = 0.0
        self._set_state(cand, RUN)
        left = np.ones(fk.size, bool)
        left[slot] = False
        self._freed = (fk[left], ft[left])
        return cand, start

    # --- when to look again -------------------------------------------------------------------------------------
    def run_to_end(self, t: float = 0.0) -> float:
        """Advance this rollout alone (nothing else shares its instances) from `t` until every request has
        finished, one event at a time; returns the clock at the last event."""
        while not self.done:
            dt = self.next_event(t) - t
            self.advance(t, dt)
            t += dt
        return t

    def next_event(self, t: float) -> float:
        """The next time something changes (a segment end, a tool return, an instance start), at least
        `min_slice_s` and at most `max_slice_s` ahead. Segment ends use the step times of the last slice."""
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
        load = self.load()
        live = self._in_state(DONE, equal=False)
        seg = self.turn[live] - (self.state[live] == TOOL)  # in a tool call: the bucket it ran in so far
        lowest = int(self.routes.bucket[live, seg].min()) if live.size else np.inf
        return np.flatnonzero(self.inst.active & (load == 0) & (self.inst.bucket < lowest))

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
