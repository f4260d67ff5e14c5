"""The timed rollout's slice decoding and admission in C, where the optional extension `libra.sim._slice_native` is
built (ext/sim; slice_native.h names the parts): `SliceDecode._decode` (both decode passes with the turns that run
inside the slice, `_continue_in_slice`, `_end_segments`, `_refill`; the step times, the check between the passes,
the capacity), `Admission._admit` (both passes, with the work-conserving `_steal` between them and `_credit`),
`RolloutRun._returns` and `RolloutRun.next_event`; `advance` runs a slice's three in one call, and decoding hands
the next event and the requests in a tool call on to the next boundary. The same floats bit for bit:
tests/sim/test_slice_native.py, and the golden reports under tests/sim/golden with and without it. The Python code
stays the reference and the fallback: a machine without a C compiler installs and runs it, and
`LIBRA_PURE_PYTHON=1` selects it.

A rollout uses the kernel only when the kernel's prefill and decode step times equal `RolloutCost.prefill_time`'s
and `decode_step_time`'s on probe values for every degree it runs (`degree_table`), and its arrays are the kernel's
(`usable`): a cost model whose formula changed, or a subclass, falls back to Python."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from libra._native import optional_extension
from libra.planning.cost import RolloutCost
from libra.sim.states import DONE

if TYPE_CHECKING:
    from libra.sim.rollout import RolloutRun

# (tokens, context) probes of the prefill formula: zero, small, typical and large, fractional contexts
_PROBES = ((0.0, 0.0), (1.0, 0.5), (137.0, 2048.5), (4096.0, 17_000.25), (32_768.0, 65_537.5), (5.0e5, 1.0e6))


def load() -> ModuleType | None:
    """The extension, or None where it is not built or `LIBRA_PURE_PYTHON` is set."""
    return optional_extension("libra.sim._slice_native")


def _sums_agree(ext: ModuleType | None) -> bool:
    """The kernel's pairwise sum is this numpy's `x.sum()` (checked once at import on a few lengths: a numpy that
    sums another way would make the kernel's floats differ from the reference's)."""
    if ext is None:
        return False
    rng = np.random.default_rng(0)
    for n in (0, 5, 8, 100, 129, 1000, 10_007):
        a = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)
        if ext.pairwise_sum(a) != float(a.sum()) or ext.pairwise_sum(a) != float(np.add.reduce(a)):
            return False
    return True


_NATIVE = load()
if not _sums_agree(_NATIVE):
    _NATIVE = None


def degree_table(rc: RolloutCost, degrees: tuple[int, ...]) -> tuple[float, float, np.ndarray, np.ndarray] | None:
    """(work0, attn, one row of prefill terms per degree, one row of decode terms per degree) when the kernel's
    prefill and decode step times are `rc.prefill_time`'s and `rc.decode_step_time`'s on every probe, else None."""
    if _NATIVE is None:
        return None
    prefill_rows, decode_rows = [], []
    work0 = attn = 0.0
    for tp in degrees:
        work0, attn, *row = rc.prefill_terms(tp)
        dec = rc.decode_terms(tp)
        for tokens, context in _PROBES:
            want = float(rc.prefill_time(tp, np.array([tokens]), np.array([context]))[0])
            if _NATIVE.prefill(tuple(row), work0, attn, tokens, context) != want:
                return None
            batch = max(1.0, tokens / 64.0)
            want = float(rc.decode_step_time(tp, np.array([batch]), np.array([context]))[0])
            if _NATIVE.decode_step(dec, work0, attn, batch, context) != want:
                return None
        prefill_rows.append(row)
        decode_rows.append(dec)
    return work0, attn, np.array(prefill_rows, float), np.array(decode_rows, float)


def usable(run: RolloutRun) -> bool:
    """The kernel can decode this rollout's slices: it is built, the prefill formula is the kernel's, and the
    arrays have the kernel's types and layout."""
    w, r = run.work, run.routes
    wide = (w.tool_end, w.tool_tokens, w.latency, w.gen, r.carried, r.bucket)
    return (
        _NATIVE is not None
        and all(a.flags.c_contiguous and a.shape == w.gen.shape for a in wide)
        and (w.tool_end.dtype, w.tool_tokens.dtype, w.latency.dtype, w.gen.dtype) == (bool, np.int64, float, np.int64)
        and r.carried.dtype == np.int64
        and r.bucket.dtype == np.int64
        and w.num_segments.dtype == np.int64
    )


def advance(run: RolloutRun, t: float, dt: float, table: tuple, in_tool: np.ndarray, tolerance: float) -> None:
    """`RolloutRun.advance(t, dt)` in C once its live requests are listed: the tool calls back (`returns`) with
    their routed moves (`moves`), admission (`admit_slice`) and decoding (`decode_slice`), the state after each
    the reference's; the per-state sets the slice changed are dropped once, at its end. `in_tool`: live requests,
    ascending, that hold every one in a tool call."""
    k_all = len(run.inst)
    cap_k = run._cap_k()
    end = t + dt
    touched, moving, carried = _returns(run, end, in_tool, k_all)
    if moving.size:
        touched |= _moves(run, moving, carried, end, table, k_all)
    touched |= _admit(run, t, table, k_all, cap_k)
    decoded, left = _decode(run, t, dt, table, tolerance, k_all, cap_k)
    _forget(run, touched | decoded)
    _note_live(run, left)


def decode_slice(run: RolloutRun, t: float, dt: float, table: tuple, tolerance: float) -> None:
    """`SliceDecode._decode(t, dt)` in C (both passes, the check between them, the busy GPU-seconds, the capacity
    and the instances' debt), leaving the rollout's state as the reference does; `table`: `degree_table` of the
    rollout's degrees; `tolerance`: `REFINE_TOLERANCE`."""
    k_all = len(run.inst)
    touched, left = _decode(run, t, dt, table, tolerance, k_all, run._cap_k())
    _forget(run, touched)
    _note_live(run, left)


def _note_live(run: RolloutRun, left: bytearray | None) -> None:
    """Where some finished in the slice, its decoding listed the requests not DONE, as `_in_state(DONE, equal=False)`
    lists them: kept as that set (after the sets the slice changed were dropped)."""
    if left is not None:
        live = np.frombuffer(left, np.int64)
        live.flags.writeable = False
        run._by_state[(DONE, False)] = live


def _decode(
    run: RolloutRun, t: float, dt: float, table: tuple, tolerance: float, k_all: int, cap_k: np.ndarray
) -> tuple[int, bytearray | None]:
    """`decode_slice` but the per-state sets: returns the states it changed (bits) and the requests left."""
    assert _NATIVE is not None
    work0, attn, prefill_rows, decode_rows = table
    occupancy, decoded_s, span_end, step = np.empty(k_all), np.empty(k_all), np.empty(k_all), np.empty(k_all)
    fk, ft = run._freed
    run._later_debt = np.zeros(k_all)  # sized anew: instances join between slices
    inst, c = run.inst, run.c
    rows = run._rows
    if rows is None:  # the per-request arrays, bound once for the rollout's life (in __init__)
        w, routes = run.work, run.routes
        rows = run._rows = (
            run.rem, run.ctx, run.pending, run.ready, run.finish, run.lag, run._own_debt,
            run.state, run.turn, run.moved, run.stolen, run.fresh, run.where, w.num_segments,
            w.tool_end, w.tool_tokens, w.latency, w.gen, routes.carried, routes.bucket,
        )  # fmt: skip
    arrays = (
        *rows, inst.bucket, inst.tp, cap_k, inst.active, inst.ready_at, run.debt, run._later_debt,
        run._busy_until_of(k_all), np.ascontiguousarray(run._occupancy, float), occupancy, decoded_s, span_end, step,
        run._live, np.ascontiguousarray(fk, np.int64), np.ascontiguousarray(ft, float), prefill_rows, decode_rows,
        *run._order,
    )  # fmt: skip
    n, width = run.work.gen.shape
    decoded, busy, capacity, still, fk, ft, touched, left, next_at, in_tool, loads = _NATIVE.decode_slice(
        arrays, n, width, k_all, t, dt, run.decoded, c.kv_headroom_seqs, work0, attn,
        float(c.max_num_seqs), c.preemption_factor, c.max_churn, tolerance, run.min_slice_s, run.max_slice_s,
    )  # fmt: skip
    run.decoded = decoded
    run.busy_gpu_s += busy
    run.capacity_tokens += capacity
    run._freed = (np.frombuffer(fk, np.int64), np.frombuffer(ft, float))
    run._queues = None
    if still is None:  # nothing ran: the last slice's occupancy stays
        run._last = None
    else:
        run._last = (np.frombuffer(still, np.int64), step)
        run._occupancy, run._decoded_s, run._span_end = occupancy, decoded_s, span_end
    if next_at == next_at:  # (NaN where the scan met a bad row: `next_event` then asks again, and says what)
        # `next_event(t + dt)`, the requests in a tool call and `load()` (None where the scan could not count
        # it), as the kernel found them in its last scan
        load = None if loads is None else np.frombuffer(loads, np.int64)
        run._next = (t + dt, k_all, next_at, np.frombuffer(in_tool, np.int64), load)
    return touched, left


def returns(run: RolloutRun, slice_end: float) -> tuple[np.ndarray, np.ndarray]:
    """The start of `RolloutRun._returns`: the tool calls back before `slice_end` go to WAIT; returns the requests
    among them whose routed move applies (ascending) and the context each carries."""
    touched, moving, carried = _returns(run, slice_end, run._live, len(run.inst))
    _forget(run, touched)
    return moving, carried


def _returns(run: RolloutRun, slice_end: float, among: np.ndarray, k_all: int) -> tuple[int, np.ndarray, np.ndarray]:
    """`returns` but the per-state sets (and the states it changed first); `among`: live requests, ascending,
    that hold every one in a tool call."""
    assert _NATIVE is not None
    w, r = run.work, run.routes
    arrays = (
        among,
        run.state,
        run.ready,
        run.moved,
        run.stolen,
        run.turn,
        run.where,
        r.carried,
        r.bucket,
        run.inst.bucket,
    )
    n, width = w.gen.shape
    touched, moving, carried = _NATIVE.returns(arrays, n, width, k_all, slice_end)
    return touched, np.frombuffer(moving, np.int64), np.frombuffer(carried, np.int64)


def moves(run: RolloutRun, moving: np.ndarray, carried: np.ndarray, slice_end: float, table: tuple) -> None:
    """The rest of `RolloutRun._returns` in C: the requests `moving` (from `returns`, ascending) move to their
    routed bucket (`_assign`), each carrying `carried` tokens by KV transfer or prefilled again at its new instance,
    whichever is sooner; `table`: `degree_table` of the rollout's degrees."""
    _forget(run, _moves(run, moving, carried, slice_end, table, len(run.inst)))


def _moves(run: RolloutRun, moving: np.ndarray, carried: np.ndarray, slice_end: float, table: tuple, k_all: int) -> int:
    """`moves` but the per-state sets: returns the states it changed (bits)."""
    assert _NATIVE is not None
    work0, attn, prefill_rows, _ = table
    inst = run.inst
    run.migrations += int(moving.size)
    run.migrated_tokens += int(carried.sum())
    arrays = (
        moving, carried, run._live, run.state, run.where, run.moved, run.ready, run.pending, run.turn,
        run.routes.bucket, inst.bucket, inst.active, inst.tp, prefill_rows,
    )  # fmt: skip
    n, width = run.work.gen.shape
    bandwidth = run.cm.cluster.gpu.network_bandwidth_gbs * 1e9 * run.c.link_efficiency
    return _NATIVE.moves(
        arrays, n, width, k_all, slice_end, run.dispatch == "interleaved",
        float(run.cm.model.kv_bytes_per_token(1)), bandwidth, work0, attn,
    )  # fmt: skip


_STEAL_MODES = {"off": 0, "new": 1, "all": 2}


def admit_slice(run: RolloutRun, t: float, table: tuple) -> None:
    """`Admission._admit(t)` in C: both passes and the steal between them, the same state after."""
    _forget(run, _admit(run, t, table, len(run.inst), run._cap_k()))


_NO_SLOTS = (np.zeros(0, np.int64), np.zeros(0))  # (read only: every admission hands these on, no one writes them)
_NO_SLOTS[0].flags.writeable = _NO_SLOTS[1].flags.writeable = False


def _admit(run: RolloutRun, t: float, table: tuple, k_all: int, cap_k: np.ndarray) -> int:
    """`admit_slice` but the per-state sets: returns the states it changed (bits)."""
    assert _NATIVE is not None
    work0, attn, degrees, _ = table
    inst, c = run.inst, run.c
    run._refilled = np.zeros(k_all, np.int64)
    fk, ft = run._freed
    arrays = (
        run._live, run.state, run.where, run.ready, run.fresh, run.ctx, run.pending, run.lag, run.stolen, run.debt,
        run._refilled, inst.active, inst.ready_at, inst.bucket, inst.tp, cap_k,
        np.ascontiguousarray(fk, np.int64), np.ascontiguousarray(ft, float), degrees, *run._order,
    )  # fmt: skip
    touched, moved, tokens = _NATIVE.admit_slice(
        arrays, len(run.state), k_all, t, c.kv_headroom_seqs, c.per_request_overhead_s, int(c.max_num_seqs),
        _STEAL_MODES[run.steal], work0, attn,
    )  # fmt: skip
    run.rebalanced += moved
    run.rebalanced_tokens += tokens
    run._freed = _NO_SLOTS
    return touched


def steal(
    run: RolloutRun,
    t: float,
    waiting: np.ndarray,
    open_k: np.ndarray,
    room: np.ndarray,
    seats: np.ndarray,
    table: tuple,
) -> bool:
    """`Admission._steal` in C: the same requests moved (`where`, `stolen`, `pending`, the rebalanced counts);
    returns whether any moved. A simulation runs it inside `admit_slice`; this entry point checks it alone
    against the reference (tests/sim/test_slice_native.py)."""
    assert _NATIVE is not None
    work0, attn, degrees, _ = table
    inst = run.inst
    arrays = (
        waiting, open_k, np.ascontiguousarray(room, float), np.ascontiguousarray(seats, np.int64), run.where,
        run.fresh, run.ready, run.ctx, run.pending, run.stolen, inst.ready_at, inst.bucket, inst.tp, degrees,
    )  # fmt: skip
    any_moved, moved, tokens = _NATIVE.steal(
        arrays, len(run.state), len(inst), t, run.c.kv_headroom_seqs, run.steal == "all", work0, attn
    )
    run.rebalanced += moved
    run.rebalanced_tokens += tokens
    return any_moved


_NONE, _NONE_F = np.zeros(0, np.int64), np.zeros(0)  # `next_event` when the last slice ran nothing


def next_event(run: RolloutRun, t: float) -> float:
    """`RolloutRun.next_event(t)` in C: the same time."""
    assert _NATIVE is not None
    last = run._last
    still, step = last if last is not None else (_NONE, _NONE_F)
    arrays = (
        run._live, run.state, run.ready, run.where, run.debt, run.rem, np.ascontiguousarray(still, np.int64),
        np.ascontiguousarray(step, float), run.inst.ready_at,
    )  # fmt: skip
    return _NATIVE.next_event(
        arrays, len(run.state), len(run.inst), t, run.min_slice_s, run.max_slice_s, last is not None
    )


def _forget(run: RolloutRun, touched: int) -> None:
    """Drop the cached per-state sets of the states whose members changed (bit s of `touched`: state s)."""
    if touched:
        cache = run._by_state
        cache.pop(None, None)
        for key in [key for key in cache if key is not None and touched >> key[0] & 1]:
            del cache[key]
