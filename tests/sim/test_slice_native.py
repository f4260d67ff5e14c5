"""The C decode pass (ext/sim, `libra.sim.native`) against the Python reference
(`SliceDecode._decode`): the same state after every slice, bit for bit, on rollouts that reach every path
of the pass (chunk boundaries, tool calls, finishes, in-slice refills with and without new requests queued,
several degrees, routed moves, stolen requests). The extension is optional for users, not here: these tests fail
(they do not skip) when it is not built, as tests/scheduling/test_tree_native.py does for the tree's."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.planning.cost import CostCoefficients, CostModel
from libra.sim import native
from libra.sim.rollout import Instances, RolloutRun
from libra.sim.routing import routes_for
from libra.sim.states import DONE, TOOL
from libra.sim.workload import WorkSource
from libra.spec import ClusterSpec, get_gpu, get_model, parse_buckets

CLUSTER = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
CM = CostModel(CLUSTER, get_model("Qwen3-14B"))
FLOATS = (
    "rem", "ctx", "pending", "ready", "finish", "lag", "_own_debt", "debt", "_later_debt", "_occupancy", "_busy_until",
)  # fmt: skip
OTHERS = ("state", "turn", "where", "moved", "stolen", "fresh")
# (instance degrees, buckets): one instance, two alike, and two or three degrees with length buckets
LAYOUTS = [([1], "1:inf"), ([1, 1], "1:inf"), ([1, 2, 2], "1:2000,2:inf"), ([1, 2, 4], "1:1500,2:6000,4:inf")]


class _Reference(RolloutRun):
    """The Python pass: a subclass that defines a step of it outside the simulator runs the reference."""

    def _refill(self, slice_end):
        return super()._refill(slice_end)


def test_the_extension_is_built():
    assert native.load() is not None, "libra.sim._slice_native is not built: pip install -e . builds it"


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, float).view(np.int64)


def _same(a: RolloutRun, b: RolloutRun, where: str) -> None:
    for name in FLOATS:
        np.testing.assert_array_equal(_bits(getattr(a, name)), _bits(getattr(b, name)), err_msg=f"{name} {where}")
    for name in OTHERS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{name} {where}")
    for name in ("decoded", "busy_gpu_s", "capacity_tokens"):
        assert float(getattr(a, name)).hex() == float(getattr(b, name)).hex(), f"{name} {where}"
    for name in ("rebalanced", "rebalanced_tokens", "migrations", "migrated_tokens"):  # moves by steal and by route
        assert type(getattr(a, name)) is int and getattr(a, name) == getattr(b, name), f"{name} {where}"
    (fa, ta), (fb, tb) = a._freed, b._freed
    oa, ob = np.lexsort((ta, fa)), np.lexsort((tb, fb))  # the freed slots are a multiset: order does not matter
    np.testing.assert_array_equal(fa[oa], fb[ob], err_msg=f"freed slots {where}")
    np.testing.assert_array_equal(_bits(ta[oa]), _bits(tb[ob]), err_msg=f"freed slots {where}")
    assert (a._last is None) == (b._last is None), where
    if a._last is not None:
        np.testing.assert_array_equal(a._last[0], b._last[0], err_msg=f"still running {where}")
        np.testing.assert_array_equal(_bits(a._last[1]), _bits(b._last[1]), err_msg=f"step times {where}")


def _instances(tps, buckets, lent) -> Instances:
    inst = Instances(tps, buckets, [0.0] * len(tps))
    inst.active[list(lent)] = False  # lent to training by the elastic pool: no capacity, no requests
    return inst


def _lockstep(work, routes, tps, buckets, cm=CM, lent=(), **options) -> int:
    """Both rollouts slice by slice from the same start, compared after every slice; returns the slices."""
    runs = [cls(cm, work, routes, _instances(tps, buckets, lent), start=0.0, **options) for cls in
            (RolloutRun, _Reference)]  # fmt: skip
    fast, ref = runs
    calls = 0
    t, slices = 0.0, 0
    while not ref.done:
        dt = ref.next_event(t) - t
        handed = fast._next  # the next event the C decoding found at the end of the last slice
        assert fast.next_event(t) - t == dt
        if slices:
            assert handed is not None and handed[0] == t, f"no next event handed on after slice {slices - 1}"
            assert handed[2] == native.next_event(fast, t)  # the same time as a scan of its own
            np.testing.assert_array_equal(handed[3], np.flatnonzero(fast.state == TOOL))  # all the returns read
            live = np.flatnonzero(fast.state != DONE)  # `load()` as its own scan counts it
            counted = np.bincount(fast.where[live[fast.where[live] >= 0]], minlength=len(fast.inst))
            assert handed[4] is not None
            np.testing.assert_array_equal(handed[4], counted)
            np.testing.assert_array_equal(fast.load(), ref.load())
        fast.advance(t, dt)
        ref.advance(t, dt)
        _same(fast, ref, f"after slice {slices} at t={t}")
        calls += fast._kernel is not None
        t += dt
        slices += 1
    assert fast.done
    assert fast._kernel is not None and ref._kernel is None  # the C pass ran one, the Python pass the other
    assert calls == slices
    return slices


@pytest.mark.parametrize(
    ("workload", "prompts", "samples", "tps", "buckets", "routing", "options"),
    [
        # new requests queue for KV on two TP-1 instances: the queued-instance path of the refill
        ("r2e-gym", 32, 16, [1, 1], "1:inf", "single", {}),
        # three degrees, length buckets, routed moves, stuck turns moved to idle instances
        ("search-r1", 16, 16, [1, 1, 2, 2, 4], "1:3000,2:8000,4:inf", "overflow", {"steal": "all"}),
        ("swe-agent", 8, 8, [2, 2, 4], "2:12000,4:inf", "overflow", {"steal": "new", "dispatch": "interleaved"}),
        ("dapo-math", 16, 8, [1, 2], "1:inf", "single", {"steal": "off", "min_slice_s": 2.0}),
        # a KV pool of a few thousand tokens: an idle instance takes a turn back whose context is larger
        ("r2e-gym", 8, 8, [1, 1, 1], "1:inf", "single", {"kv_memory": 0.45}),
        # small buckets crowded, larger ones idle: stolen requests whose routed moves their instance covers
        ("r2e-gym", 24, 16, [1, 1, 4, 4], "1:6000,4:inf", "overflow", {"steal": "all", "min_slice_s": 1.0}),
        # the same with long generations: moves at chunk boundaries, which a stolen request's instance covers
        ("dapo-math", 24, 16, [1, 1, 4, 4], "1:4000,4:inf", "overflow", {"steal": "all"}),
        # an instance lent to training: inactive, it adds no capacity
        ("search-r1", 16, 8, [2, 2, 2], "2:inf", "single", {"lent": [1]}),
    ],
)
def test_a_rollout_is_the_same_slice_by_slice(workload, prompts, samples, tps, buckets, routing, options):
    work = WorkSource.from_generator(
        workload, seed=0, num_prompts=prompts, samples_per_prompt=samples, max_model_len=40960
    ).step(0)
    bks = parse_buckets(buckets)
    routes = routes_for(routing, work, bks, None)
    inst_buckets = [min(i * len(bks) // len(tps), len(bks) - 1) for i in range(len(tps))]
    assert _lockstep(work, routes, tps, inst_buckets, **options) > 20


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    workload=st.sampled_from(["search-r1", "r2e-gym", "swe-agent", "dapo-math"]),
    prompts=st.integers(2, 12),
    samples=st.integers(1, 12),
    layout=st.sampled_from(LAYOUTS),
    steal=st.sampled_from(["all", "new", "off"]),
    dispatch=st.sampled_from(["blocks", "interleaved"]),
    min_slice=st.sampled_from([0.05, 0.5, 3.0]),
    drift=st.integers(0, 99),
)  # fmt: skip
def test_random_rollouts_are_the_same_slice_by_slice(
    seed, workload, prompts, samples, layout, steal, dispatch, min_slice, drift
):
    work = WorkSource.from_generator(
        workload, seed=seed, num_prompts=prompts, samples_per_prompt=samples, max_model_len=40960
    ).step(drift)
    tps, buckets = layout
    bks = parse_buckets(buckets)
    routes = routes_for("overflow", work, bks, None)
    inst_buckets = [min(i, len(bks) - 1) for i in range(len(tps))]
    _lockstep(work, routes, tps, inst_buckets, steal=steal, dispatch=dispatch, min_slice_s=min_slice)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e12, 1e12, allow_nan=False), max_size=600))
def test_the_pairwise_sum_is_numpys(values):
    a = np.array(values, float)
    assert native.load().pairwise_sum(a).hex() == float(a.sum()).hex()


def test_the_pairwise_sum_is_numpys_on_long_arrays():
    rng = np.random.default_rng(0)
    for n in (127, 128, 129, 1000, 8191, 8192, 8193, 65_536, 100_003):
        a = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)
        assert native.load().pairwise_sum(a).hex() == float(a.sum()).hex(), n


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(["Qwen3-4B", "Qwen3-14B", "Qwen3-30B-A3B", "Llama-3-70B"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    tokens=st.floats(0, 1e6, allow_nan=False),
    batch=st.floats(1.0, 2048.0),
    context=st.floats(0, 2e6, allow_nan=False),
    mfu=st.floats(0.05, 0.9),
    share=st.sampled_from([1.0, 0.0, 0.37]),
)
def test_the_kernel_prefill_and_decode_step_are_the_cost_models(model, tp, tokens, batch, context, mfu, share):
    coeffs = CostCoefficients(prefill_mfu=mfu, decode_mfu=mfu, prefill_weight_share=share)
    rc = CostModel(CLUSTER, get_model(model), coeffs).rollout
    work0, attn, *row = rc.prefill_terms(tp)
    ext = native.load()
    want = float(rc.prefill_time(tp, np.array([tokens]), np.array([context]))[0])
    assert ext.prefill(tuple(row), work0, attn, tokens, context).hex() == want.hex()
    want = float(rc.decode_step_time(tp, np.array([batch]), np.array([context]))[0])
    assert ext.decode_step(rc.decode_terms(tp), work0, attn, batch, context).hex() == want.hex()


def test_a_moe_rollout_is_the_same_slice_by_slice():
    """The decode step of a mixture of experts reads only the experts its tokens touch (`decode_terms`)."""
    moe = CostModel(CLUSTER, get_model("Qwen3-30B-A3B"))
    work = WorkSource.from_generator("search-r1", seed=3, num_prompts=8, samples_per_prompt=8, max_model_len=40960)
    routes = routes_for("overflow", work.step(0), parse_buckets("1:3000,2:inf"), None)
    assert _lockstep(work.step(0), routes, [1, 2], [0, 1], cm=moe) > 20


def test_a_cost_model_with_another_prefill_formula_runs_the_python_pass():
    class Doubled(type(CM.rollout)):
        def prefill_time(self, tp, tokens, context=0.0):
            return 2.0 * super().prefill_time(tp, tokens, context)

    rc = Doubled(CM.rollout.gpu, CM.model, CM.coeffs)
    assert native.degree_table(rc, (1, 2)) is None
    assert native.degree_table(CM.rollout, (1, 2)) is not None


def test_bad_arrays_are_refused_with_an_error():
    work = WorkSource.from_generator("search-r1", seed=0, num_prompts=4, samples_per_prompt=4, max_model_len=40960)
    run = RolloutRun(CM, work.step(0), routes_for("single", work.step(0), parse_buckets("1:inf"), None),
                     Instances([1], [0], [0.0]), start=0.0)  # fmt: skip
    ext = native.load()
    with pytest.raises(ValueError, match="needs 42 arrays"):
        ext.decode_slice((), 1, 1, 1, 0.0, 1.0, 0.0, 4.0, 1.0, 1.0, 512.0, 1.0, 2.0, 0.01, 0.5, 60.0)
    with pytest.raises(TypeError, match="format"):
        ext.decode_slice((np.zeros(1),) * 42, 1, 1, 1, 0.0, 1.0, 0.0, 4.0, 1.0, 1.0, 512.0, 1.0, 2.0, 0.01, 0.5, 60.0)
    with pytest.raises(ValueError, match="needs 23 arrays"):
        ext.admit_slice((), 1, 1, 0.0, 4.0, 0.3, 512, 2, 1.0, 1.0)
    with pytest.raises(ValueError, match="needs 14 arrays"):
        ext.steal((), 1, 1, 0.0, 4.0, True, 1.0, 1.0)
    with pytest.raises(ValueError, match="needs 10 arrays"):
        ext.returns((), 1, 1, 1, 1.0)
    with pytest.raises(ValueError, match="needs 14 arrays"):
        ext.moves((), 1, 1, 1, 1.0, False, 1.0, 1.0, 1.0, 1.0)
    assert run._kernel_table() is not None
    run._order[3][0] = run.state.size + 1  # a kept order longer than the requests
    with pytest.raises(ValueError, match="admit_slice: the kept order's length"):
        run._admit(0.0)
    with pytest.raises(ValueError, match="decode_slice: the kept order's length"):
        run._decode(0.0, 1.0)


def test_a_handed_on_next_event_is_dropped_when_the_rollout_changes(monkeypatch):
    """The next event the C decoding hands on is used only at its slice end, with the instances it saw and no change
    through the rollout's methods since; a row it cannot judge leaves it to `next_event`, which says what is wrong."""
    scans = []
    scan = native.next_event
    monkeypatch.setattr(native, "next_event", lambda run, t: scans.append(t) or scan(run, t))
    work = WorkSource.from_generator("search-r1", seed=1, num_prompts=4, samples_per_prompt=4, max_model_len=40960)
    step = work.step(0)
    routes = routes_for("single", step, parse_buckets("1:inf"), None)
    run = RolloutRun(CM, step, routes, Instances([1, 1], [0, 0], [0.0, 0.0]), start=0.0, min_slice_s=0.5)
    run.advance(0.0, 0.5)
    assert run._next is not None and run._next[0] == 0.5
    assert run.next_event(0.5) == run._next[2] == scan(run, 0.5) and scans == []  # handed on, not scanned again
    assert run.next_event(0.75) == scan(run, 0.75) and scans == [0.75]  # another time: scanned
    run.inst.add(1, 0, 30.0, 1)  # an instance added (the elastic pool borrows), the debts not grown yet
    run.debt = np.append(run.debt, 0.0)
    assert run._next is not None and run.next_event(0.5) == scan(run, 0.5) and scans == [0.75, 0.5]
    np.testing.assert_array_equal(run.load(), [*run._next[4], 0])  # counted again, over the three instances
    run.advance(0.5, 0.5)
    assert run._next is not None
    run.rebalance(0)  # the queue spread over the new instance
    assert run._next is None
    run.advance(1.0, 0.5)  # the new instance starts at 30 s: the handed time reads its queue's instances
    assert run._next is not None and run._next[2] == scan(run, 1.5)
    run.lend(np.array([2]))
    assert run._next is None
    later = RolloutRun(CM, step, routes, Instances([1, 1], [0, 0], [10.0, 10.0]), start=0.0)
    later.advance(0.0, 0.5)  # every instance starts at 10 s: the next event is then, read from the queue's instances
    assert later._next is not None and later.next_event(0.5) == later._next[2] == scan(later, 0.5) == 10.0
    bad = RolloutRun(CM, step, routes, Instances([1], [0], [0.0]), start=0.0, steal="off")
    bad.where[-1] = -1  # a waiting request with no instance
    bad.advance(0.0, 0.5)
    assert bad._next is None
    with pytest.raises(ValueError, match="a waiting request's instance is out of range"):
        bad.next_event(0.5)


def _drawn_layout(seed: int, workload: str):
    """A small step of `workload`, two to six instances of drawn degrees on up to three buckets, one-bucket routes,
    and the generator that drew them (for the state drawn next)."""
    rng = np.random.default_rng(seed)
    work = WorkSource.from_generator(workload, seed=seed, num_prompts=6, samples_per_prompt=8, max_model_len=40960)
    work = work.step(0)
    tps = [int(x) for x in rng.choice([1, 2, 4], size=int(rng.integers(2, 7)))]
    buckets = sorted(int(x) for x in rng.integers(0, 3, len(tps)))
    return rng, work, tps, buckets, routes_for("single", work, parse_buckets("1:inf"), None)


def _steal_state(seed: int, steal: str):
    """Two copies of a rollout whose admission state is drawn at random on a coarse grid, so that ties (turns ready
    at the same time), contexts that fill a thief's free KV exactly, waits equal to the re-prefill, instances still
    starting and queues on larger buckets than a thief's are common; and the arguments of a steal."""
    rng, work, tps, buckets, routes = _drawn_layout(seed, "search-r1")
    runs = []
    for cls in (RolloutRun, _Reference):
        inst = Instances(tps, buckets, [0.0] * len(tps))
        runs.append(cls(CM, work, routes, inst, start=0.0, steal=steal))
    n, k_all, t = work.num_requests, len(tps), 0.0  # (t - ready is then exactly the wait drawn below)
    busy = np.flatnonzero(rng.random(k_all) < 0.5)  # the others have nothing queued: thieves where open
    where = rng.choice(busy if busy.size else np.arange(1), n)
    fresh = rng.random(n) < 0.5
    ctx = rng.integers(1, 5, n).astype(float) * 500.0
    ready = t - rng.integers(0, 4, n).astype(float)
    exact = rng.random(n) < 0.2  # waited exactly as long as re-prefilling on a degree would take
    deg = rng.choice([1, 2, 4], n)
    for i in np.flatnonzero(exact):
        ready[i] = t - float(CM.rollout.prefill_time(int(deg[i]), np.array([ctx[i]]), np.array([ctx[i] / 2.0]))[0])
    ready_at = np.where(rng.random(k_all) < 0.25, t + 5.0, 0.0)  # some instances still starting
    for run in runs:
        run.where[:], run.fresh[:], run.ctx[:], run.ready[:] = where, fresh, ctx, ready
        run.inst.ready_at[:] = ready_at
    waiting = np.sort(rng.choice(n, int(rng.integers(1, n)), replace=False)).astype(np.int64)
    open_k = rng.random(k_all) < 0.7
    room = rng.integers(0, 8, k_all).astype(float) * 500.0 + CM.coeffs.kv_headroom_seqs * 1000.0
    room[rng.random(k_all) < 0.05] = np.nan  # (numpy's searchsorted puts NaN last: every candidate fits)
    seats = rng.integers(1, 6, k_all).astype(np.int64)
    return runs, (t, waiting, open_k, room, seats)


@pytest.mark.parametrize("steal", ["all", "new"])
def test_the_steal_moves_what_the_reference_moves(steal):
    moved = 0
    for seed in range(300):
        (fast, ref), (t, waiting, open_k, room, seats) = _steal_state(seed, steal)
        table = fast._kernel_table()
        assert table is not None and ref._kernel_table() is None
        a = native.steal(fast, t, waiting, open_k, room, seats, table)
        b = ref._steal(t, waiting, open_k, room.copy(), seats.copy())
        assert a == b, seed
        for name in ("where", "stolen", "pending"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=f"{name}, seed {seed}")
        assert (fast.rebalanced, fast.rebalanced_tokens) == (ref.rebalanced, ref.rebalanced_tokens), seed
        moved += int((fast.where != _steal_state(seed, steal)[0][0].where).sum())
    assert moved > 200, moved  # the states do move requests


def _admission_state(seed: int, steal: str):
    """Two copies of a rollout at a slice boundary drawn at random on a coarse grid (requests waiting, running,
    in a tool call or done; instances busy, idle, still starting or lent; freed slots in no particular order), so
    that exact fits and ties are common."""
    rng, work, tps, buckets, routes = _drawn_layout(seed, "r2e-gym")
    n, k_all, t = work.num_requests, len(tps), 0.0
    state = rng.choice(4, n, p=[0.5, 0.25, 0.15, 0.1]).astype(np.int8)
    where = rng.integers(0, k_all, n)
    ctx = rng.integers(1, 9, n).astype(float) * 1000.0
    fresh = (state == 0) & (rng.random(n) < 0.6)
    ready = t - rng.integers(0, 4, n).astype(float)
    pending = np.where(fresh, ctx, rng.integers(0, 3, n) * 100.0)
    nf = int(rng.integers(0, 12))
    fk, ft = rng.integers(0, k_all, nf), t - rng.integers(0, 3, nf).astype(float) * 0.5
    ready_at = np.where(rng.random(k_all) < 0.2, t + 5.0, 0.0)
    lent = rng.random(k_all) < 0.15
    runs = []
    for cls in (RolloutRun, _Reference):
        run = cls(CM, work, routes, Instances(tps, buckets, list(ready_at)), start=0.0, steal=steal)
        run.inst.active[lent] = False  # (after the start, which places every request on an active instance)
        run.state[:], run.where[:], run.ctx[:], run.fresh[:] = state, where, ctx, fresh
        run.ready[:], run.pending[:] = ready, pending
        run.debt[:] = rng.integers(0, 3, k_all) * 0.25 if not runs else runs[0].debt
        run._by_state.clear()
        run._live = run._in_state(3, equal=False)
        run._by_state.pop(None, None)
        run._freed = (fk.copy(), ft.copy())
        runs.append(run)
    return runs, t


@pytest.mark.parametrize("steal", ["all", "new", "off"])
def test_a_boundarys_admission_is_the_references(steal):
    admitted = 0
    for seed in range(200):
        (fast, ref), t = _admission_state(seed, steal)
        table = fast._kernel_table()
        assert table is not None and ref._kernel_table() is None
        before = fast.state.copy()
        native.admit_slice(fast, t, table)
        ref._admit(t)
        where = f"seed {seed}"
        for name in ("state", "where", "fresh", "stolen"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=f"{name}, {where}")
        for name in ("pending", "lag", "debt"):
            np.testing.assert_array_equal(_bits(getattr(fast, name)), _bits(getattr(ref, name)), err_msg=name)
        np.testing.assert_array_equal(fast._refilled, ref._refilled, err_msg=f"refilled, {where}")
        assert fast._freed[0].size == ref._freed[0].size == 0
        assert (fast.rebalanced, fast.rebalanced_tokens) == (ref.rebalanced, ref.rebalanced_tokens), where
        for s in range(4):  # the cached per-state sets were dropped where they changed
            np.testing.assert_array_equal(fast._in_state(s), ref._in_state(s), err_msg=f"state {s}, {where}")
        admitted += int(((before == 0) & (fast.state == 1)).sum())
    assert admitted > 500, admitted


@pytest.mark.parametrize("seed0", [0, 1000])
def test_the_tool_returns_and_their_moves_are_the_references(seed0):
    """`returns` and `moves` against `_returns`: who comes back, who moves where (water-filled in blocks or dealt
    out in turn, falling back past lent instances' buckets), by KV transfer or prefilled again."""
    moved = back = 0
    for seed in range(seed0, seed0 + 100):
        rng = np.random.default_rng(seed)
        work = WorkSource.from_generator(
            "search-r1", seed=seed, num_prompts=6, samples_per_prompt=8, max_model_len=40960
        )
        work = work.step(int(rng.integers(0, 90)))
        # (the last: three instances in the largest bucket, so that moves water-fill several, and a smaller
        # bucket whose instance is lent falls back onto them)
        tps, buckets = (*LAYOUTS[1:], ([1, 2, 4, 4, 4], "1:1500,2:6000,4:inf"))[int(rng.integers(0, len(LAYOUTS)))]
        bks = parse_buckets(buckets)
        routes = routes_for("overflow", work, bks, None)
        inst_buckets = [min(i, len(bks) - 1) for i in range(len(tps))]
        n, t, dt = work.num_requests, 4.0, 1.0
        state = rng.choice(4, n, p=[0.2, 0.2, 0.5, 0.1]).astype(np.int8)
        ready = t + rng.integers(-2, 4, n) * 0.5  # on a grid: some return exactly at the slice end
        turn = (rng.random(n) * work.num_segments).astype(np.int64)
        flags = rng.random((2, n)) < 0.3
        where = rng.integers(0, len(tps), n)
        # some instances lent (a bucket without an active one falls back to another), blocks or dealt in turn
        lent = [k for k in range(len(tps)) if rng.random() < 0.3][: len(tps) - 1]
        dispatch = ("blocks", "interleaved")[seed % 2]
        runs = []
        for cls in (RolloutRun, _Reference):
            run = cls(CM, work, routes, _instances(tps, inst_buckets, lent), start=0.0, dispatch=dispatch)
            run.state[:], run.ready[:], run.turn[:] = state, ready, turn
            run.moved[:], run.stolen[:] = flags
            run.where[:] = where  # (some on a larger bucket's instance, as `_assign` falls back to when it must)
            run.ctx[:] = work.prompt_tokens + 100.0
            run._by_state.clear()
            run._live = run._in_state(3, equal=False)
            run._by_state.pop(None, None)
            for s in range(4):  # every per-state set cached: a change must drop the sets it changes
                run._in_state(s)
            runs.append(run)
        fast, ref = runs
        fast._returns(t, dt)
        ref._returns(t, dt)
        _same(fast, ref, f"seed {seed}")
        for s in range(4):
            np.testing.assert_array_equal(fast._in_state(s), ref._in_state(s), err_msg=f"state {s}, seed {seed}")
        moved += fast.migrations
        back += int(((state == 2) & (fast.state == 0)).sum())
    assert moved > 50 and back > 1000, (moved, back)
