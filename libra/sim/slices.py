"""Decoding one slice of the timed rollout, turns inside the slice included (the many-turn slice refinement).

A mixin of `libra.sim.rollout.RolloutRun`, whose state it reads and writes (see the module docstring there for the
model). `_decode` decodes the slice [t, t + dt) once at the batch predicted from its start, then again where the
batch it actually ran at moves an instance's step time by more than `REFINE_TOLERANCE` (`_decode_pass`, with the
state restored in between: `_save`, `_restore`). Inside a pass a request may run several segments: a chunk
boundary goes on at once, and a turn whose tool returns inside the slice takes a freed slot again and decodes from
its return (`_continue_in_slice`, `_end_segments`, `_refill`), so results do not depend on how many turns fit in a
slice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libra.sim import native
from libra.sim.states import DONE, RUN, TOOL, WAIT

if TYPE_CHECKING:
    from libra.planning.cost import CostCoefficients, RolloutCost
    from libra.sim.rollout import Instances
    from libra.sim.routing import Routes
    from libra.sim.workload import StepWork

# a slice is decoded again at the batch it ran at when that changes its engine step time by more than this
REFINE_TOLERANCE = 0.01


def _grouped(items: np.ndarray, k: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, ...]:
    """`items` and their instances `k` in `order` (which must keep each instance's items together) and non-empty;
    each item's rank inside its instance's group, the position where each group starts, and each item's group."""
    items, k = items[order], k[order]
    first = np.empty(k.size, bool)
    first[0] = True
    np.not_equal(k[1:], k[:-1], out=first[1:])
    starts = first.nonzero()[0]
    group = first.cumsum() - 1
    rank = np.arange(k.size) - starts[group]
    return items, k, rank, starts, group


# the methods the C slice and admission stand in for, and the modules that define them
_KERNEL_STEPS = (
    "_decode", "_decode_pass", "_continue_in_slice", "_end_segments", "_refill", "_slice_queues",
    "_note_freed", "_covered", "_set_state", "_prefill_s", "_cap_k", "_admit", "_admit_queued", "_credit", "_steal",
    "_save", "_restore", "_pass_inputs", "_busy", "_pass_arrays", "step_batch", "step_times", "_step_inputs",
    "_capacity", "_in_state", "_degrees", "_degree_masks", "next_event", "_returns",
)  # fmt: skip
_KERNEL_MODULES = ("libra.sim.slices", "libra.sim.admission", "libra.sim.rollout")


def _overridden(cls: type) -> bool:
    """A step of the Python pass is defined outside the simulator's own modules (a subclass that changes or
    watches it): such a rollout runs the Python pass."""
    for name in _KERNEL_STEPS:
        owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
        if owner is None or owner.__module__ not in _KERNEL_MODULES:
            return True
    return False


class SliceDecode:
    # The state of `RolloutRun` this mixin reads and writes (declared here for the type checker; set there).
    inst: Instances
    rc: RolloutCost
    c: CostCoefficients
    work: StepWork
    routes: Routes
    state: np.ndarray
    turn: np.ndarray
    rem: np.ndarray
    ctx: np.ndarray
    pending: np.ndarray
    ready: np.ndarray
    finish: np.ndarray
    fresh: np.ndarray
    where: np.ndarray
    lag: np.ndarray
    moved: np.ndarray
    debt: np.ndarray
    decoded: float
    busy_gpu_s: float
    capacity_tokens: float
    _last: tuple[np.ndarray, np.ndarray] | None
    _later_debt: np.ndarray
    _own_debt: np.ndarray
    _floats: np.ndarray
    _live: np.ndarray
    _occupancy: np.ndarray
    _freed: tuple[np.ndarray, np.ndarray]
    _by_state: dict
    _decoded_s: np.ndarray
    _span_end: np.ndarray
    _busy_end: np.ndarray
    _busy_until: np.ndarray
    _queues: tuple[np.ndarray, np.ndarray] | None
    _kernel: tuple | None
    _kernel_key: int

    if TYPE_CHECKING:

        def _degrees(self) -> tuple[int, ...]: ...
        def _in_state(self, state: int, *, equal: bool = True) -> np.ndarray: ...
        def _set_state(self, reqs: np.ndarray, state: int) -> None: ...
        def _cap_k(self) -> np.ndarray: ...
        def _prefill_s(self, reqs: np.ndarray, k: np.ndarray) -> np.ndarray: ...
        def _covered(self, reqs: np.ndarray, seg: np.ndarray) -> np.ndarray: ...
        def _note_freed(self, reqs: np.ndarray, at: np.ndarray) -> None: ...
        def _capacity(self, t: float, dt: float, running: np.ndarray, count_k: np.ndarray | None) -> float: ...
        def step_batch(self, running: np.ndarray, count_k: np.ndarray | None = None) -> np.ndarray: ...
        def step_times(
            self, running: np.ndarray, batch: np.ndarray | None = None, inputs: tuple | None = None
        ) -> np.ndarray: ...
        def _step_inputs(self, running: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def _decode(self, t: float, dt: float) -> None:
        """Decode the slice [t, t + dt). A request may run several segments inside one slice: a segment that ends
        at a chunk boundary goes on at once, and one that ends in a tool call whose result comes back before the
        slice ends takes its slot again (when its instance has nobody queued and KV room for it) and decodes from
        its return, so results do not depend on how many turns fit in a slice (`_continue_in_slice`).

        The engine step time of a slice depends on the batch over the slice, which requests leaving for tools and
        coming back inside it change: the slice is decoded once at the batch predicted from its start (the running
        requests, scaled by the last slice's occupancy), then, where the batch it actually ran at (batch-seconds
        decoded over the instance's busy span) changes its step time by more than `REFINE_TOLERANCE`, decoded
        again at that batch (`_decode_pass`). In C where the optional extension is built (`libra.sim.native`),
        the same state after, bit for bit; this code is the reference."""
        table = self._kernel_table()
        if table is not None:  # in C (libra.sim.native): the same state after
            native.decode_slice(self, t, dt, table, REFINE_TOLERANCE)  # type: ignore[arg-type]
            return
        running = self._in_state(RUN)
        k_all = len(self.inst)
        self._last = None
        self._later_debt = np.zeros(k_all)
        self._queues = None
        if running.size:
            saved = self._save()
            k = self.where[running]
            count_k = np.bincount(k, minlength=k_all)
            # per instance, seconds into the slice its first request's work starts where that is before the slice
            # start (a slot freed in the last slice refilled as of when it came free, `_credit`; read before the
            # passes write `lag`)
            start = np.zeros(k_all)
            np.minimum.at(start, k, self.lag[running])
            used = self.step_batch(running, count_k)
            inputs = self._step_inputs(running)
            fixed = self._pass_inputs(t, dt, running, k, count_k)
            step, real = self._decode_pass(t, dt, running, used, inputs, fixed)
            real = np.where(real > 0, real, used)
            step_real = self.step_times(running, real)
            fin = np.isfinite(step)
            off = np.abs(step_real[fin] - step[fin]) > REFINE_TOLERANCE * step[fin]
            if off.any():
                self._restore(saved)  # the state `inputs` read, as it was
                self._decode_pass(t, dt, running, real, inputs, fixed)
            # seconds into the slice where the instance's last segment in it ends (the slice end where one still runs)
            end = np.where(self._busy_end >= t + dt, dt, self._busy_end - t)
        else:
            end = start = np.zeros(k_all)
            count_k = None
        self._busy(t, dt, start, end)
        self.capacity_tokens += self._capacity(t, dt, running, count_k)
        self.debt = np.maximum(0.0, self.debt - dt) + self._later_debt

    def _busy(self, t: float, dt: float, start: np.ndarray, end: np.ndarray) -> None:
        """Add the slice's busy GPU-seconds: per instance, from the slice start (or `start`, seconds into the
        slice, where its work starts before it) to `end` (where its last segment in the slice ends), at least its
        owed prefill, less what an earlier slice counted already (`_busy_until`). An instance whose requests all
        finished or left for tools early in the slice (the last slice of a rollout runs past the rollout's end) is
        idle for the rest of it."""
        end = np.maximum(np.minimum(self.debt, dt), end)
        start = np.maximum(start, self._busy_until_of(len(end)) - t)
        busy_k = np.maximum(0.0, end - start)
        self.busy_gpu_s += float((busy_k * self.inst.tp).sum())
        self._busy_until = np.maximum(self._busy_until, t + end)

    def _busy_until_of(self, k_all: int) -> np.ndarray:
        """`_busy_until` over `k_all` instances: one added since the last slice has nothing counted yet."""
        extra = k_all - self._busy_until.size
        if extra > 0:
            self._busy_until = np.concatenate([self._busy_until, np.full(extra, -np.inf)])
        return self._busy_until

    def _pass_inputs(self, t: float, dt: float, running: np.ndarray, k: np.ndarray, count_k: np.ndarray) -> tuple:
        """What both decode passes of a slice read and neither writes (the passes restore `lag` and `rem` in
        between, and write neither `debt` nor `where`): per running request its instance, the delay before it
        decodes and what it has left of its segment; per instance its first start and the share of the slice it
        is free to decode."""
        k_all = len(self.inst)
        avail = np.maximum(0.0, dt - self.debt)
        lag = self.lag[running]
        # the instance's owed prefill stalls it at the slice start: a request that becomes ready later is not
        # held by it (one that decodes as of before the boundary, lag < 0, is, after its credit)
        owed = np.minimum(self.debt[k], dt)
        delay = np.where(lag < 0, owed + lag, np.maximum(owed, lag))
        first = np.full(k_all, t + dt)
        np.minimum.at(first, k, t + np.minimum(delay, dt))
        has = count_k > 0
        open_s = np.maximum(1e-9, (avail * count_k))
        occupied = has & (avail > 0)
        return k, t + delay, np.maximum(0.0, dt - delay), self.rem[running], first, has, open_s, occupied

    def _pass_arrays(self) -> tuple[np.ndarray, ...]:
        """The per-request arrays a decode pass writes (only at requests not DONE when the slice began, `_live`):
        the float block (rem, ctx, pending, ready, finish, lag, _own_debt), state, turn, moved."""
        return (self._floats, self.state, self.turn, self.moved)

    def _save(self) -> tuple:
        # only the requests a pass can touch: in a rollout's long tail a few percent of them
        live = self._live
        at = (Ellipsis,) if 2 * live.size > self.state.size else (Ellipsis, live)
        values = tuple(a[at].copy() if len(at) == 1 else a[at] for a in self._pass_arrays())
        return at, values, self._freed, self.decoded, dict(self._by_state)

    def _restore(self, saved: tuple) -> None:
        at, values, self._freed, self.decoded, by_state = saved
        for array, value in zip(self._pass_arrays(), values, strict=True):
            array[at] = value
        self._by_state = by_state  # the per-state sets of the state restored
        self._later_debt = np.zeros(len(self.inst))

    def _kernel_table(self) -> tuple | None:
        """`native.degree_table` of this rollout's degrees when the C slice and admission may run it (recomputed
        when instances are added); None where they may not: not built, a prefill or decode formula they do not
        have, arrays they do not take, or a subclass that defines a step of the Python code elsewhere."""
        if self._kernel_key != len(self.inst):
            ok = not _overridden(type(self)) and native.usable(self)  # type: ignore[arg-type]
            self._kernel = native.degree_table(self.rc, self._degrees()) if ok else None
            self._kernel_key = len(self.inst)
        return self._kernel

    def _decode_pass(
        self, t: float, dt: float, running: np.ndarray, batch: np.ndarray, inputs: tuple, fixed: tuple
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode the slice with every instance at `batch`; returns its step times and the batch each instance
        actually ran at: batch-seconds decoded over its busy span (from its first request's start to its last
        one's end, or the slice end). `fixed`: `_pass_inputs` of the slice."""
        k_all = len(self.inst)
        k, t_delay, go_s, rem0, first, has, open_s, occupied = fixed
        step = self.step_times(running, batch, inputs)
        step_k = step[k]
        advance = go_s / step_k
        took = np.minimum(advance, rem0)
        self._decoded_s = np.bincount(k, weights=took * step_k, minlength=k_all)
        self.rem[running] = rem0 - took
        self.ctx[running] += took
        self.decoded += float(took.sum())
        end = rem0 <= advance
        self.lag[running] = 0.0
        self._span_end = np.full(k_all, t)
        # the end of each instance's last segment in the slice, those continued inside it included (the busy time;
        # `_span_end`, which sets the batch the slice ran at, has only the first segments' ends)
        self._busy_end = np.full(k_all, t)
        if end.any():
            still = running[~end]
            ended = running[end]
            at = t_delay[end] + rem0[end] * step_k[end]
            np.maximum.at(self._span_end, k[end], at)
            np.maximum.at(self._busy_end, k[end], at)
            more = self._continue_in_slice(ended, at, t + dt, step)
            if more.size:
                still = np.concatenate([still, more])
        else:
            still = running
        self._span_end[self.where[still]] = t + dt
        self._busy_end[self.where[still]] = t + dt
        occ = np.ones(k_all)
        np.divide(self._decoded_s, open_s, out=occ, where=occupied)
        self._occupancy = np.minimum(1.0, occ)
        self._last = (still, step)
        # a turn taken inside the slice already waited for its own prefill; its instance owes it to the others
        self.lag[still] = -self._own_debt[still]
        self._own_debt[:] = 0.0
        span = self._span_end - first
        real = np.zeros(k_all)
        np.divide(self._decoded_s, span, out=real, where=span > 1e-9)
        return step, np.maximum(real, np.where(has, 1.0, 0.0))

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
            step_k = step[k]
            advance = np.maximum(0.0, slice_end - start) / step_k
            rem0 = self.rem[cont]
            took = np.minimum(advance, rem0)
            self._decoded_s += np.bincount(k, weights=took * step_k, minlength=len(self._decoded_s))
            self.rem[cont] = rem0 - took
            self.ctx[cont] += took
            self.decoded += float(took.sum())
            end = rem0 <= advance
            still.append(cont[~end])
            ended, at = cont[end], start[end] + rem0[end] * step_k[end]
            np.maximum.at(self._busy_end, k[end], at)
        return np.concatenate(still) if still else ended[:0]

    def _end_segments(self, ended: np.ndarray, at: np.ndarray, slice_end: float) -> tuple[np.ndarray, np.ndarray]:
        """Segments that ended at times `at`: the request finishes, calls its tool, moves to another bucket
        (through the same path, with no tool time), or goes on with its next chunk in place. Returns the requests
        that go on decoding inside this slice and when each starts: a chunk boundary at once; and the requests
        that take a slot freed inside this slice (`_refill`)."""
        w = self.work
        seg = self.turn[ended]
        last = seg >= w.num_segments[ended] - 1
        if last.any():
            on = ~last
            fin = ended[last]
            self._set_state(fin, DONE)
            self.finish[fin] = at_fin = at[last]
            go, sg, ag = ended[on], seg[on], at[on]
        else:
            fin, at_fin = ended[:0], at[:0]
            go, sg, ag = ended, seg, at
        nxt = sg + 1
        keep = ~w.tool_end[go, sg] & ((self.routes.carried[go, nxt] == 0) | self._covered(go, nxt))
        stay = go[keep]  # a chunk boundary with no migration: nothing happens
        stay_at = ag[keep]
        if stay.size:
            nxt_stay = nxt[keep]
            self.turn[stay] = nxt_stay
            self.rem[stay] = w.gen[stay, nxt_stay].astype(float)
            self.lag[stay] = 0.0
        tool = ~keep
        if tool.any():
            go, sg, ag, nxt = go[tool], sg[tool], ag[tool], nxt[tool]
            tool_tok = w.tool_tokens[go, sg].astype(float)
            self.ctx[go] += tool_tok
            self.pending[go] = tool_tok
            self.ready[go] = ag + w.latency[go, sg]
            self.turn[go] = nxt
            self.moved[go] = False
            self.rem[go] = w.gen[go, nxt].astype(float)
            self._set_state(go, TOOL)
            self._note_freed(np.concatenate([fin, go]), np.concatenate([at_fin, ag]))
        elif fin.size:
            self._note_freed(fin, at_fin)
        back, start = self._refill(slice_end)
        if back.size == 0:
            return stay, stay_at
        return np.concatenate([stay, back]), np.concatenate([stay_at, start])

    def _slice_queues(self) -> tuple[np.ndarray, np.ndarray]:
        """Per instance, the new requests queued, and the turns under way queued (ascending), as of the slice
        start. Nothing inside a slice queues a request or moves one between instances, and a pass takes only turns
        under way, so the first holds for the whole slice and the second, filtered by state, for each pass."""
        got = self._queues
        if got is None:
            waiting = self._in_state(WAIT)
            fresh = self.fresh[waiting]
            got = self._queues = (
                np.bincount(self.where[waiting[fresh]], minlength=len(self.inst)),
                waiting[~fresh],
            )
        return got

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
        new_k, queued = self._slice_queues()
        if queued.size:
            queued = queued[self.state[queued] == WAIT]  # minus those taken back earlier in this pass
        tool = self._in_state(TOOL)
        tool = tool[self.ready[tool] < slice_end]
        if tool.size:
            turn = self.turn[tool]
            tool = tool[self.moved[tool] | self._covered(tool, turn) | (self.routes.carried[tool, turn] == 0)]
        cand = np.concatenate([queued, tool]) if queued.size else tool
        cand = cand[slots_k[self.where[cand]] > 0]
        if cand.size == 0:
            return none
        # the KV room the boundary's admission would see now (contexts as of the slice end: a little cautious)
        running = self._in_state(RUN)
        where_run = self.where[running]
        run_k = np.bincount(where_run, minlength=k_all)
        used_k = np.bincount(where_run, weights=self.ctx[running], minlength=k_all)
        room = self._cap_k() - used_k - self.c.kv_headroom_seqs * used_k / np.maximum(run_k, 1)
        k = self.where[cand]
        cand, k, rank, starts, group = _grouped(cand, k, np.lexsort((self.ready[cand], k)))
        need = self.ctx[cand]
        cs = need.cumsum()
        within = cs - (cs - need)[starts][group]
        fits = (within <= room[k]) | ((rank == 0) & (run_k[k] == 0))
        if not fits.all():
            if not fits.any():
                return none
            cand, k, rank = cand[fits], k[fits], rank[fits]
        sorder = np.lexsort((ft, fk))
        fk, ft = fk[sorder], ft[sorder]
        first_slot = fk.searchsorted(np.arange(k_all), side="left")
        queue_k = new_k[k] > 0
        if queue_k.any():
            ft_min = ft.min()
            span = float(ft.max() - ft_min) + 1.0
            key = fk * span + (ft - ft_min)
            # index, among instance k's slots, of the first one freed once the turn is back: 0 for a turn back
            # before all of them (whose key would otherwise fall among a lower instance's slots)
            g = key.searchsorted(k * span + (self.ready[cand] - ft_min), side="left") - first_slot[k]
            np.maximum(g, 0, out=g)
            big = float(cand.size + fk.size + 1)
            chain = rank + np.maximum.accumulate(g - rank + k * big) - k * big
            s = np.where(queue_k, chain, rank).astype(np.int64)
        else:
            s = rank
        ok = s < slots_k[k]
        if ok.all():
            slot = first_slot[k] + s
        else:
            if not ok.any():
                return none
            cand, k, slot = cand[ok], k[ok], first_slot[k[ok]] + s[ok]
        secs = self._prefill_s(cand, k)
        start = np.maximum(ft[slot], self.ready[cand]) + secs
        inside = start < slice_end
        if not inside.all():
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
