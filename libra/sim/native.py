"""The timed rollout's decode pass and admission in C, where the optional extension `libra.sim._slice_native` is
built (ext/sim/slice_native.c): `SliceDecode._decode_pass_py` with the turns that run inside the slice
(`_continue_in_slice`, `_end_segments`, `_refill`), and `Admission._admit_queued` after the steal with `_credit`;
the same floats bit for bit (tests/sim/test_slice_native.py, and the golden reports under tests/sim/golden with and
without it). The Python code stays the reference and the
fallback: a machine without a C compiler installs and runs it, and `LIBRA_PURE_PYTHON=1` selects it.

A rollout uses the kernel only when the kernel's prefill time equals `RolloutCost.prefill_time` on probe values
for every degree it runs (`usable`): a cost model whose formula changed, or a subclass, falls back to Python."""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from libra.planning.cost import RolloutCost

if TYPE_CHECKING:
    from libra.sim.rollout import RolloutRun

# (tokens, context) probes of the prefill formula: zero, small, typical and large, fractional contexts
_PROBES = ((0.0, 0.0), (1.0, 0.5), (137.0, 2048.5), (4096.0, 17_000.25), (32_768.0, 65_537.5), (5.0e5, 1.0e6))


def load() -> ModuleType | None:
    """The extension, or None where it is not built or `LIBRA_PURE_PYTHON` is set."""
    if os.environ.get("LIBRA_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from libra.sim import _slice_native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _slice_native


_NATIVE = load()


def degree_table(rc: RolloutCost, degrees: tuple[int, ...]) -> tuple[float, float, np.ndarray] | None:
    """(work0, attn, one row of prefill terms per degree) when the kernel's prefill time is `rc.prefill_time`'s
    on every probe, else None."""
    if _NATIVE is None:
        return None
    rows = []
    work0 = attn = 0.0
    for tp in degrees:
        work0, attn, *row = rc.prefill_terms(tp)
        for tokens, context in _PROBES:
            want = float(rc.prefill_time(tp, np.array([tokens]), np.array([context]))[0])
            if _NATIVE.prefill(tuple(row), work0, attn, tokens, context) != want:
                return None
        rows.append(row)
    return work0, attn, np.array(rows, float)


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


def decode_pass(
    run: RolloutRun, t: float, dt: float, running: np.ndarray, step: np.ndarray, fixed: tuple, table: tuple
) -> tuple[np.ndarray, np.ndarray]:
    """`SliceDecode._decode_pass_py(t, dt, running, batch, inputs, fixed)` given the step times `step` it computes
    first; `table`: `degree_table` of the rollout's degrees. Returns (step, real) and leaves the rollout's state as
    the reference does."""
    assert _NATIVE is not None
    k, t_delay, go_s, rem0, first, has, open_s, occupied = fixed
    k_all = len(run.inst)
    run._decoded_s = np.empty(k_all)
    run._span_end = np.empty(k_all)
    run._occupancy = np.empty(k_all)
    real = np.empty(k_all)
    fk, ft = run._freed
    work0, attn, degrees = table
    w, routes, inst = run.work, run.routes, run.inst
    arrays = (
        run.rem, run.ctx, run.pending, run.ready, run.finish, run.lag, run._own_debt,
        run.state, run.turn, run.moved, run.stolen, run.fresh, run.where, w.num_segments,
        w.tool_end, w.tool_tokens, w.latency, w.gen, routes.carried, routes.bucket,
        inst.bucket, inst.tp, run._cap_k(), run._later_debt, run._decoded_s, run._span_end, run._occupancy, real,
        run._live, running, k, t_delay, go_s, rem0, first, has, open_s, occupied, step,
        np.ascontiguousarray(fk, np.int64), np.ascontiguousarray(ft, float), degrees,
    )  # fmt: skip
    n, width = w.gen.shape
    decoded, still, fk, ft, touched = _NATIVE.decode_pass(
        arrays, n, width, k_all, t, dt, run.decoded, run.c.kv_headroom_seqs, work0, attn
    )
    run.decoded = decoded
    run._freed = (np.frombuffer(fk, np.int64), np.frombuffer(ft, float))
    still = np.frombuffer(still, np.int64)
    run._last = (still, step)
    _forget(run, touched)
    return step, real


def admit(
    run: RolloutRun,
    t: float,
    waiting: np.ndarray,
    open_k: np.ndarray,
    room: np.ndarray,
    seats: np.ndarray,
    run_k: np.ndarray,
    table: tuple,
) -> np.ndarray:
    """`Admission._admit_queued` from its candidates on (after the steal): admits what fits on the open
    instances, with the same state after; returns the admitted requests."""
    assert _NATIVE is not None
    work0, attn, degrees = table
    fk, ft = run._freed
    arrays = (
        waiting, open_k, np.ascontiguousarray(room, float), np.ascontiguousarray(seats, np.int64),
        np.ascontiguousarray(run_k, np.int64), run.where, run.ready, run.fresh, run.ctx, run.pending, run.lag,
        run.state, run.debt, run._refilled, run.inst.tp, np.ascontiguousarray(fk, np.int64),
        np.ascontiguousarray(ft, float), degrees,
    )  # fmt: skip
    go, touched = _NATIVE.admit(
        arrays, len(run.state), len(run.inst), t, run.c.kv_headroom_seqs, run.c.per_request_overhead_s, work0, attn
    )
    _forget(run, touched)
    return np.frombuffer(go, np.int64)


def _forget(run: RolloutRun, touched: int) -> None:
    """Drop the cached per-state sets of the states whose members changed (bit s of `touched`: state s)."""
    if touched:
        cache = run._by_state
        cache.pop(None, None)
        for key in [key for key in cache if key is not None and touched >> key[0] & 1]:
            del cache[key]
