"""The adaptive C-MLFQ (the default): size classes learnt from the data, the price set from the observed costs of
moving, and its results on the committed corpus of real agent trajectories and on synthetic search-r1."""

from __future__ import annotations

import itertools

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling import CMLFQ_PRESETS, DEFAULT_PRESET, PrefixTree, make_router, replay
from libra.scheduling.budget import PRICE_GRID, MigrationBudget
from libra.scheduling.experts import EXPERTS, AdmitExperts, PromptLengthBins
from libra.scheduling.shrinkage import SHRINK_GRID, ShrinkFit
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.sources import BASELINES, MAX_MIGRATED, meets_target, quantile_buckets, score_source
from libra.spec import SpecError, parse_buckets
from libra.workloads import Trajectory, Turn, generate
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus

HELD_OUT = DEFAULT_CORPUS / "held-out"

SEARCH_BUCKETS = parse_buckets("2:5000,4:15000,8:inf")
CMLFQ_COLD = ("stay", "budget", "promote")


def _traj(pid: str, sizes: list[tuple[str, int]], gen: int = 50) -> Trajectory:
    turns = [Turn(gen_tokens=gen, tool=t, tool_status="ok", tool_tokens=n) for t, n in sizes]
    return Trajectory(prompt_id=pid, prompt_tokens=100, turns=(*turns, Turn(gen_tokens=gen)))


def _scaled(trajs: list[Trajectory], factor: float) -> list[Trajectory]:
    return [
        attrs.evolve(
            t, turns=tuple(attrs.evolve(x, tool_tokens=round(x.tool_tokens * factor)) if x.tool else x for x in t.turns)
        )
        for t in trajs
    ]


def test_default_is_the_adaptive_preset() -> None:
    router = make_router("cmlfq", SEARCH_BUCKETS)
    assert DEFAULT_PRESET == "adaptive" and router.budget == 0.08 and router.rule == "priced"
    assert router.budget_mix and router._fit is not None
    assert router._experts is not None and router.cold == "budget"
    assert make_router("cmlfq", SEARCH_BUCKETS, preset="published").rule == "mean-p90"
    # presets are complete option sets: laid over the default they give exactly themselves
    priced = make_router("cmlfq", SEARCH_BUCKETS, **CMLFQ_PRESETS["priced"])
    assert priced.budget is None and priced.tree.codec.size_edges == (1000, 4000)


def test_size_classes_are_per_tool_quantiles() -> None:
    codec = QuantileStateCodec(classes=3, method="quantile", min_samples=5)
    assert codec.size_class(10_000, "search") == 0  # nothing learnt: one class
    returns = [("search", n) for n in range(100, 1100, 10)] + [("user", n) for n in range(5, 55)]
    # (a tool is keyed by name once in two trajectories and told apart from the others by what follows it)
    codec.observe([_traj(f"p{i}", returns) for i in range(8)])
    # large for the user, small for search: classes are relative to each tool's own returns
    assert codec.size_class(50, "user") == 2 and codec.size_class(50, "search") == 0
    assert codec.size_class(1000, "search") == 2 and codec.size_class(500, "search") == 1
    # a tool seen too rarely uses the pooled edges
    assert codec.edges_for("rare") == codec.edges_for("no-such-tool")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(100, 20_000), min_size=30, max_size=200), st.sampled_from([2, 4]))
def test_quantile_size_classes_do_not_depend_on_the_scale(sizes, factor) -> None:
    """Scaling every return by a factor scales the learnt quantile edges and leaves every class unchanged (what
    fixed token edges cannot do)."""
    trajs = [_traj("p", [("search", n)]) for n in sizes]
    a, b = QuantileStateCodec.from_spec("quantile:3"), QuantileStateCodec.from_spec("quantile:3")
    a.observe(trajs)
    b.observe(_scaled(trajs, factor))
    assert all(a.size_class(n, "search") == b.size_class(n * factor, "search") for n in sizes)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(100, 300),
    st.lists(st.floats(0.85, 1.15), min_size=8, max_size=30),
    st.sampled_from([2, 4]),
)
def test_natural_breaks_of_clustered_returns_do_not_depend_on_the_scale(base, spread, factor) -> None:
    """Returns in four clusters (short, medium, long, very long answers; a factor of 8 apart, each within 15 % of
    its center, the same number in each): the natural breaks fall in the gaps at any scale, so every return keeps
    its class. (On returns without such gaps the breaks are one local optimum of a one-dimensional k-means among
    several, and log1p's +1 can tip a scaled copy to another: 73 % of one drawn set of 56 sizes kept their class.)"""
    sizes = [round(base * 8**k * f) for k in range(4) for f in spread]
    trajs = [_traj("p", [("search", n)]) for n in sizes]
    a, b = QuantileStateCodec.from_spec("breaks:4"), QuantileStateCodec.from_spec("breaks:4")
    a.observe(trajs)
    b.observe(_scaled(trajs, factor))
    assert [a.size_class(n, "search") for n in sizes] == [k for k in range(4) for _ in spread]
    assert all(a.size_class(n, "search") == b.size_class(n * factor, "search") for n in sizes)


def test_natural_breaks_do_not_depend_on_numpys_simd_functions(monkeypatch) -> None:
    """The edges come from the C library's scalar log1p/expm1, not numpy's: numpy picks a SIMD implementation by
    CPU (AVX-512 machines get another one, a few ulp apart), and the golden decisions of the adaptive preset
    changed on such a machine. numpy's two functions pushed one ulp off must leave the edges bit for bit."""
    sizes = [int(x) for x in np.random.default_rng(5).lognormal(6.5, 1.2, 600)]
    trajs = [_traj("p", [("search", n)]) for n in sizes]
    clean = QuantileStateCodec.from_spec("breaks:4")
    clean.observe(trajs)
    monkeypatch.setattr(np, "log1p", lambda x: np.nextafter(np.log(np.asarray(x, float) + 1.0), np.inf))
    monkeypatch.setattr(np, "expm1", lambda x: np.nextafter(np.exp(np.asarray(x, float)) - 1.0, np.inf))
    skewed = QuantileStateCodec.from_spec("breaks:4")
    skewed.observe(trajs)
    assert skewed.state() == clean.state() and len(clean.edges_for("search")) == 3


def test_quantile_tree_round_trips_through_json(tmp_path) -> None:
    tree = PrefixTree(size_edges="breaks:4")
    trace = generate("search-r1", num_steps=2, seed=3, num_prompts=16, samples_per_prompt=4)
    tree.update(trace)
    path = tmp_path / "tree.json"
    tree.save(path)
    again = PrefixTree.load(path)
    assert again.codec.config() == tree.codec.config() and again.codec.state() == tree.codec.state()
    assert again.to_dict() == tree.to_dict()


def _brute_share(points_per_request, totals, price) -> float:
    carried = 0
    for points in points_per_request:
        for lo, hi, c in points:
            if lo <= price <= hi:
                carried += c
                break
    return carried / sum(totals)


def _decision_points(*, max_points: int, max_requests: int):
    """Requests as lists of decision points (price interval low, high, tokens a move would carry)."""
    point = st.tuples(st.floats(0, 60), st.floats(0, 60), st.integers(1, 5000)).map(
        lambda p: (min(p[0], p[1]), max(p[0], p[1]), p[2])
    )
    return st.lists(st.lists(point, max_size=max_points), min_size=1, max_size=max_requests)


@settings(max_examples=60, deadline=None)
@given(_decision_points(max_points=5, max_requests=12), st.floats(0.01, 0.5))
def test_budget_counterfactual_matches_brute_force(requests, share) -> None:
    """The migrated-token share the budget computes for a price is what moving each request at its first decision
    point whose interval holds the price would carry; the chosen price is the grid's best fit under the budget."""
    budget = MigrationBudget(share, steps=1)
    totals = [10_000] * len(requests)
    for points in requests:
        budget.finish(list(points), 10_000)
    budget.end_step()
    shares = budget.shares()
    for price, got in zip(PRICE_GRID, shares):
        assert got == pytest.approx(_brute_share(requests, totals, price))
    chosen = budget.choose(1.0)
    fitting = [s for s in shares if s <= share]
    if fitting:
        assert shares[PRICE_GRID.index(chosen)] == max(fitting)
    else:
        assert chosen == PRICE_GRID[-1]


def test_budget_follows_the_cost_of_moving() -> None:
    """The same router on a workload whose moves carry twice the context ends at a higher price."""
    trace = generate("search-r1", num_steps=8, seed=4, num_prompts=32, samples_per_prompt=8)
    prices = []
    for factor in (1.0, 2.0):
        router = make_router("cmlfq", SEARCH_BUCKETS)
        replay(router, [attrs.evolve(t, prompt_tokens=int(t.prompt_tokens * factor)) for t in trace])
        prices.append(router.price)
    assert prices[1] >= prices[0]


@settings(max_examples=25, deadline=None)
@given(st.floats(0.005, 0.2), st.integers(0, 3), st.booleans())
def test_moves_never_carry_more_than_the_ceiling(ceiling, seed, drift) -> None:
    """Whatever the price does, every move of the run together carries at most `ceiling` of its tokens; with
    `drift` the steps come in order of length (each longer than the last: the price learnt on the last steps is
    always too low, as on FireAct's files). Fails with the ceiling removed (the default alone carries 8-40 % here)."""
    trace = generate("search-r1", num_steps=4, seed=seed, num_prompts=8, samples_per_prompt=4)
    if drift:
        ordered = sorted(trace, key=lambda t: t.total_tokens)
        trace = [attrs.evolve(t, step=i * 4 // len(ordered)) for i, t in enumerate(ordered)]
    result = replay(make_router("cmlfq", SEARCH_BUCKETS, ceiling=ceiling), trace)
    assert result.migrated_tokens <= ceiling * result.total_tokens


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["adaptive", "published"]))
def test_the_context_in_flight_is_the_sum_of_the_requests_contexts(seed, preset) -> None:
    """The running sum the ceiling and the cold budget read at each move (instead of a sum over every request in
    flight) equals that sum after any interleaving of admissions, tool returns, progress and finishes."""
    trace = generate("search-r1", num_steps=1, seed=seed % 7, num_prompts=4, samples_per_prompt=2)
    router = make_router("cmlfq", SEARCH_BUCKETS, **CMLFQ_PRESETS[preset])
    rng = np.random.default_rng(seed)
    pending = {i: 0 for i in range(len(trace))}  # request -> turns done
    for i, t in enumerate(trace):
        router.admit(i, prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens)
    while pending:
        i = int(rng.choice(list(pending)))
        t, k = trace[i], pending[i]
        if k == len(t.turns) or t.turns[k].tool is None:
            router.finish(i, t)
            del pending[i]
        elif rng.random() < 0.3:
            router.on_progress(i, context_tokens=t.context_after(k) + int(rng.integers(0, t.turns[k].gen_tokens + 1)))
        else:
            turn = t.turns[k]
            router.on_tool_return(
                i,
                tool=turn.tool,
                tool_tokens=turn.tool_tokens,
                status=turn.tool_status,
                context_tokens=t.context_after(k + 1),
            )
            pending[i] = k + 1
        assert router.context_in_flight == sum(r.context for r in router._requests.values())
    assert router.context_in_flight == 0


def test_the_ceiling_binds_only_past_it() -> None:
    """On FireAct GPT-3.5's runs (in order of length) the default without its ceiling carries 12.8 % of the
    tokens; with it, 8.3 %, in fewer moves (14.3 % and 11.8 % without the recent admission expert)."""
    trajs = load_corpus(HELD_OUT)["fireact-gpt35-hotpotqa"]
    buckets = quantile_buckets(trajs)
    free = replay(make_router("cmlfq", buckets, ceiling=None), trajs)
    capped = replay(make_router("cmlfq", buckets), trajs)
    assert free.migrated_token_fraction > MAX_MIGRATED >= capped.migrated_token_fraction
    assert capped.migrations_per_trajectory < free.migrations_per_trajectory


def test_ceiling_is_checked() -> None:
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(SpecError, match="ceiling"):
            make_router("cmlfq", SEARCH_BUCKETS, ceiling=bad)


# -- real agent trajectories (data/corpus; docs/routing.md has the table) --------------------------------------------
CODING_BUCKETS = parse_buckets("1:8000,2:16000,4:32000,8:inf")


@pytest.fixture(scope="module")
def corpus_scores():
    """(source, bucket set) -> results of the baselines and the default, on the committed corpus (a few seconds)."""
    out = {}
    for name, trajs in load_corpus().items():
        out[name, "quartiles"] = score_source(trajs, quantile_buckets(trajs), {"default": {}})
        if name.startswith(("swe-agent", "mini-swe-agent")):
            out[name, "coding"] = score_source(trajs, CODING_BUCKETS, {"default": {}})
    return out


def _gap(res) -> float:
    return res["default"].routing_accuracy - max(res[b].routing_accuracy for b in BASELINES)


def test_default_on_every_real_source(corpus_scores) -> None:
    """On every real source of >= 100 trajectories (docs/routing.md), at its quartile buckets and, for the coding
    agent, at 1:8000,2:16000,4:32000,8:inf, the default beats the best baseline (fcfs, mlfq, predictor, most common
    bucket) while carrying at most 12 % of the tokens. Measured (2026-12-06): tau-bench/gpt-4o 49.0 % / 6.3 % vs
    41.5 %; tau2/gemma-3-27b 61.8 % / 9.0 % vs 27.0 %; mini-swe-agent/gemini-3-pro 34.8 % / 9.4 % vs 28.8 % and
    58.6 % / 9.8 % vs 51.2 %; ToRA-70B / ToRA-Code-34B on GSM8K 69.0 % / 8.8 % vs 61.0 % and 69.7 % / 8.6 % vs
    60.8 %."""
    seen = set()
    for (name, buckets), res in corpus_scores.items():
        if res["default"].trajectories < 100:
            continue
        seen.add(name)
        assert res["default"].migrated_token_fraction <= MAX_MIGRATED, (name, buckets)
        assert _gap(res) > 0, (name, buckets)
    assert {
        "tau-bench-gpt4o-airline",
        "tau2-gemma3-27b-custom",
        "mini-swe-agent-gemini3pro-verified",
        "tora-70b-gsm8k",
        "tora-code-34b-gsm8k",
    } <= seen


def test_default_beats_baselines_by_five_points_everywhere(corpus_scores) -> None:
    """The issue's target on every source of >= 100 trajectories and bucket set: +7.5 (tau-bench), +34.9 (tau2),
    +6.0 and +7.4 points (the coding agent), +8.0 and +8.9 (the ToRA math agents), at <= 12 % migrated tokens
    (docs/routing.md, measured 2026-12-06)."""
    for key, res in corpus_scores.items():
        if res["default"].trajectories >= 100:
            assert meets_target(_gap(res), res["default"].migrated_token_fraction), key


def test_admission_experts_lift_tau_bench(corpus_scores) -> None:
    """Without the choice of admission evidence (admit_select=False) the default is lower on tau-bench (47.0 %
    against 49.0 %, the predictor 41.5 %): a task's earlier runs name its bucket better than the shrunk tree. (Before
    tools were told apart pair by pair, 45.0 %: within 5 points of the predictor, which the experts lifted past.)"""
    trajs = load_corpus()["tau-bench-gpt4o-airline"]
    plain = replay(make_router("cmlfq", quantile_buckets(trajs), admit_select=False), trajs)
    res = corpus_scores["tau-bench-gpt4o-airline", "quartiles"]
    best = max(res[b].routing_accuracy for b in BASELINES)
    assert (
        plain.routing_accuracy + 0.015 < res["default"].routing_accuracy
        and res["default"].routing_accuracy - best >= 0.05
    )


def test_default_beats_baselines_by_five_points_on_the_coding_agent(corpus_scores) -> None:
    """The issue's target met on the coding agent (both bucket sets): +6.0 and +7.4 points at 9.4 % and 9.8 %."""
    for buckets in ("quartiles", "coding"):
        res = corpus_scores["mini-swe-agent-gemini3pro-verified", buckets]
        assert meets_target(_gap(res), res["default"].migrated_token_fraction), buckets


def test_fitted_shrinkage_and_price_mix_are_what_wins_on_the_coding_agent(corpus_scores) -> None:
    """Without the fitted shrinkage and the budget's price mix (the adaptive preset of before) the default is below
    the best baseline on the coding agent: 27.6 % vs 28.8 % at quartiles (docs/routing.md; the admission experts
    and the cold budget off too, as then)."""
    trajs = load_corpus()["mini-swe-agent-gemini3pro-verified"]
    fixed = replay(
        make_router("cmlfq", quantile_buckets(trajs), shrink=0.0, budget_mix=False, admit_select=False, cold="stay"),
        trajs,
    )
    res = corpus_scores["mini-swe-agent-gemini3pro-verified", "quartiles"]
    assert fixed.routing_accuracy < max(res[b].routing_accuracy for b in BASELINES) < res["default"].routing_accuracy


def test_shrink_blends_node_shares_with_the_population() -> None:
    """`shrink=k` mixes a node's bucket shares with the agnostic root's survival shares, weight n / (n + k) for n
    survivors at the node: 0 leaves the node's shares, a huge k gives the root's."""
    trace = generate("search-r1", num_steps=3, seed=5, num_prompts=8, samples_per_prompt=8)
    probs = {}
    for k in (0.0, 1e12):
        router = make_router("cmlfq", SEARCH_BUCKETS, shrink=k)
        replay(router, trace[: 2 * 64])
        t = trace[-1]
        router.admit("r", prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens)
        ctx = t.prompt_tokens + t.turns[0].gen_tokens + t.turns[0].tool_tokens
        router.on_tool_return(
            "r", tool=t.turns[0].tool, tool_tokens=t.turns[0].tool_tokens, status="ok", context_tokens=ctx
        )
        walk = router._requests["r"].state
        probs[k] = router._probabilities(walk, ctx)
        root = router._bucket_probs(router.tree.agnostic, walk.root_ctx, 1.0, ctx)
        node, anchor, scale = router._select(walk)
        own = router._bucket_probs(node, anchor, scale, ctx)
        assert node is not router.tree.agnostic
        expected = own if k == 0 else root
        assert probs[k] == pytest.approx(expected, abs=1e-9)
    assert probs[0.0] != pytest.approx(probs[1e12], abs=1e-6)


# -- synthetic search-r1 --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_default_is_robust_to_the_size_of_tool_returns(factor) -> None:
    """Synthetic search-r1 with every tool return scaled by 0.5x / 2x, buckets scaled with the mean length (the
    operator sizes buckets to the workload): single-shot accuracy within 2 points of the unscaled run, and the
    migrated-token share within the budget's reach (<= 10 %)."""
    trace = generate("search-r1", num_steps=20, seed=1, num_prompts=64, samples_per_prompt=16)
    base = replay(make_router("cmlfq", SEARCH_BUCKETS), trace)
    scaled = _scaled(trace, factor)
    ratio = np.mean([t.total_tokens for t in scaled]) / np.mean([t.total_tokens for t in trace])
    buckets = tuple(attrs.evolve(b, max_tokens=b.max_tokens * ratio) for b in SEARCH_BUCKETS)
    moved = replay(make_router("cmlfq", buckets), scaled)
    assert abs(moved.routing_accuracy - base.routing_accuracy) <= 0.02
    assert moved.migrated_token_fraction <= 0.10


def test_grid_is_increasing() -> None:
    assert all(a < b for a, b in itertools.pairwise(PRICE_GRID))


@settings(max_examples=60, deadline=None)
@given(_decision_points(max_points=4, max_requests=10), st.floats(0.01, 0.5))
def test_price_mix_spends_the_budget_in_expectation(requests, share) -> None:
    """choose_mix: the chosen price is `choose`'s; with probability q the next lower grid price whose share is over
    the budget, so that q * share(lower) + (1 - q) * share(price) is the budget exactly (when such a price exists)."""
    budget = MigrationBudget(share, steps=1)
    for points in requests:
        budget.finish(list(points), 10_000)
    budget.end_step()
    shares = budget.shares()
    price, lower, q = budget.choose_mix(1.0)
    assert price == budget.choose(1.0) and 0.0 <= q <= 1.0
    if q > 0:
        s_hi, s_lo = shares[PRICE_GRID.index(price)], shares[PRICE_GRID.index(lower)]
        assert lower < price and s_lo > share >= s_hi
        assert q * s_lo + (1 - q) * s_hi == pytest.approx(share)
        between = PRICE_GRID[PRICE_GRID.index(lower) + 1 : PRICE_GRID.index(price)]
        assert all(shares[PRICE_GRID.index(p)] <= share for p in between)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(5, 60))
def test_shrink_fit_picks_the_least_brier_score(seed, m) -> None:
    """ShrinkFit.choose is the grid value whose blended shares have the least Brier score (brute force)."""
    rng = np.random.default_rng(seed)
    fit = ShrinkFit(steps=1)
    recs = []
    for _ in range(m):
        own, prior = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
        n, y = float(rng.integers(1, 50)), int(rng.integers(0, 3))
        fit.finish([(own.tolist(), prior.tolist(), n)], y)
        recs.append((own, prior, n, y))
    fit.end_step()

    def brier(k):
        total = 0.0
        for own, prior, n, y in recs:
            p = n / (n + k) * own + k / (n + k) * prior
            total += sum((p[j] - (j == y)) ** 2 for j in range(3))
        return total / m

    scores = [brier(k) for k in SHRINK_GRID]
    assert fit.scores() == pytest.approx(scores)
    assert brier(fit.choose(0.0)) == pytest.approx(min(scores))


# -- admission experts and the cold budget ---------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), max_size=12), max_size=6))
def test_admission_experts_choose_the_best_decayed_score(steps) -> None:
    """AdmitExperts admits on the expert with the most right guesses, step s weighted 1/2 per later step (brute
    force), the first among equals; before any step it is the tree."""
    experts = AdmitExperts()
    assert experts.chosen == 0
    for s, requests in enumerate(steps):
        for tree, prompt, truth in requests:
            experts.finish((tree, prompt, 0), truth)
        chosen = experts.end_step()
        scores = [
            sum(0.5 ** (s - j) * sum(g[i] == g[2] for g in [(t, p, tr) for t, p, tr in steps[j]]) for j in range(s + 1))
            for i in range(2)
        ]
        scores.append(sum(0.5 ** (s - j) * sum(tr == 0 for _, _, tr in steps[j]) for j in range(s + 1)))
        assert experts.scores == pytest.approx(scores)
        assert chosen == experts.chosen and scores[chosen] == pytest.approx(max(scores))
        assert all(scores[i] < max(scores) - 1e-9 for i in range(chosen))


def test_admission_experts_on_the_math_agent(corpus_scores) -> None:
    """On ToRA-70B / GSM8K (unique problems, the prompt a large part of a short trajectory) the predictor's
    prompt-length deciles are the best evidence (61.0 %); without the admission experts the default is below it."""
    trajs = load_corpus()["tora-70b-gsm8k"]
    plain = replay(make_router("cmlfq", quantile_buckets(trajs), admit_select=False), trajs)
    res = corpus_scores["tora-70b-gsm8k", "quartiles"]
    best = max(res[b].routing_accuracy for b in BASELINES)
    assert plain.routing_accuracy < best < best + 0.05 <= res["default"].routing_accuracy


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(50, 400), st.integers(0, 3)), min_size=1, max_size=60), st.integers(0, 500))
def test_prompt_length_bins_are_the_predictors(finished, prompt) -> None:
    """PromptLengthBins guesses what the predictor baseline admits an unseen prompt into (brute force: the
    baseline itself, fed the same finished requests)."""
    buckets = parse_buckets("1:1000,2:2000,4:3000,8:inf")
    lengths = (500, 1500, 2500, 3500)
    bins = PromptLengthBins()
    predictor = make_router("predictor", buckets)
    for i, (p, b) in enumerate(finished):
        bins.observe(p, b)
        t = Trajectory(prompt_id=f"seen-{i}", prompt_tokens=p, turns=(Turn(gen_tokens=lengths[b] - p),))
        predictor.admit(i, prompt_id=t.prompt_id, prompt_tokens=p)
        predictor.finish(i, t)
    bins.end_step()
    predictor.end_step()
    assert bins.guess(prompt) == predictor.admit("new", prompt_id="never-seen", prompt_tokens=prompt).bucket


def test_admission_follows_the_prompt_history_when_it_is_right() -> None:
    """Short prompts (three quarters of the runs) and long ones, behind the same tool-return path, with the tree's
    shares shrunk to the population's: the tree guesses the short bucket for all, the prompt's own runs are right
    every time, so after a step the router admits on them, each prompt into its own bucket."""
    buckets = parse_buckets("1:1000,2:4000,4:inf")
    short = [_traj(f"p{i % 6}", [("search", 100)], gen=200) for i in range(12)]
    long_ = [_traj(f"q{i % 2}", [("search", 100)], gen=1500) for i in range(4)]
    router = make_router("cmlfq", buckets, shrink=1e6)  # the tree's shares are the population's: no prompt signal
    for _ in range(3):
        replay(router, short + long_, num_chunks=1)
    assert router._experts.chosen == EXPERTS.index("prompt")
    assert router.admit("a", prompt_id="p1", prompt_tokens=100).bucket == 0
    assert router.admit("b", prompt_id="q1", prompt_tokens=100).bucket == 1


def test_cold_budget_promotes_within_the_budget() -> None:
    """cold="budget": with nothing learnt (the first step) overflows are promoted while this step's moves carry
    at most the budget's share of its tokens (with `repay`, the default, at most the ceiling's: the run's target
    pays it back); cold="stay" moves nothing, cold="promote" carries more."""
    step0 = generate("search-r1", num_steps=1, seed=3, num_prompts=64, samples_per_prompt=16)
    res = {c: replay(make_router("cmlfq", SEARCH_BUCKETS, cold=c, repay=None), step0, num_chunks=1) for c in CMLFQ_COLD}
    assert res["stay"].migrated_tokens == 0
    assert 0 < res["budget"].migrated_token_fraction <= 0.08 < res["promote"].migrated_token_fraction
    assert res["stay"].routing_accuracy < res["budget"].routing_accuracy < res["promote"].routing_accuracy
    run = replay(make_router("cmlfq", SEARCH_BUCKETS), step0, num_chunks=1)
    assert res["budget"].migrated_token_fraction < run.migrated_token_fraction <= 0.12


@pytest.mark.parametrize("repay", [None, 6])
def test_cold_budget_books_what_the_moves_carry(repay) -> None:
    """The cold budget books what each move carries (at a tool return the context before the return, which the
    destination prefills either way), not the whole context: booked == carried. Booking the context (as before)
    spent 4.9 % of search-r1's cold step against a budget of 8 %."""
    step0 = generate("search-r1", num_steps=1, seed=3, num_prompts=32, samples_per_prompt=8)
    router = make_router("cmlfq", SEARCH_BUCKETS, repay=repay)
    carried = 0
    for rid, traj in enumerate(step0):
        context = traj.prompt_tokens
        d = router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=context)
        for turn in traj.turns:
            context += turn.gen_tokens
            carried += router.on_progress(rid, context_tokens=context).migrated_tokens
            context += turn.tool_tokens
            if turn.tool is not None:
                d = router.on_tool_return(
                    rid, tool=turn.tool, tool_tokens=turn.tool_tokens, status="ok", context_tokens=context
                )
                carried += d.migrated_tokens
        router.finish(rid, traj)
    assert carried > 0 and router._cold_carried == carried  # before end_step, which starts a new step's book


@settings(max_examples=40, deadline=None)
@given(_decision_points(max_points=4, max_requests=10), st.floats(0.01, 0.5), st.floats(0.0, 0.5))
def test_a_target_share_replaces_the_budget(requests, share, target) -> None:
    """choose / choose_mix with `share` (the router's run-level target, `repay`) choose exactly what a budget of
    that share would."""
    budgets = [MigrationBudget(share, steps=1), MigrationBudget(target, steps=1)]
    for budget in budgets:
        for points in requests:
            budget.finish(list(points), 10_000)
        budget.end_step()
    assert budgets[0].choose_mix(1.0, target) == budgets[1].choose_mix(1.0)
    assert budgets[0].choose(1.0, target) == budgets[1].choose(1.0)


def test_repay_targets_the_runs_share() -> None:
    """`repay`: at each step end the budget is asked for the budget plus the run's shortfall (budget x tokens so far
    - tokens carried so far) spread over `repay` steps of the last step's size, within [0, ceiling]; without it,
    for the budget itself."""
    trace = generate("search-r1", num_steps=6, seed=1, num_prompts=16, samples_per_prompt=8)
    for repay in (None, 1, 6):
        router = make_router("cmlfq", SEARCH_BUCKETS, repay=repay)
        asked: list[tuple[float | None, float]] = []
        real_end, real_mix = router._budget.end_step, router._budget.choose_mix
        state = {"seen": 0, "step": 0}

        def end_step(router=router, real_end=real_end, state=state):  # every step end: the step's tokens
            state["step"] = router._finished_total - state["seen"]
            state["seen"] = router._finished_total
            real_end()

        def spy(current, share=None, router=router, real_mix=real_mix, asked=asked, state=state, repay=repay):
            want = None
            if repay is not None:
                shortfall = 0.08 * router._finished_total - router._carried_total
                want = min(0.12, max(0.0, 0.08 + shortfall / (repay * state["step"])))
            asked.append((share, want))
            return real_mix(current, share)

        router._budget.end_step, router._budget.choose_mix = end_step, spy
        result = replay(router, trace)
        assert len(asked) >= 3 and all(share == pytest.approx(want) for share, want in asked)
        assert router._carried_total == result.migrated_tokens
        if repay is not None:
            assert len({round(share, 6) for share, _ in asked}) > 1  # the target moves with the run


@pytest.mark.parametrize("hold", [True, False])
def test_the_first_warm_step_holds_the_price(hold) -> None:
    """`hold_first`: the first warm step's records (routed on a tree learnt from the cold step alone) neither set
    the price nor stay in the budget's window; the step after it keeps the initial price. Without it the price
    moves there (to 1.86 on search-r1 seed 2, where the next steps then spent 4.2 %)."""
    trace = generate("search-r1", num_steps=3, seed=2, num_prompts=32, samples_per_prompt=8)
    router = make_router("cmlfq", SEARCH_BUCKETS, hold_first=hold)
    prices = []
    for step in range(3):
        replay(router, [t for t in trace if t.step == step], num_chunks=1)  # replay ends the step
        prices.append(router.price)
    assert prices[0] == 1.0  # the cold step records nothing
    assert (prices[1] == 1.0) == hold and router._budget.recorded
    if hold:
        assert prices[2] != 1.0


def test_bad_expert_and_cold_options() -> None:
    # the experts act where the priced rule admits; with another rule (an option laid over the default) inert
    assert make_router("cmlfq", SEARCH_BUCKETS, preset="published", admit_select=True)._experts is None
    assert make_router("cmlfq", SEARCH_BUCKETS, rule="median")._experts is None
    with pytest.raises(SpecError, match="cold='budget' needs a budget"):
        make_router("cmlfq", SEARCH_BUCKETS, budget=None)
    with pytest.raises(SpecError, match="cold must be"):
        make_router("cmlfq", SEARCH_BUCKETS, cold="warm")
    for bad in (0, -1, 1.5, "6"):
        with pytest.raises(SpecError, match="repay"):
            make_router("cmlfq", SEARCH_BUCKETS, repay=bad)
