"""The simulator's C-MLFQ replay in C (`libra.scheduling._tree_native.replay`, ext/scheduling/replay_native.c)
against the router's own code (`CausalRouting._replay`'s Python loop): the same buckets and carried tokens for every
segment, on trees that learn step after step, for every option of the published rule the C path takes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.scheduling import PrefixTree
from libra.scheduling.node import native as node_native
from libra.sim import routing
from libra.sim.routing import CausalRouting
from libra.sim.workload import WorkSource
from libra.spec import parse_buckets


@pytest.fixture(autouse=True)
def _built() -> None:
    if node_native() is None:
        pytest.fail("libra.scheduling._tree_native is not built (or LIBRA_PURE_PYTHON is set): `pip install -e .`")


BUCKETS = ["1:8000,2:16000,4:32000,8:inf", "1:2000,2:inf", "1:500,2:1000,4:3000,8:inf", "1:inf"]


def _both(cr: CausalRouting, work, buckets, admit: str, monkeypatch) -> tuple[routing.Routes, routing.Routes]:
    """The step replayed twice on the same tree, in C (checked) and in Python."""
    return _apart(cr, cr, work, buckets, monkeypatch, admit)


def _check(workload: str, seed: int, options: dict, admit: str, steps: int, monkeypatch) -> int:
    source = WorkSource.from_generator(workload, seed=seed, num_prompts=12, samples_per_prompt=6, max_model_len=40960)
    cr = CausalRouting(**options)
    moved = 0
    for k in range(steps):
        work = source.step(k * 7)
        for spec in BUCKETS:
            fast, ref = _both(cr, work, parse_buckets(spec), admit, monkeypatch)
            np.testing.assert_array_equal(fast.bucket, ref.bucket, err_msg=f"step {k}, {spec}")
            np.testing.assert_array_equal(fast.carried, ref.carried, err_msg=f"step {k}, {spec}")
            moved += ref.migrations
        cr.learn(work)
    return moved


@pytest.mark.parametrize(
    ("options", "admit"),
    [
        ({}, "smallest"),
        ({}, "predicted"),
        ({"fallback": "agnostic"}, "smallest"),
        ({"overflow": False}, "predicted"),
        ({"min_count": 1, "cost_ratio": 0.0}, "smallest"),
        ({"cost_ratio": 2.0, "window": 8}, "predicted"),
    ],
)
@pytest.mark.parametrize("workload", ["r2e-gym", "search-r1"])
def test_the_c_replay_routes_every_segment_as_the_router_does(workload, options, admit, monkeypatch):
    assert _check(workload, 0, options, admit, 6, monkeypatch) > 50  # requests do move: the rule is exercised


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    workload=st.sampled_from(["r2e-gym", "search-r1", "swe-agent", "dapo-math"]),
    fallback=st.sampled_from(["parent", "agnostic"]),
    min_count=st.integers(1, 4),
    cost_ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    overflow=st.booleans(),
    admit=st.sampled_from(["smallest", "predicted"]),
)
def test_random_replays_are_the_routers(seed, workload, fallback, min_count, cost_ratio, overflow, admit, monkeypatch):
    options = {"fallback": fallback, "min_count": min_count, "cost_ratio": cost_ratio, "overflow": overflow}
    _check(workload, seed, options, admit, 4, monkeypatch)


def _twins(source: WorkSource, steps: int, options: dict, **tree_options) -> tuple[CausalRouting, CausalRouting]:
    """Two routings whose trees learnt the same steps: one replays in C, the other in Python."""
    pair = []
    for _ in range(2):
        cr = CausalRouting(**options)
        cr.tree = PrefixTree(**tree_options)
        for k in range(steps):
            cr.learn(source.step(k))
        pair.append(cr)
    return pair[0], pair[1]


def _apart(fast: CausalRouting, ref: CausalRouting, work, buckets, monkeypatch, admit: str = "smallest") -> tuple:
    """`fast` replays the step in C (checked: one bucket replays nothing), `ref` in Python."""
    real = routing._replay_native
    calls = []
    monkeypatch.setattr(routing, "_replay_native", lambda *args: calls.append(real(*args)) or calls[-1])
    got = fast._replay(work, buckets, admit)
    monkeypatch.setattr(routing, "_replay_native", lambda *args: False)
    want = ref._replay(work, buckets, admit)
    monkeypatch.setattr(routing, "_replay_native", real)
    assert calls == ([] if len(buckets) == 1 else [True])
    return got, want


def _same_trees(a: PrefixTree, b: PrefixTree) -> int:
    """Node by node: the same children, windows and prefix sums (made or not); returns the prefix sums made."""
    assert a.codec._codes == b.codec._codes  # the same states interned, in the same order
    assert a.prompts.keys() == b.prompts.keys()
    stack = [(a.agnostic, b.agnostic), *((a.prompts[p], b.prompts[p]) for p in a.prompts)]
    made = 0
    while stack:
        x, y = stack.pop()
        assert x.ordered == y.ordered and x.children.keys() == y.children.keys()
        assert x.prefix == y.prefix
        made += x.prefix is not None and len(x.ordered) == 1
        stack.extend((x.children[c], y.children[c]) for c in x.children)
    return made


def test_the_c_replay_leaves_the_tree_as_the_router_does(monkeypatch):
    """The prefix sums the conditional means made and the states the codec interned: the same on both trees. With
    `min_count=1` the nodes of one observation answer too, and theirs are made on first need (an update leaves
    them unmade)."""
    source = WorkSource.from_generator("r2e-gym", seed=1, num_prompts=12, samples_per_prompt=6, max_model_len=40960)
    fast, ref = _twins(source, 3, {"min_count": 1})
    work, buckets = source.step(3), parse_buckets(BUCKETS[0])
    got, want = _apart(fast, ref, work, buckets, monkeypatch)
    np.testing.assert_array_equal(got.bucket, want.bucket)
    assert _same_trees(fast.tree, ref.tree) > 0


def test_a_tool_return_on_a_size_edge_is_classified_as_the_codec_does(monkeypatch):
    """Size-class edges at the commonest token counts of a math agent's short tool returns, so that returns fall
    exactly on an edge (bisect_right: an edge's own count is in the class above it): the same states interned."""
    source = WorkSource.from_generator("dapo-math", seed=3, num_prompts=24, samples_per_prompt=8, max_model_len=40960)
    first = source.step(0)
    values, counts = np.unique(first.tool_tokens[first.tool_end], return_counts=True)
    edges = tuple(sorted(int(v) for v in values[np.argsort(-counts, kind="stable")[:2]]))
    fast, ref = _twins(source, 0, {}, size_edges=edges)
    on_edge = 0
    for k in range(5):
        work, buckets = source.step(k), parse_buckets("1:300,2:600,4:1200,8:inf")
        on_edge += int(np.isin(work.tool_tokens[work.tool_end], edges).sum())
        got, want = _apart(fast, ref, work, buckets, monkeypatch)
        np.testing.assert_array_equal(got.bucket, want.bucket)
        np.testing.assert_array_equal(got.carried, want.carried)
        _same_trees(fast.tree, ref.tree)
        fast.learn(work)
        ref.learn(work)
    assert on_edge > 10


def test_what_only_the_router_may_judge_goes_back_to_it(monkeypatch):
    """A status outside the ones the C loop knows: NotImplemented, the outputs zeroed, and the Python loop decides."""
    source = WorkSource.from_generator("search-r1", seed=2, num_prompts=8, samples_per_prompt=4, max_model_len=40960)
    cr = CausalRouting()
    cr.learn(source.step(0))
    work, buckets = source.step(1), parse_buckets(BUCKETS[0])
    want = cr._replay(work, buckets, "smallest")
    monkeypatch.setattr(routing, "TOOL_STATUSES", ())
    seen = []
    real = routing._replay_native
    monkeypatch.setattr(routing, "_replay_native", lambda *args: seen.append(real(*args)) or seen[-1])
    got = cr._replay(work, buckets, "smallest")
    assert seen == [False]
    np.testing.assert_array_equal(got.bucket, want.bucket)
    np.testing.assert_array_equal(got.carried, want.carried)
