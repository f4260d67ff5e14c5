"""C-MLFQ decisions under the published rule that the golden digests and the contract tests did not pin (found by
mutation testing, docs/testing.md): the overflow at a tool return, and the prompt's own statistics before the
prompt-agnostic ones."""

from __future__ import annotations

import pytest

from libra.scheduling import make_router
from libra.spec import parse_buckets
from libra.workloads.trace import Trajectory, Turn

BUCKETS = parse_buckets("2:5000,4:15000,8:inf")


def _run(answer: int, prompt: str = "p") -> Trajectory:
    """A 300-token prompt, 200 generated tokens, one 8,000-token search return, then `answer` more tokens."""
    return Trajectory(
        prompt_id=prompt,
        prompt_tokens=300,
        turns=(Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=8000), Turn(gen_tokens=answer)),
    )


def _router(cost_ratio: float):
    router = make_router("cmlfq", BUCKETS, preset="published", cost_ratio=cost_ratio)
    for rid, t in enumerate([_run(500)] * 7 + [_run(11_500)]):  # 7 end at 9,000 tokens, 1 at 20,000
        router.admit(rid, prompt_id="p", prompt_tokens=300)
        router.finish(rid, t)
    router.end_step()
    return router


@pytest.mark.parametrize(
    "cost_ratio, moves",
    [
        (0.5, True),  # 1,875 predicted remaining tokens >= 0.5 x 500 carried
        (3.5, True),  # >= 3.5 x 500 = 1,750
        (4.0, False),  # < 4 x 500 = 2,000: it stays where it is
    ],
)
def test_overflow_at_a_tool_return_prices_the_context_in_kv_cache(cost_ratio: float, moves: bool) -> None:
    """After the return the context is 8,500 tokens (bucket 0 ends at 5,000). The node predicts a mean of 10,375
    (bucket 1) and a P90 of 20,000 (bucket 2): the rule is not sure, so only the overflow can move the request, to
    the bucket of the context and the mean, if the 1,875 remaining tokens pay for the 500 carried."""
    router = _router(cost_ratio)
    router.admit(100, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(100, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
    if moves:
        assert d.migrate and d.bucket == 1 and d.reason == "overflow" and d.migrated_tokens == 500
    else:
        assert not d.migrate and d.bucket == 0 and d.reason == "stay"


def test_a_prompt_seen_before_is_routed_by_its_own_runs() -> None:
    """Prompt p always ran to 20,500 tokens and q to 9,000, along the same path. After the search return a new run of
    p follows p's statistics (mean and P90 in bucket 2: it moves there); the prompt-agnostic statistics, half long and
    half short, would disagree and only promote it to the bucket of its context. A run of q moves to bucket 1."""
    router = make_router("cmlfq", BUCKETS, preset="published")
    runs = [_run(12_000, "p")] * 8 + [_run(500, "q")] * 8
    for rid, t in enumerate(runs):
        router.admit(rid, prompt_id=t.prompt_id, prompt_tokens=300)
        router.finish(rid, t)
    router.end_step()
    for rid, prompt, bucket in [(100, "p", 2), (101, "q", 1)]:
        router.admit(rid, prompt_id=prompt, prompt_tokens=300)
        d = router.on_tool_return(rid, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
        assert d.migrate and d.bucket == bucket and d.reason == "tool-return", prompt
    router.admit(102, prompt_id="unseen", prompt_tokens=300)  # the agnostic statistics: not sure, overflow only
    d = router.on_tool_return(102, tool="search", tool_tokens=8000, status="ok", context_tokens=8500)
    assert d.migrate and d.bucket == 1 and d.reason == "overflow"


def _two_prompts(fallback: str):
    """q ran short after a 100-token search return (4,000 tokens in all); p, after an 8,000-token return, ran to
    20,500. The prompt-agnostic tree has q's path; p's own tree has not."""
    router = make_router("cmlfq", BUCKETS, preset="published", fallback=fallback)
    runs = [
        Trajectory(
            prompt_id="q",
            prompt_tokens=300,
            turns=(Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=100), Turn(gen_tokens=3400)),
        )
    ] * 8 + [_run(12_000, "p")] * 8
    for rid, t in enumerate(runs):
        router.admit(rid, prompt_id=t.prompt_id, prompt_tokens=300)
        router.finish(rid, t)
    router.end_step()
    return router


@pytest.mark.parametrize("fallback, bucket", [("parent", 2), ("agnostic", 0), ("scaled", 1)])
def test_fallbacks_for_a_path_the_prompt_has_not_taken(fallback: str, bucket: int) -> None:
    """A run of p takes q's path (a 100-token return, context 600). `parent`: p's own root predicts 20,500 (bucket 2).
    `agnostic`: q's node predicts 600 + 3,400 = 4,000 (bucket 0, it stays). `scaled`: q's node with its remaining
    tokens stretched by how much longer p runs than all prompts (20,200 / 11,950 remaining at admission):
    600 + 3,400 x 1.69 = 6,347 (bucket 1)."""
    router = _two_prompts(fallback)
    router.admit(100, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(100, tool="search", tool_tokens=100, status="ok", context_tokens=600)
    assert d.bucket == bucket and d.migrate == (bucket != 0)


def _scaled_priced_router():
    """Under the priced rule with the `scaled` fallback: q ran 14 times through a 100-token search return at context
    600, seven ending 1,000 tokens after it and seven 3,400 after it; p ran twice through an 8,000-token return to
    20,500 tokens. The prompt-agnostic root's mean remaining at admission is (7 x 1,300 + 7 x 3,700 + 2 x 20,200)
    / 16 = 4,712.5, p's 20,200: a run of p through q's path is q's node stretched by 20,200 / 4,712.5 = 4.2865."""
    router = make_router("cmlfq", BUCKETS, preset="published", rule="priced", fallback="scaled")

    def q(after: int) -> Trajectory:
        turns = (Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=100), Turn(gen_tokens=after))
        return Trajectory(prompt_id="q", prompt_tokens=300, turns=turns)

    runs = [q(1000)] * 7 + [q(3400)] * 7 + [_run(12_000, "p")] * 2
    for rid, t in enumerate(runs):
        router.admit(rid, prompt_id=t.prompt_id, prompt_tokens=300)
        router.finish(rid, t)
    router.end_step()
    return router


def test_a_scaled_node_conditions_on_the_context_in_its_own_units() -> None:
    """At p's tool return (context 600) q's node, stretched by 4.2865, says half of the runs end in bucket 0 (600 +
    1,000 x 4.2865 = 4,887) and half in bucket 2 (600 + 3,400 x 4.2865 = 15,174): it stays, bucket 0 being as likely.
    Once its context outgrows bucket 0 (5,001 tokens) it has run 4,401 / 4.2865 = 1,027 of q's tokens: the short
    runs are over, bucket 2 is certain, and the overflow moves it there (1.0 >= 0.7 x 5,001 / 5,012.5). Reading the
    context in q's units the wrong way round (4,401 x 4.2865) outlives every run of the node: no statistics, and the
    overflow would only promote it to the bucket of its context (1)."""
    router = _scaled_priced_router()
    router.admit(100, prompt_id="p", prompt_tokens=300)
    d = router.on_tool_return(100, tool="search", tool_tokens=100, status="ok", context_tokens=600)
    assert not d.migrate and d.bucket == 0
    d = router.on_progress(100, context_tokens=5001)
    assert d.migrate and d.bucket == 2 and d.reason == "overflow"


def test_a_single_price_move_interval_is_kept_in_the_budget_records() -> None:
    """A tool return whose move interval is one price (the gain 0.5 pays for carrying 500 tokens at the same price at
    which 0.5 short of the confidence is waived for a 500-token return) is a move at that price, as the rule's `>=`
    says: the migration budget's counterfactual at that price counts its carried tokens."""
    router = make_router("cmlfq", BUCKETS, preset="published", rule="priced", budget=0.08, confidence=1.0)
    runs = [
        Trajectory(
            prompt_id="p",
            prompt_tokens=300,
            turns=(Turn(gen_tokens=200, tool="search", tool_status="ok", tool_tokens=500), Turn(gen_tokens=answer)),
        )
        for answer in (9000, 19_000)  # end at 10,000 (bucket 1) and 20,000 tokens (bucket 2)
    ] * 4
    for rid, t in enumerate(runs):
        router.admit(rid, prompt_id="p", prompt_tokens=300)
        router.finish(rid, t)
    router.end_step()
    router.admit(100, prompt_id="p", prompt_tokens=300)
    # P = (0, 0.5, 0.5): the move to bucket 1 pays when 0.5 >= price x 500 / T and is sure enough when
    # 0.5 >= 1.0 - price x 500 / T, both from price = 0.5 x T / 500 on and only there
    price = 0.5 * (router.tree.agnostic.mean + 300) / 500
    d = router.on_tool_return(100, tool="search", tool_tokens=500, status="ok", context_tokens=1000)
    assert not d.migrate  # (at the initial price 0.7 it is not sure enough)
    router.finish(100, runs[0])
    router.end_step()
    assert router._budget.shares(prices=[price])[0] > 0
    assert router._budget.shares(prices=[price * 0.999])[0] == 0
