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
