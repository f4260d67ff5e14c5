"""The published rule's and the `probability` rule's own `on_tool_return` (`_published_call`, `_probability_call`,
issue 16): every decision as the general path gives it (`_inline=False`: `CMLFQRouter._tool_return`), over seeded
workloads with many buckets and requests held in flight across step ends, and under Hypothesis on small windows with
any limits, fallbacks, cost ratios, confidences and overflow."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import bucket_limits, window_trajectories

from libra.scheduling import CMLFQ_PRESETS, make_router
from libra.scheduling.cmlfq import CMLFQRouter
from libra.spec import parse_buckets
from libra.workloads.generators import WorkloadGenerator
from libra.workloads.trace import Trajectory, Turn


def _log(buckets, options: dict, inline: bool, steps, preset: str = "published") -> list:
    """Every decision of a router of `preset` (published: the mean-p90 rule; accuracy: the probability rule), turn
    by turn (progress and tool returns), a third of each step's requests finishing only after the step end with their
    last turns routed after it."""
    limits = parse_buckets(buckets) if isinstance(buckets, str) else buckets
    router = make_router("cmlfq", limits, **{**CMLFQ_PRESETS[preset], **options})
    assert router.on_tool_return.__func__.__name__ == (
        "_published_call" if preset == "published" else "_probability_call"
    )
    router._inline = inline
    log: list = []
    rid = itertools.count()

    def turns(r, traj, ks) -> None:
        for k in ks:
            turn = traj.turns[k]
            d = router.on_progress(r, context_tokens=traj.context_after(k) + turn.gen_tokens)
            log.append((r, d.bucket, d.migrated_tokens, d.reason))
            if turn.tool is not None:
                d = router.on_tool_return(
                    r,
                    tool=turn.tool,
                    tool_tokens=turn.tool_tokens,
                    status=turn.tool_status,
                    context_tokens=traj.context_after(k + 1),
                )
                log.append((r, d.bucket, d.migrate, d.migrated_tokens, d.reason))

    held: list = []
    for step in steps:
        for i, traj in enumerate(step):
            r = next(rid)
            log.append((r, router.admit(r, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens).bucket))
            half = len(traj.turns) // 2
            turns(r, traj, range(half))
            if i % 3 == 0:
                held.append((r, traj, range(half, len(traj.turns))))
            else:
                turns(r, traj, range(half, len(traj.turns)))
                router.finish(r, traj)
        router.end_step()
        for r, traj, rest in held:
            turns(r, traj, rest)
            router.finish(r, traj)
        held = []
    return log


CASES = [
    ("search-r1", "2:5000,4:15000,8:inf", {}),
    ("search-r1", "1:1500,2:3000,4:6000,8:12000,16:inf", {"fallback": "agnostic", "cost_ratio": 0.1}),
    ("r2e-gym", "1:4000,2:12000,4:30000,8:inf", {}),
    ("r2e-gym", "1:2500,2:5000,4:9000,8:16000,16:40000", {"overflow": False, "min_count": 1}),
    ("search-r1", "1:1500,2:3000,4:6000,8:12000,16:inf", {"confidence": 0.3}),
]


@pytest.mark.parametrize("preset", ["published", "accuracy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{len(c[2])}")
def test_own_path_decides_as_the_general_one(case, preset) -> None:
    workload, buckets, options = case
    gen = WorkloadGenerator(workload, seed=5, num_prompts=24)
    steps = [gen.step(s) for s in range(4)]
    fast = _log(buckets, options, True, steps, preset)
    assert sum(1 for x in fast if x[-1] == "tool-return") > 20  # the rule moved requests
    assert fast == _log(buckets, options, False, steps, preset)


@settings(max_examples=120, deadline=None)
@given(
    steps=st.lists(st.lists(window_trajectories, min_size=1, max_size=24), min_size=2, max_size=4),
    limits=bucket_limits(),
    fallback=st.sampled_from(["parent", "agnostic"]),
    cost_ratio=st.sampled_from([0.0, 0.5, 2.0]),
    overflow=st.booleans(),
    min_count=st.integers(1, 2),
    preset=st.sampled_from(["published", "accuracy"]),
    confidence=st.sampled_from([0.2, 0.5, 0.7, 1.0]),
)
def test_own_path_on_small_windows(
    steps, limits, fallback, cost_ratio, overflow, min_count, preset, confidence
) -> None:
    options = {"fallback": fallback, "cost_ratio": cost_ratio, "overflow": overflow, "min_count": min_count}
    if preset == "accuracy":
        options["confidence"] = confidence
    assert _log(limits, options, True, steps, preset) == _log(limits, options, False, steps, preset)


def test_a_request_admitted_above_its_need_moves_down_where_every_run_like_it_ended_in_the_smaller_bucket() -> None:
    """The `probability` rule's own path where the request sits in the unbounded last bucket and every trajectory
    of its node ended within the bucket below: that bucket holds all the shares, so the rule moves the request down
    (as the general path does), not because its own bucket holds a majority. Prompt p ran four times with a search
    and a long answer (535 tokens) and twice with a python call and a short one (75 tokens): a new run of p is
    admitted to the unbounded bucket by its prompt's history; after its python call (context 35) the two runs like
    it had 40 tokens to go, both within the first bucket (100)."""

    def run(short: bool) -> Trajectory:
        first = Turn(gen_tokens=20, tool="python" if short else "search", tool_tokens=5, tool_status="ok")
        return Trajectory(prompt_id="p", prompt_tokens=10, turns=(first, Turn(gen_tokens=40 if short else 500)))

    decisions = []
    for inline in (True, False):
        router = CMLFQRouter(
            parse_buckets("1:100,2:inf"), rule="probability", admit="predicted", cost_ratio=0.0, min_count=1
        )
        assert router.on_tool_return.__func__.__name__ == "_probability_call"
        router._inline = inline
        for r, short in enumerate((False, False, False, False, True, True)):
            router.admit(r, prompt_id="p", prompt_tokens=10)
            router.finish(r, run(short))
        router.end_step()
        assert router.admit(99, prompt_id="p", prompt_tokens=10).bucket == 1
        assert router.on_progress(99, context_tokens=30).bucket == 1
        d = router.on_tool_return(99, tool="python", tool_tokens=5, status="ok", context_tokens=35)
        decisions.append((d.bucket, d.migrate, d.migrated_tokens, d.reason))
    assert decisions[0] == decisions[1] == (0, True, 30, "tool-return")
