"""The router contract for every policy: books kept, decisions name real buckets, deterministic, no future."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sched_strategies import steps_of_trajectories

from libra.scheduling import POLICIES, CMLFQRouter, RouteDecision, make_router, router_names
from libra.spec import SpecError, parse_buckets
from libra.workloads.trace import Trajectory, Turn

BUCKETS = parse_buckets("2:5000,4:15000,8:inf")


def drive(router, steps, before_step=None) -> list[RouteDecision]:
    """Run every step's trajectories through `router` with interleaved requests; return every decision.
    `before_step(router, k)` runs at the start of step k."""
    decisions = []
    rid = 0
    for k, step in enumerate(steps):
        if before_step is not None:
            before_step(router, k)
        live = []
        for t in step:
            rid += 1
            decisions.append(
                router.admit(rid, prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens, final_tokens=t.total_tokens)
            )
            live.append((rid, t, t.prompt_tokens, 0))
        while live:  # round-robin over requests in flight: one turn each
            nxt = []
            for rid_, t, ctx, k in live:
                turn = t.turns[k]
                ctx += turn.gen_tokens
                decisions.append(router.on_progress(rid_, context_tokens=ctx))
                if turn.tool is not None:
                    ctx += turn.tool_tokens
                    decisions.append(
                        router.on_tool_return(
                            rid_,
                            tool=turn.tool,
                            tool_tokens=turn.tool_tokens,
                            status=turn.tool_status,
                            context_tokens=ctx,
                        )
                    )
                if k + 1 < len(t.turns):
                    nxt.append((rid_, t, ctx, k + 1))
                else:
                    router.finish(rid_, t)
            live = nxt
        router.end_step()
    return decisions


def test_registry() -> None:
    assert set(POLICIES) <= set(router_names())
    with pytest.raises(SpecError, match="unknown routing policy 'sjf'.*cmlfq"):
        make_router("sjf", BUCKETS)
    with pytest.raises(SpecError, match=r"^policy 'fcfs': unknown option\(s\) no_such_option; its options: bucket$"):
        make_router("fcfs", BUCKETS, no_such_option=1)
    # the default router's options are its constructor's and the preset `create` reads
    with pytest.raises(SpecError, match=r"unknown option\(s\) foo; its options: admit, .*preset, price, .*window$"):
        make_router("cmlfq", BUCKETS, foo=1, preset="priced")
    with pytest.raises(SpecError, match="its options: none"):
        make_router("oracle", BUCKETS, window=3)
    assert make_router("cmlfq", BUCKETS, preset="priced", window=50).tree.window == 50


@pytest.mark.parametrize("name", POLICIES)
def test_bad_buckets(name) -> None:
    with pytest.raises(SpecError):
        make_router(name, ())
    with pytest.raises(SpecError):
        parse_buckets("")
    with pytest.raises(SpecError, match="increase"):
        parse_buckets("2:15000,4:5000,8:inf")


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=25, deadline=None)
@given(steps=steps_of_trajectories(max_steps=4, max_per_step=10))
def test_every_request_is_routed_once_to_an_existing_bucket(name, steps) -> None:
    router = make_router(name, BUCKETS)
    decisions = drive(router, steps)
    n = sum(len(s) for s in steps)
    admits = [d for d in decisions if d.reason == "admit"]
    assert sorted(d.request_id for d in admits) == list(range(1, n + 1))
    assert router.num_active == 0
    for d in decisions:
        assert 0 <= d.bucket < len(BUCKETS)
        assert d.migrate == (d.from_bucket is not None and d.from_bucket != d.bucket)
        assert d.migrated_tokens >= 0
        assert d.migrate or d.migrated_tokens == 0


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=15, deadline=None)
@given(steps=steps_of_trajectories(max_steps=4, max_per_step=10))
def test_routing_is_deterministic(name, steps) -> None:
    assert drive(make_router(name, BUCKETS), steps) == drive(make_router(name, BUCKETS), steps)


@pytest.mark.parametrize("name", POLICIES)
def test_contract_errors(name) -> None:
    router = make_router(name, BUCKETS)
    t = Trajectory(prompt_id="p", prompt_tokens=10, turns=(Turn(gen_tokens=5),))
    router.admit("r1", prompt_id="p", prompt_tokens=10, final_tokens=15)
    with pytest.raises(SpecError, match="already admitted"):
        router.admit("r1", prompt_id="p", prompt_tokens=10, final_tokens=15)
    with pytest.raises(SpecError, match="not in flight"):
        router.on_progress("r2", context_tokens=20)
    with pytest.raises(SpecError):
        router.on_progress("r1", context_tokens=-1)
    with pytest.raises(SpecError):
        router.on_tool_return("r1", tool="search", tool_tokens=10, status="exploded", context_tokens=30)
    router.finish("r1", t)
    with pytest.raises(SpecError, match="not in flight"):
        router.finish("r1", t)


def test_oracle_needs_the_final_length() -> None:
    router = make_router("oracle", BUCKETS)
    assert router.admit(1, prompt_id="p", prompt_tokens=10, final_tokens=20_000).bucket == 2
    with pytest.raises(SpecError, match="final_tokens"):
        router.admit(2, prompt_id="p", prompt_tokens=10)


def test_mlfq_promotes_one_level_at_a_time_on_generated_tokens() -> None:
    router = make_router("mlfq", BUCKETS)
    router.admit(1, prompt_id="p", prompt_tokens=100)
    d = router.on_tool_return(1, tool="search", tool_tokens=9000, status="ok", context_tokens=9200)
    assert not d.migrate  # tool tokens are not service
    d = router.on_progress(1, context_tokens=9200 + 4950)  # generated 5050 > 5000
    assert d.migrate and d.bucket == 1 and d.migrated_tokens == 14150
    d = router.on_progress(1, context_tokens=9200 + 40_000)
    assert d.migrate and (d.from_bucket, d.bucket) == (1, 2)
    context = make_router("mlfq", BUCKETS, service="context")
    context.admit(1, prompt_id="p", prompt_tokens=100)
    assert context.on_tool_return(1, tool="search", tool_tokens=9000, status="ok", context_tokens=9200).migrate


def test_fcfs_ignores_lengths() -> None:
    router = make_router("fcfs", BUCKETS)
    got = [router.admit(i, prompt_id="p", prompt_tokens=10 * i).bucket for i in range(6)]
    assert got == [0, 1, 2, 0, 1, 2]
    fixed = make_router("fcfs", BUCKETS, bucket=1)
    assert fixed.admit(1, prompt_id="p", prompt_tokens=10).bucket == 1
    with pytest.raises(SpecError):
        make_router("fcfs", BUCKETS, bucket=3)


def _long(pid: str, size: int = 8000) -> Trajectory:
    """One search that returns `size` tokens, then a long answer: 20,000+ tokens in all."""
    return Trajectory(
        prompt_id=pid,
        prompt_tokens=300,
        turns=(Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=size), Turn(gen_tokens=12_000)),
    )


@pytest.mark.parametrize("name", ["cmlfq", "predictor"])
def test_no_learning_before_the_step_ends(name) -> None:
    """Trajectories finished within a step change nothing until end_step: routing never reads the future."""
    router = make_router(name, BUCKETS)
    for rid in range(1, 9):
        router.admit(rid, prompt_id="p", prompt_tokens=300, final_tokens=16_500)
        router.on_tool_return(rid, tool="search", tool_tokens=4000, status="ok", context_tokens=4500)
        router.finish(rid, _long("p", size=4000))

    def probe(rid: int) -> list[RouteDecision]:
        first = router.admit(rid, prompt_id="p", prompt_tokens=300, final_tokens=16_500)
        second = router.on_tool_return(rid, tool="search", tool_tokens=4000, status="ok", context_tokens=4500)
        return [first, second]

    before = probe(100)
    assert before[0].bucket == 0 and not before[1].migrate
    router.end_step()
    after = probe(101)
    assert after[0].bucket == 2 or after[1].bucket == 2  # learnt: this prompt and return run long


def test_cmlfq_learns_from_tool_returns_at_step_end() -> None:
    router = make_router("cmlfq", BUCKETS, preset="published")
    drive(router, [[_long("p") for _ in range(8)]])
    d = router.admit(100, prompt_id="p", prompt_tokens=300)
    assert d.bucket == 0  # the published rule: start small
    d = router.on_tool_return(100, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
    assert d.migrate and d.bucket == 2 and d.reason == "tool-return"
    assert d.migrated_tokens == 500  # the context already in KV cache, not the fresh tool return
    # an unseen prompt falls back to the prompt-agnostic tree
    router.admit(101, prompt_id="never-seen", prompt_tokens=300)
    d = router.on_tool_return(101, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
    assert d.migrate and d.bucket == 2
    # a small return leads to a node never seen: fall back to the parent, the prompt's root (all ran long)
    router.admit(102, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(102, tool="search", tool_tokens=100, status="ok", context_tokens=600)
    assert d.migrate and d.bucket == 2
    # an unseen prompt on a path unseen in the agnostic tree: its nearest ancestor there (the root) answers
    router.admit(103, prompt_id="never-seen", prompt_tokens=300)
    d = router.on_tool_return(103, tool="search", tool_tokens=100, status="ok", context_tokens=600)
    assert d.bucket == 2


def test_cmlfq_admits_into_a_larger_bucket_when_asked() -> None:
    router = make_router("cmlfq", BUCKETS, preset="published", admit="predicted")
    drive(router, [[_long("p") for _ in range(8)]])
    assert router.admit(1, prompt_id="p", prompt_tokens=300).bucket == 2
    assert router.admit(2, prompt_id="other", prompt_tokens=300).bucket == 2  # the agnostic root agrees too
    smallest = make_router("cmlfq", BUCKETS, preset="published")
    drive(smallest, [[_long("p") for _ in range(8)]])
    assert smallest.admit(1, prompt_id="p", prompt_tokens=300).bucket == 0


def test_cmlfq_weighs_migration_cost() -> None:
    """Same node statistics, but a context so large that moving it costs more than the predicted gain."""
    cheap = make_router("cmlfq", BUCKETS, preset="published", cost_ratio=0.5)
    drive(cheap, [[_long("p", size=8000)] * 8])
    cheap.admit(1, prompt_id="p", prompt_tokens=300)
    assert cheap.on_tool_return(1, tool="search", tool_tokens=8000, status="ok", context_tokens=8500).migrate
    costly = make_router("cmlfq", BUCKETS, preset="published", cost_ratio=100.0)
    drive(costly, [[_long("p", size=8000)] * 8])
    costly.admit(1, prompt_id="p", prompt_tokens=300)
    assert not costly.on_tool_return(1, tool="search", tool_tokens=8000, status="ok", context_tokens=8500).migrate


@pytest.mark.parametrize(
    "kw",
    [
        {"admit": "largest"},
        {"fallback": "none"},
        {"rule": "vote"},
        {"min_count": 0},
        {"cost_ratio": -1.0},
        {"confidence": 1.5},
        {"price": -0.1},
        {"admit_margin": 1.5},
    ],
)
def test_cmlfq_bad_options(kw) -> None:
    with pytest.raises(SpecError):
        CMLFQRouter(BUCKETS, **kw)


def test_cmlfq_unknown_tool_with_a_closed_tool_set() -> None:
    router = make_router("cmlfq", BUCKETS, preset="published", tools=("search",))
    router.admit(1, prompt_id="p", prompt_tokens=10)
    with pytest.raises(SpecError, match="unknown tool 'bash'"):
        router.on_tool_return(1, tool="bash", tool_tokens=10, status="ok", context_tokens=30)


def test_tree_can_be_shared_and_merged() -> None:
    a, b = make_router("cmlfq", BUCKETS, preset="published"), make_router("cmlfq", BUCKETS, preset="published")
    drive(a, [[_long("p")] * 3])
    drive(b, [[_long("q")] * 3])
    a.tree.merge(b.tree)
    merged = make_router("cmlfq", BUCKETS, preset="published", tree=a.tree)
    assert set(merged.tree.prompts) == {"p", "q"}


def _short(pid: str, size: int = 8000) -> Trajectory:
    """The same tool return as `_long`, then a short answer: `size` + 1,000 tokens in all."""
    return Trajectory(
        prompt_id=pid,
        prompt_tokens=300,
        turns=(Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=size), Turn(gen_tokens=500)),
    )


@pytest.mark.parametrize("num_long, moves", [(8, True), (6, False)])
def test_probability_rule_acts_only_when_sure(num_long, moves) -> None:
    """8 of 10 past runs after this return ended in bucket 2: 80% >= 0.7, move; 6 of 10: 60%, the rule waits
    (the rest ended in bucket 0, and the context, 4,500 tokens, still fits bucket 0)."""
    router = make_router("cmlfq", BUCKETS, preset="published", rule="probability", confidence=0.7)
    drive(router, [[_long("p", size=4000)] * num_long + [_short("p", size=4000)] * (10 - num_long)])
    router.admit(1, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(1, tool="search", tool_tokens=4000, status="ok", context_tokens=4500)
    assert d.migrate == moves
    if moves:
        assert d.bucket == 2


def test_presets_build() -> None:
    from libra.scheduling import CMLFQ_PRESETS

    assert set(CMLFQ_PRESETS) == {"published", "accuracy", "budget", "priced", "adaptive"}
    for options in CMLFQ_PRESETS.values():
        router = make_router("cmlfq", BUCKETS, **options)
        drive(router, [[_long("p")] * 3, [_long("p")] * 3])


PRICED = {"rule": "priced", "price": 0.7, "confidence": 0.9, "size_edges": (1000, 4000)}


@pytest.mark.parametrize("size, moves", [(4000, True), (300, False)])
def test_priced_rule_waits_after_small_returns(size, moves) -> None:
    """8 of 10 past runs after this return ended in a larger bucket: 80%, below the confidence of 90%. After a
    4,000-token return waiting is dear (any later move carries it): the demanded certainty drops by
    price x 4,000 / mean length (about 0.2) and the router moves. After a 300-token return it waits. Either way the
    gain (0.8 - 0.2) pays for the 500 carried tokens."""
    router = make_router("cmlfq", BUCKETS, preset="published", **PRICED)
    drive(router, [[_long("p", size=size)] * 8 + [_short("p", size=size)] * 2])
    router.admit(1, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(1, tool="search", tool_tokens=size, status="ok", context_tokens=500 + size)
    assert d.migrate == moves
    if moves:
        assert d.bucket == 2 and d.migrated_tokens == 500


def test_priced_rule_prices_the_carried_context() -> None:
    """The same sure prediction (all past runs went long) moves a request for a price of 0.7 but not for a price so
    high that the 500 carried tokens outweigh the gain."""
    for price, moves in [(0.7, True), (100.0, False)]:
        router = make_router("cmlfq", BUCKETS, preset="published", **{**PRICED, "price": price})
        drive(router, [[_long("p")] * 8])
        router.admit(1, prompt_id="p", prompt_tokens=300)
        assert (
            router.on_tool_return(1, tool="search", tool_tokens=8000, status="ok", context_tokens=8500).migrate == moves
        )


def test_priced_rule_moves_once_and_promotes_from_a_cold_tree() -> None:
    router = make_router("cmlfq", BUCKETS, preset="published", **PRICED)
    router.admit(1, prompt_id="p", prompt_tokens=300)
    d = router.on_progress(1, context_tokens=6000)  # nothing learnt yet: promote to the bucket of the context
    assert d.migrate and d.bucket == 1 and d.reason == "overflow"
    assert not router.on_progress(1, context_tokens=20_000).migrate  # a second move cannot make it right
    router.finish(1, _long("p"))
    drive(router, [[_long("p")] * 8])
    router.admit(100, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(100, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
    assert d.migrate and d.bucket == 2


def test_priced_admission_needs_a_margin() -> None:
    """Admission is free of migration cost, but a larger bucket must be at least `admit_margin` likelier than the
    smallest: 6 of 10 past runs long (0.6 vs 0.4) clears a margin of 0.15, not one of 0.3."""
    for margin, bucket in [(0.15, 2), (0.3, 0)]:
        router = make_router("cmlfq", BUCKETS, preset="published", **PRICED, admit="predicted", admit_margin=margin)
        drive(router, [[_long("p", size=4000)] * 6 + [_short("p", size=4000)] * 4])
        assert router.admit(1, prompt_id="p", prompt_tokens=300).bucket == bucket


@settings(max_examples=25, deadline=None)
@given(steps=steps_of_trajectories(max_steps=4, max_per_step=10))
def test_priced_preset_routes_every_request_once_and_moves_it_at_most_once(steps) -> None:
    from libra.scheduling import CMLFQ_PRESETS

    router = make_router("cmlfq", BUCKETS, **CMLFQ_PRESETS["priced"])
    decisions = drive(router, steps)
    assert router.num_active == 0
    assert sorted(d.request_id for d in decisions if d.reason == "admit") == list(range(1, sum(map(len, steps)) + 1))
    assert all(0 <= d.bucket < len(BUCKETS) for d in decisions)
    moved = [d.request_id for d in decisions if d.migrate]
    assert len(moved) == len(set(moved))
    assert decisions == drive(make_router("cmlfq", BUCKETS, **CMLFQ_PRESETS["priced"]), steps)


@settings(max_examples=300, deadline=None)
@given(
    limits=st.lists(st.integers(1, 50_000), min_size=1, max_size=6, unique=True),
    unbounded=st.booleans(),
    length=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-10, 60_000).map(float),
        st.sampled_from([0.0, 1.0, 50_000.0, float("nan"), float("inf")]),
    ),
)
def test_bucket_for_is_the_first_limit_that_holds_the_length(limits, unbounded, length):
    """`bucket_for` bisects the limits: the same bucket as the first limit >= length, the last one for a length
    past them all and for NaN, at every limit exactly."""
    spec = ",".join(f"1:{x}" for x in sorted(limits)) + (",1:inf" if unbounded else "")
    router = CMLFQRouter(parse_buckets(spec))
    first = next((i for i, limit in enumerate(router.limits) if length <= limit), len(router.limits) - 1)
    assert router.bucket_for(length) == first
    for i, limit in enumerate(router.limits):
        assert router.bucket_for(limit) == i


def test_a_refused_finish_changes_nothing_and_names_what_is_wrong() -> None:
    """A finish the router refuses (a request not in flight, not a Trajectory) leaves every book as it was: the
    default router's token total, which bounds its migrations, did grow before."""
    import numpy as np

    t = Trajectory(prompt_id="p", prompt_tokens=100, turns=(Turn(gen_tokens=50),))
    router = make_router("cmlfq", BUCKETS)
    router.admit("a", prompt_id="p", prompt_tokens=100)
    with pytest.raises(SpecError, match=r"needs its Trajectory, got dict"):
        router.finish("a", {"prompt_id": "p"})
    assert router._finished_total == 0 and router.num_active == 1
    router.finish("a", t)
    for _ in range(3):
        with pytest.raises(SpecError, match="not in flight"):
            router.finish("a", t)
    assert router._finished_total == t.total_tokens
    router.admit("b", prompt_id="p", prompt_tokens=100)
    with pytest.raises(SpecError, match=r"tool_tokens must be a Python int \(convert with int\(\.\.\.\)\), got"):
        router.on_tool_return("b", tool="bash", tool_tokens=np.int64(5), status="ok", context_tokens=205)


def _abort_two(router, k: int) -> None:
    """Two requests of step `k` that a small tool return reaches and that then fail (ids far above `drive`'s)."""
    for j in range(2):
        rid = 10_000 + 2 * k + j
        router.admit(rid, prompt_id=f"failing-{j}", prompt_tokens=700, final_tokens=30_000)
        d = router.on_tool_return(rid, tool="bash", tool_tokens=50, status="error", context_tokens=900)
        assume(not d.migrate)  # a move stays counted (the price of moves): not what this compares
        router.abort(rid)


@pytest.mark.parametrize("name", [p for p in POLICIES if p != "fcfs"])  # fcfs: its turn counter counts admissions
@settings(max_examples=10, deadline=None)
@given(steps=steps_of_trajectories(max_steps=3, max_per_step=8))
def test_an_aborted_request_leaves_no_trace_in_what_the_router_learns(name, steps) -> None:
    """A failed trajectory leaves the books and teaches nothing: the decisions for everything else are the same as
    if it had never been admitted (verl's agent loop used to finish it with an empty trajectory: a zero-token
    request the tree, the price and the experts learnt from)."""
    plain, aborting = make_router(name, BUCKETS), make_router(name, BUCKETS)
    assert drive(aborting, steps, before_step=_abort_two) == drive(plain, steps)
    assert aborting.num_active == 0 and aborting.context_in_flight == plain.context_in_flight == 0
    probe = [_long("p0"), _long("failing-0", size=9000), _long("failing-1", size=60)]
    assert drive(aborting, [probe]) == drive(plain, [probe])
    with pytest.raises(SpecError):
        aborting.abort(10_000)  # once only, as finish
