"""C-MLFQ decisions applied to real vLLM engines: multi-turn trajectories with a toy tool, migrations between a
small and a large instance, and the same tokens as an unrouted run (greedy)."""

from __future__ import annotations

import pytest

from libra.adapters import Sampling
from libra.adapters.routing import RoutedRollout, ToolReturn
from tests.limits import scaled

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

TURN = Sampling(max_tokens=8, ignore_eos=True)
PROMPTS = {f"p{i}-s{j}": (f"p{i}", [5 + i, 6, 7, 8, 9, 10, 11, 12]) for i in range(4) for j in range(2)}


def toy_tool(request_id, turn_ids, turn_index):
    """Even prompts hit a failing search with a large payload; odd prompts get a small ok result."""
    long = int(request_id[1]) % 2 == 0
    size = 30 if long else 4
    return ToolReturn(
        tool="search", status="error" if long else "ok", output_token_ids=tuple(40 + (k % 7) for k in range(size))
    )


class _AllSmall:
    """A router that never moves anything (the unrouted reference)."""

    def __init__(self, buckets):
        from libra.scheduling import make_router

        self.inner = make_router("fcfs", buckets)
        self.buckets = buckets

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def backend(vllm_backend):
    return vllm_backend


def test_cmlfq_routes_and_migrates_on_real_engines(backend):
    from libra.scheduling import make_router
    from libra.spec import parse_buckets

    buckets = parse_buckets("1:60,2:inf")
    router = make_router("cmlfq", buckets, preset="published", size_edges=(8, 32))  # the rule this test describes
    rollout = RoutedRollout(backend=backend, router=router, bucket_instances={0: ["small"], 1: ["large"]})
    per_step = []
    for step in range(2):
        start = len(rollout.decisions)
        results = rollout.run(PROMPTS, sampling=TURN, tool=toy_tool, max_turns=3, step=step)
        router.end_step()
        per_step.append((results, rollout.decisions[start:]))
    assert all(r.error is None for results, _ in per_step for r in results.values())
    moved = [d for _, ds in per_step for d in ds if d.migrate]
    assert moved and len(moved) == len(rollout.migrations)
    for d, m in zip(moved, rollout.migrations):  # each decision became a migration to its bucket's instance
        assert m.request_id == d.request_id and m.to_instance == ("small", "large")[d.bucket]
    for results, _ in per_step:
        for rid, r in results.items():
            assert r.instances[-1] == ("large" if int(rid[1]) % 2 == 0 else "small"), (rid, r.instances)
    # step 0 learns only from overflow; step 1 predicts from the prefix tree and moves at the first tool return
    step1_reasons = {d.reason for d in per_step[1][1] if d.migrate}
    assert step1_reasons and "overflow" not in step1_reasons, step1_reasons

    reference = RoutedRollout(backend=backend, router=_AllSmall(buckets), bucket_instances={0: ["small"], 1: ["small"]})
    unrouted = reference.run(PROMPTS, sampling=TURN, tool=toy_tool, max_turns=3)
    assert not reference.migrations
    for rid in PROMPTS:
        assert per_step[1][0][rid].context == unrouted[rid].context  # greedy: migration changes no token
