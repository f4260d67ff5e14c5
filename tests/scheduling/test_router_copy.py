"""A C-MLFQ router of every preset survives pickling and deep copying: the copy routes the next step exactly as the
original (the default's learnt size classes included: its codec's own state was lost before)."""

from __future__ import annotations

import copy
import pickle

import pytest

from libra.scheduling import CMLFQ_PRESETS, make_router, replay
from libra.spec import parse_buckets
from libra.workloads.generators import WorkloadGenerator


def _route(router, trajectories) -> list:
    log = []
    for i, traj in enumerate(trajectories):
        log.append(router.admit(i, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens).bucket)
        for k, turn in enumerate(traj.turns):
            if turn.tool is not None:
                d = router.on_tool_return(
                    i,
                    tool=turn.tool,
                    tool_tokens=turn.tool_tokens,
                    status=turn.tool_status,
                    context_tokens=traj.context_after(k + 1),
                )
                log.append((d.bucket, d.migrated_tokens, d.reason))
        router.finish(i, traj)
    router.end_step()
    return log


@pytest.mark.parametrize("preset", list(CMLFQ_PRESETS))
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copied_router_routes_as_the_original(preset, how) -> None:
    gen = WorkloadGenerator("search-r1", seed=0, num_prompts=16)
    first, second = gen.step(0), gen.step(1)
    router = make_router("cmlfq", parse_buckets("2:5000,4:15000,8:inf"), **CMLFQ_PRESETS[preset])
    replay(router, first)
    twin = pickle.loads(pickle.dumps(router)) if how == "pickle" else copy.deepcopy(router)
    assert twin.on_tool_return.__self__ is twin  # (the priced rule's own on_tool_return, bound to the copy)
    assert _route(twin, second) == _route(router, second)
