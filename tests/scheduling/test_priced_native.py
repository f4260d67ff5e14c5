"""The priced rule's `on_tool_return` in C (ext/scheduling/priced_native.c, `_tree_native._priced_native`) against
`_priced_call`, its Python reference (priced.py): the same decision at every tool return and the same writes after
it (the books, the walk, the decision points, the shrinkage fit's records, the ceiling's books), over learnt and
cold routers of every priced preset, requests held in flight across step ends, small random windows, and bad
arguments (the same exception). A router built without the extension uses `_priced_call`; here it must be built
(`pip install -e .` builds it, as CI installs), so a missing build fails rather than skips."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import EAGER, SMALL_WINDOW_CASES

from libra.scheduling import CMLFQ_PRESETS, make_router, replay
from libra.scheduling.node import native
from libra.spec import SpecError, parse_buckets
from libra.workloads import Trajectory, Turn
from libra.workloads.generators import WorkloadGenerator
from tests.limits import scaled


def _ext():
    ext = native()
    if ext is None:  # pragma: no cover - the failure this test exists for
        pytest.fail("libra.scheduling._tree_native is not built: run `pip install -e .` with a C compiler")
    return ext


CASES = [
    ("search-r1", "2:5000,4:15000,8:inf", "adaptive", {}),
    ("r2e-gym", "1:4000,2:12000,4:30000,8:inf", "adaptive", {}),
    ("search-r1", "1:1500,2:3000,4:6000,8:12000,16:inf", "adaptive", {"shrink": 3.0}),
    ("r2e-gym", "1:2500,2:5000,4:9000,8:16000,16:inf", "adaptive", {**EAGER, "shrink": 30.0}),
    ("r2e-gym", "1:4000,2:12000,4:30000,8:40000", "adaptive", {"beyond": "promote"}),  # every limit finite
    ("search-r1", "2:5000,4:15000,8:inf", "priced", {}),  # fixed size edges (a plain StateCodec)
    ("r2e-gym", "1:4000,2:12000,4:30000,8:inf", "priced", {"fallback": "parent", "min_count": 1}),
]


def _state(router, r) -> tuple:
    """What a tool return writes, for request `r` and the router (the nodes by their statistics: the two routers'
    trees are separate objects)."""
    req = router._requests.get(r)
    fit = router._fit
    books = (router._context_in_flight, router._carried_total, router._cold_carried, fit and fit.taken)
    if req is None:
        return books
    w = req.state

    def node(n) -> tuple | None:
        return None if n is None else (n.count, n.total, len(n.children))

    return (
        books,
        (req.bucket, req.context, req.tool_tokens, req.migrations),
        (w.p_exact, node(w.p_node), w.p_ctx, w.a_exact, node(w.a_node), w.a_ctx),
        None if w.points is None else list(w.points),
        list(w.calib),
        None if req.stay is None else _fields(req.stay),
    )


def _fields(d) -> tuple:
    return (d.request_id, d.bucket, d.migrate, d.from_bucket, d.migrated_tokens, d.reason)


class _Declines:
    """Counts the calls the C path hands to `_priced_call`."""

    def __init__(self, router) -> None:
        self.count = 0
        reference = router._priced_call

        def counted(*args, **kwargs):
            self.count += 1
            return reference(*args, **kwargs)

        router._priced_call = counted


def _pair(buckets, preset: str, options: dict):
    limits = parse_buckets(buckets) if isinstance(buckets, str) else buckets
    made = [make_router("cmlfq", limits, **{**CMLFQ_PRESETS[preset], **options}) for _ in range(2)]
    c, py = made
    assert getattr(c.on_tool_return, "__func__", None) is _ext()._priced_native
    py.on_tool_return = py._priced_call
    return c, py


def _lockstep(c, py, steps, hold_every: int = 3) -> int:
    """Route `steps` through both routers side by side, every third request finishing only after the step end, a
    request that outgrew its bucket while generating reported by `on_progress` (which leaves a mark in the decision
    points that the next tool return takes off); the decision and the state compared after every tool return.
    Returns the number of tool returns."""
    rid = itertools.count()
    returns = 0

    def route(r, traj, ks) -> None:
        nonlocal returns
        for k in ks:
            turn = traj.turns[k]
            if turn.tool is None:
                continue
            generated = traj.context_after(k + 1) - turn.tool_tokens  # the context before the return
            if generated > c.limits[c.bucket_of(r)]:  # outgrew its bucket while generating (as a rollout reports)
                got, want = c.on_progress(r, context_tokens=generated), py.on_progress(r, context_tokens=generated)
                assert _fields(got) == _fields(want), (r, k)
            args = dict(
                tool=turn.tool,
                tool_tokens=turn.tool_tokens,
                status=turn.tool_status,
                context_tokens=traj.context_after(k + 1),
            )
            got, want = c.on_tool_return(r, **args), py.on_tool_return(r, **args)
            assert _fields(got) == _fields(want), (r, k)
            assert _state(c, r) == _state(py, r), (r, k)
            returns += 1

    held: list = []
    for step in steps:
        for i, traj in enumerate(step):
            r = next(rid)
            for router in (c, py):
                router.admit(r, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
            half = len(traj.turns) // 2
            route(r, traj, range(half))
            if i % hold_every == 0:
                held.append((r, traj, range(half, len(traj.turns))))
            else:
                route(r, traj, range(half, len(traj.turns)))
                for router in (c, py):
                    router.finish(r, traj)
        for router in (c, py):
            router.end_step()
        assert (c.price, c.shrink, c._mix_q) == (py.price, py.shrink, py._mix_q)
        for r, traj, rest in held:  # routed on the tree that learnt the step they started in
            route(r, traj, rest)
            for router in (c, py):
                router.finish(r, traj)
        held = []
    return returns


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{len(c[1])}")
def test_c_path_routes_and_writes_as_priced_call(case) -> None:
    workload, buckets, preset, options = case
    c, py = _pair(buckets, preset, options)
    declines = _Declines(c)
    gen = WorkloadGenerator(workload, seed=3, num_prompts=24)
    returns = _lockstep(c, py, [gen.step(s) for s in range(4)])
    assert returns > 2000
    # the C path decided most returns; it handed on the cold step's (no node yet, a state seen the first time) and
    # those of requests held across a step end (the root's window changed since their limits were placed in it)
    assert 0 < declines.count < returns / 2


def test_c_path_takes_nearly_every_return_of_a_learnt_router() -> None:
    c, py = _pair("1:4000,2:12000,4:30000,8:inf", "adaptive", {})
    gen = WorkloadGenerator("r2e-gym", seed=5, num_prompts=32)
    _lockstep(c, py, [gen.step(s) for s in range(3)])
    declines = _Declines(c)
    returns = _lockstep(c, py, [gen.step(3)], hold_every=10**9)
    assert returns > 1000
    assert declines.count <= returns / 100


def _tool_run(pid: str, returns: list[tuple[str, int]]) -> Trajectory:
    turns = [Turn(gen_tokens=30, tool=tool, tool_status="ok", tool_tokens=n) for tool, n in returns]
    return Trajectory(prompt_id=pid, prompt_tokens=200, turns=(*turns, Turn(gen_tokens=30)))


def test_c_path_keys_a_tool_as_python_does_once_it_is_no_longer_named() -> None:
    """A tool keyed by its name on one step and not on a later one (its share of the trajectories fell under a
    tenth): the C path keys its returns OTHER_TOOL with the pooled edges, as `QuantileStateCodec.encode` does, not by
    the name whose codes and nodes the earlier steps left (it read the codec's per-tool edges and codes alone, and
    walked to the old `fetch` nodes)."""
    c, py = _pair("1:1500,2:3000,4:6000,8:inf", "adaptive", {})
    first = [_tool_run(f"a{i}", [("search", 900 + 40 * i), ("search", 300), ("fetch", 50 + i)]) for i in range(30)]
    later = [
        [
            _tool_run(f"s{s}-{i}", [("search", 700 + 13 * i), *([(f"api-{s}-{i}", 80)] if i % 4 == 0 else [])])
            for i in range(100)
        ]
        for s in range(4)
    ]
    _lockstep(c, py, [first], hold_every=10**9)
    assert c.tree.codec.tool_key("fetch") == "fetch"
    _lockstep(c, py, later, hold_every=10**9)
    assert c.tree.codec.tool_key("fetch") == py.tree.codec.tool_key("fetch") != "fetch"
    declines = _Declines(c)
    last = [_tool_run(f"f{i}", [("search", 800 + 9 * i), ("fetch", 52 + i), ("search", 400)]) for i in range(20)]
    returns = _lockstep(c, py, [last], hold_every=10**9)
    assert declines.count <= returns // 4  # the C path decided the returns it is checked on


@settings(max_examples=80, deadline=None)
@given(**SMALL_WINDOW_CASES, beyond=st.sampled_from(["root", "promote"]))
def test_c_path_on_small_windows(steps, limits, shrink, min_count, per_step, eager, beyond) -> None:
    """A few observations a node, any limits: shares far from 0 and 1, records taken for part of a step."""
    options = {**(EAGER if eager else {}), "shrink": shrink, "min_count": min_count, "beyond": beyond}
    c, py = _pair(limits, "adaptive", options)
    for router in (c, py):
        if router._fit is not None:
            router._fit.per_step = per_step
    _lockstep(c, py, steps)


def _run(pid: str, first_return: int, final: int) -> Trajectory:
    """Prompt of 100 tokens, a first return of `first_return` tokens of tool "t" after 100 generated, `final` tokens
    in all."""
    return Trajectory(
        prompt_id=pid,
        prompt_tokens=100,
        turns=(
            Turn(gen_tokens=100, tool="t", tool_status="ok", tool_tokens=first_return),
            Turn(gen_tokens=final - 200 - first_return),
        ),
    )


def test_a_tie_between_the_likeliest_buckets_moves_as_priced_call_moves() -> None:
    """Half of p's runs end in bucket 0, half in bucket 1, all after the same first return; admitted to bucket 1 (its
    first runs there), a request at that return sees two equal shares: with no price the gain of moving to the first
    likeliest bucket, 0, pays for the move (`>=`), and the rule moves it down. No majority exit (0.5 is not more than
    half)."""
    learnt = [_run("p", 50, 1200)] * 40 + [_run("p", 50, 3000)] * 40
    options = {**EAGER, "size_edges": (500,), "admit_select": False, "shrink": 0.0, "admit_margin": 0.0}
    decisions = []
    for way in ("c", "py"):
        router = make_router("cmlfq", parse_buckets("1:1500,2:4000,4:inf"), **{**CMLFQ_PRESETS["adaptive"], **options})
        if way == "py":
            router.on_tool_return = router._priced_call
        router.tree.update(learnt)
        router.admit(0, prompt_id="p", prompt_tokens=100)
        router._requests[0].bucket = router._requests[0].state.admitted = 1
        decisions.append(_fields(router.on_tool_return(0, tool="t", tool_tokens=50, status="ok", context_tokens=250)))
    assert decisions[0] == decisions[1] == (0, 0, True, 1, 200, "tool-return")


def test_a_request_that_outlived_its_node_reads_the_root_above_its_bucket_floor() -> None:
    """p's 40 runs end at 1,000 tokens; the population also holds 50 runs ending at 1,400 and 40 at 3,000. A request of
    p held in bucket 1 (1,500-4,000) whose first return (tool "u", which p's runs never called) comes at 1,200 tokens
    has outlived every run of p: the shares come from the population beyond 1,200. Bucket 1's share there is 40 of
    90, not a majority (the 50 runs ending at 1,400 lie below bucket 1's floor, 1,500), so the full rule runs and,
    with no price, moves the request down to the likelier bucket 0. Counting the runs below the floor into bucket 1
    would make it a majority and keep the request."""
    learnt = [_run("p", 50, 1000)] * 40 + [_turns("q", "u", 1400)] * 50 + [_turns("q", "u", 3000)] * 40
    options = {**EAGER, "size_edges": (500,), "admit_select": False, "shrink": 0.0, "fallback": "parent"}
    decisions = []
    for way in ("c", "py"):
        router = make_router("cmlfq", parse_buckets("1:1500,2:4000,4:inf"), **{**CMLFQ_PRESETS["adaptive"], **options})
        if way == "py":
            router.on_tool_return = router._priced_call
        declines = _Declines(router)
        router.tree.update(learnt)
        router.admit(0, prompt_id="p", prompt_tokens=100)
        router._requests[0].bucket = router._requests[0].state.admitted = 1
        decisions.append(_fields(router.on_tool_return(0, tool="u", tool_tokens=50, status="ok", context_tokens=1200)))
        assert declines.count == 0
    assert decisions[0] == decisions[1] == (0, 0, True, 1, 1150, "tool-return")


def _turns(pid: str, tool: str, final: int) -> Trajectory:
    """Prompt of 100 tokens, 100 generated, a return of 50 tokens of `tool`, then the rest of `final` tokens."""
    return Trajectory(
        prompt_id=pid,
        prompt_tokens=100,
        turns=(Turn(gen_tokens=100, tool=tool, tool_status="ok", tool_tokens=50), Turn(gen_tokens=final - 250)),
    )


class _Str(str):
    pass


class _Int(int):
    pass


@pytest.mark.parametrize(
    "call",
    [
        dict(request_id=7, tool="search", tool_tokens=10, status="ok", context_tokens=500),  # not in flight
        dict(request_id=0, tool="search", tool_tokens=10, status="fine", context_tokens=500),
        dict(request_id=0, tool="", tool_tokens=10, status="ok", context_tokens=500),
        dict(request_id=0, tool="search", tool_tokens=-1, status="ok", context_tokens=500),
        dict(request_id=0, tool="search", tool_tokens=10, status="ok", context_tokens=2.5),
        dict(request_id=0, tool="search", tool_tokens=True, status="ok", context_tokens=500),
        dict(request_id=0, tool="search", tool_tokens=10, status="ok"),  # a keyword missing
        dict(request_id=0, tool="search", tool_tokens=10, status="ok", context_tokens=500, extra=1),
        dict(request_id=0, tool=_Str("search"), tool_tokens=_Int(10), status=_Str("ok"), context_tokens=_Int(500)),
        dict(request_id=0, tool="search", tool_tokens=2**60, status="ok", context_tokens=2**61),
        dict(request_id=[0], tool="search", tool_tokens=10, status="ok", context_tokens=500),  # unhashable
    ],
)
def test_bad_and_unusual_arguments_are_judged_as_priced_call_judges_them(call) -> None:
    """Arguments the C path does not take plain (an error, a subclass, a count past 2**53, an id that is not a
    plain int or str) go to `_priced_call`: the same exception with the same message, or the same decision, and
    the same state after it."""
    c, py = _pair("2:5000,4:15000,8:inf", "adaptive", {})
    learnt = WorkloadGenerator("search-r1", seed=0, num_prompts=4).step(0)
    for router in (c, py):
        replay(router, learnt)
        router.admit(0, prompt_id="p", prompt_tokens=100)
    outcomes = []
    for router in (c, py):
        request_id = call["request_id"]
        kwargs = {k: v for k, v in call.items() if k != "request_id"}
        try:
            outcomes.append(("ok", _fields(router.on_tool_return(request_id, **kwargs))))
        except (SpecError, TypeError) as exc:
            outcomes.append((type(exc), str(exc)))
        outcomes.append(_state(router, 0))
    assert outcomes[:2] == outcomes[2:]


def test_a_pickled_router_keeps_the_c_path() -> None:
    c, _ = _pair("2:5000,4:15000,8:inf", "adaptive", {})
    twin = pickle.loads(pickle.dumps(c))
    assert twin.on_tool_return.__func__ is _ext()._priced_native
    assert twin.on_tool_return.__self__ is twin


def test_without_the_extension_a_priced_router_routes_by_priced_call() -> None:
    """`LIBRA_PURE_PYTHON=1` (or no C compiler at install): the same router on the Python reference, and a router
    pickled with the C path and loaded there falls back to it too."""
    c, _ = _pair("2:5000,4:15000,8:inf", "adaptive", {})
    code = (
        "import pickle, sys; from libra.scheduling import make_router; from libra.spec import parse_buckets; "
        "r = make_router('cmlfq', parse_buckets('2:5000,8:inf')); twin = pickle.loads(sys.stdin.buffer.read()); "
        "print(r.on_tool_return.__func__.__name__, twin.on_tool_return.__func__.__name__)"
    )
    env = {**os.environ, "LIBRA_PURE_PYTHON": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(c), capture_output=True, env=env, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["_priced_call", "_priced_call"]
