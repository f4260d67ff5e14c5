"""The router's and the tree's fast paths (issue 16) against the plain computations they replace: a step-end refresh
by bisection against a sort, a node built with its first observation against an empty node refreshed, a new prompt
tree's nodes counted from sorted paths against its set of prefixes, prefix sums made on first need against eager
ones, and unscaled bucket probabilities by integer keys against the float formula."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right

from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling import CMLFQ_PRESETS, make_router
from libra.scheduling.node import Node, refresh_all
from libra.scheduling.tree import _distinct_prefixes
from libra.spec import parse_buckets

values = st.lists(st.integers(0, 60_000), max_size=250)


def _state(node: Node) -> tuple:
    return (list(node.window), node.total, node.count, node.mean, node.p50, node.p90, list(node.ordered))


def _plain(window: list[int], limit: int, total: int) -> Node:
    """The same observations refreshed by a sort (the reference)."""
    node = Node()
    node.window.extend(window)
    node.total = total
    node.refresh(limit)
    return node


def _eager_beyond(node: Node, elapsed: float):
    """`Node.beyond` with prefix sums made eagerly, as before they were made on first need."""
    ordered = node.ordered
    n = len(ordered)
    i = bisect_right(ordered, math.floor(elapsed))
    k = n - i
    if k <= 0:
        return None
    prefix = list(itertools.accumulate(ordered, initial=0))
    return (
        k,
        (prefix[n] - prefix[i]) / k,
        float(ordered[i + math.ceil(0.5 * k) - 1]),
        float(ordered[i + math.ceil(0.9 * k) - 1]),
    )


@settings(max_examples=300, deadline=None)
@given(old=values, updates=st.lists(values, max_size=4), limit=st.integers(1, 210))
def test_refresh_all_equals_a_sort_after_every_update(old, updates, limit) -> None:
    node = Node()
    node.window.extend(old)
    node.total = len(old)
    node.refresh(limit)
    seen = list(old)
    for added in updates:
        if not added:
            continue
        node.window.extend(added)  # (as an update appends: `refresh_all` counts them into `total`)
        seen += added
        refresh_all([node], limit)
        assert _state(node) == _state(_plain(seen[-limit:], limit, len(seen)))
        for elapsed in (-1, 0, 5_000, 30_000.5, 70_000):
            assert node.beyond(elapsed) == _eager_beyond(node, elapsed)


@given(first=st.integers(0, 60_000), step=st.integers(0, 50), more=values, limit=st.integers(1, 210))
def test_a_node_built_with_its_first_observation_is_refreshed(first, step, more, limit) -> None:
    node = Node(first, step)
    assert node.last_step == step
    assert _state(node) == _state(_plain([first], limit, 1))
    refresh_all([node], limit)  # nothing more observed: unchanged
    assert _state(node) == _state(_plain([first], limit, 1))
    if more:
        node.window.extend(more)
        refresh_all([node], limit)
        assert _state(node) == _state(_plain([first, *more][-limit:], limit, 1 + len(more)))


@given(paths=st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=12))
def test_distinct_prefixes_count_the_nodes_of_a_trie(paths) -> None:
    """How a late update counts a new prompt tree's nodes, against the set of the paths' prefixes."""
    assert _distinct_prefixes(paths) == len({tuple(p[:depth]) for p in paths for depth in range(len(p) + 1)})


def _float_probs(router, node: Node, anchor: int, scale: float, ctx: int) -> list[float] | None:
    """Bucket probabilities by the float formula (`floor((x - anchor) / scale)` keys) for every scale."""
    ordered = node.ordered
    n = len(ordered)
    below = bisect_right(ordered, math.floor((ctx - anchor) / scale - 1)) / n
    alive = 1.0 - below
    if alive <= 0:
        return None
    probs = []
    for limit in router._finite_limits:
        upto = bisect_right(ordered, math.floor((limit - anchor) / scale)) / n
        probs.append((upto - below) / alive if upto > below else 0.0)
        if upto > below:
            below = upto
    if len(probs) < len(router.limits):
        probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
    return probs


@settings(max_examples=300, deadline=None)
@given(
    window=st.lists(st.integers(0, 40_000), min_size=1, max_size=200),
    anchor=st.integers(0, 30_000),
    grown=st.integers(0, 40_000),
    buckets=st.sampled_from(["2:5000,4:15000,8:inf", "1:4000,2:12000,4:30000,8:inf", "1:3000,8:12000"]),
)
def test_unscaled_bucket_probabilities_equal_the_float_formula(window, anchor, grown, buckets) -> None:
    router = make_router("cmlfq", parse_buckets(buckets), **CMLFQ_PRESETS["adaptive"])
    node = _plain(window, 200, len(window))
    ctx = anchor + grown
    assert router._bucket_probs(node, anchor, 1.0, ctx) == _float_probs(router, node, anchor, 1.0, ctx)


def test_deferred_fit_records_equal_eager_ones_across_a_step_end() -> None:
    """`_priced` leaves the population shares of a `shrink="auto"` record for when the request finishes (issue 14):
    they must be the agnostic root's shares at the time of the record (`_root_probs` then), also for a request still
    in flight when the tree learns (end_step resolves it before the update)."""
    from libra.workloads.generators import WorkloadGenerator

    gen = WorkloadGenerator("search-r1", seed=0, num_prompts=24)
    first, second, third = (gen.step(s) for s in range(3))
    router = make_router("cmlfq", parse_buckets("2:5000,4:15000,8:inf"), **CMLFQ_PRESETS["adaptive"])
    got: list = []
    fit_finish = router._fit.finish
    router._fit.finish = lambda records, truth: (got.extend(records), fit_finish(records, truth))
    expected: dict = {}
    order: list = []  # finish order, the order of the fit's records
    deferred_across = 0
    rid = itertools.count()
    for step_trajs, hold in ((first, 0), (second, len(second) // 2), (third, 0)):
        held = []
        for i, traj in enumerate(step_trajs):
            r = next(rid)
            router.admit(r, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
            walk = router._requests[r].state
            mine = []
            for k, turn in enumerate(traj.turns):
                if turn.tool is None:
                    continue
                before = len(walk.calib)
                ctx = traj.context_after(k + 1)
                router.on_tool_return(
                    r, tool=turn.tool, tool_tokens=turn.tool_tokens, status=turn.tool_status, context_tokens=ctx
                )
                if len(walk.calib) > before:  # a record: its shares at this moment, the eager way
                    own, prior, n = walk.calib[-1]
                    if type(prior) is int:
                        prior = router._root_probs(router.tree.agnostic, walk.root_ctx, ctx)
                    mine.append((own, prior, n))
            expected[r] = mine
            if i < hold:
                held.append((r, traj))
                deferred_across += any(type(p) is int for _, p, _ in walk.calib)
            else:
                router.finish(r, traj)
                order.append(r)
        router.end_step()  # the tree learns with `held` still in flight
        for r, traj in held:
            router.finish(r, traj)
            order.append(r)
    assert deferred_across > 0  # the case the test is about happened
    assert got == [record for r in order for record in expected[r]]


def _priced_log(workload: str, inline: bool, shrink, per_step: int | None) -> tuple[list, list]:
    """Every decision and every shrinkage record of an adaptive router over 3 seeded steps (24 prompts x 16)."""
    from libra.workloads.generators import WorkloadGenerator

    buckets = {"search-r1": "2:5000,4:15000,8:inf", "r2e-gym": "1:4000,2:12000,4:30000,8:inf"}[workload]
    router = make_router("cmlfq", parse_buckets(buckets), **{**CMLFQ_PRESETS["adaptive"], "shrink": shrink})
    router._inline = inline
    records: list = []
    if router._fit is not None:
        router._fit.per_step = per_step
        router._fit.choose = lambda current: 3.0  # a blend from the first warm step on, whatever the fit finds
        fit_finish = router._fit.finish
        router._fit.finish = lambda recs, truth: (records.extend(recs), fit_finish(recs, truth))
    # the budget's decision points carry the shares as floats (`hi = (top - probs[a]) * mean / carried`): a change
    # in the shares that flips no decision still shows there
    budget_finish = router._budget.finish
    router._budget.finish = lambda points, total: (records.append(list(points or ())), budget_finish(points, total))
    log = []
    gen = WorkloadGenerator(workload, seed=1, num_prompts=24)
    rid = itertools.count()
    for s in range(3):
        for traj in gen.step(s):
            r = next(rid)
            d = router.admit(r, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
            log.append((d.bucket, d.reason))
            for k, turn in enumerate(traj.turns):
                if turn.tool is not None:
                    d = router.on_tool_return(
                        r,
                        tool=turn.tool,
                        tool_tokens=turn.tool_tokens,
                        status=turn.tool_status,
                        context_tokens=traj.context_after(k + 1),
                    )
                    log.append((d.bucket, d.migrated_tokens, d.reason))
            router.finish(r, traj)
        router.end_step()
        log.append(router.price)
    return log, records


def test_inline_priced_path_equals_the_general_one() -> None:
    """`_priced` computes the bucket shares inline (node choice, shares, the shrinkage blend with and without a
    record, the beyond-root fallback): the same decisions and records as with `_probabilities` (issue 14), with a
    fixed blend, and with a fitted one recording only part of the returns."""
    for workload in ("search-r1", "r2e-gym"):
        for shrink, per_step in ((3.0, None), ("auto", 300)):
            inline = _priced_log(workload, True, shrink, per_step)
            assert len(inline[0]) > 1000
            assert inline == _priced_log(workload, False, shrink, per_step)
