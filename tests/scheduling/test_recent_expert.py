"""The default's fourth admission expert, `recent` (`recent_expert=1`, libra.scheduling.experts): the most common
final bucket of the last step's requests, admitted on only past a paired test against the best other expert.
docs/routing-log.md, "A short memory beside the long ones"."""

from __future__ import annotations

import pickle

import pytest

from libra.scheduling import CMLFQ_PRESETS, make_router, replay
from libra.scheduling.cmlfq import CMLFQRouter
from libra.scheduling.experts import EXPERTS, RECENT, AdmitExperts
from libra.scheduling.sources import BASELINES, MAX_MIGRATED, quantile_buckets
from libra.spec import SpecError, parse_buckets
from libra.workloads.corpus import load_corpus

POPULATION = EXPERTS.index("population")


def _step(experts: AdmitExperts, won: int, lost: int, tied: int = 4) -> int:
    """One step of requests that end in bucket 1: on `won` of them only `recent` names it, on `lost` only the
    others do, on `tied` all do; the tree and the prompt expert are always wrong, so the population is the best
    other expert."""
    for _ in range(won):
        experts.finish((0, 0, 2, 1), 1)
    for _ in range(lost):
        experts.finish((0, 0, 1, 2), 1)
    for _ in range(tied):
        experts.finish((0, 0, 1, 1), 1)
    return experts.end_step()


def test_recent_is_chosen_only_past_the_paired_test() -> None:
    """A recent expert that beats the population on a few requests by luck (3 wins, 1 loss: 2 <= sqrt(4)) is not
    admitted on although its score is the best; one that wins clearly (10 against 1) is; and it is dropped again
    as soon as its weighted wins no longer beat its losses by more than sqrt(wins + losses), while its score is
    still the best (5 + 2 against 0.5 + 2, then 3.5 + 1 against 1.25 + 3: 0.25 <= sqrt(4.75))."""
    lucky = AdmitExperts(recent=1)
    assert _step(lucky, won=3, lost=1) == POPULATION
    assert lucky.scores[RECENT] == max(lucky.scores) > lucky.scores[POPULATION]

    experts = AdmitExperts(recent=1)
    assert _step(experts, won=10, lost=1) == RECENT
    assert _step(experts, won=2, lost=2) == RECENT  # 7 against 2.5: 4.5 > sqrt(9.5)
    assert _step(experts, won=1, lost=3) == POPULATION
    assert experts.scores[RECENT] == max(experts.scores)  # (the score alone would have kept it)


def test_recent_guess_is_the_last_steps_most_common_bucket() -> None:
    experts = AdmitExperts(recent=1)
    assert experts.recent_guess is None
    for truth in (2, 2, 1, 3):
        experts.finish((0, 0, 0, 0), truth)
    experts.end_step()
    assert experts.recent_guess == 2
    for truth in (3, 1):  # a tie: the smaller bucket
        experts.finish((0, 0, 0, 0), truth)
    experts.end_step()
    assert experts.recent_guess == 1
    experts.end_step()  # a step that finished nothing keeps the guess
    assert experts.recent_guess == 1


def test_recent_expert_is_the_defaults_only() -> None:
    assert {name for name, opts in CMLFQ_PRESETS.items() if opts["recent_expert"]} == {"adaptive"}
    assert CMLFQ_PRESETS["adaptive"]["recent_expert"] == 1
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(SpecError, match="recent_expert"):
            make_router("cmlfq", parse_buckets("1:100,2:inf"), recent_expert=bad)


def test_an_admit_experts_pickled_before_recent_loads_without_it() -> None:
    """A router's experts pickled by the version before `recent` (no such fields) load as recent=0 and score on."""
    old = AdmitExperts()
    for name in ("recent", "recent_guess", "_truths", "_last", "_pairs", "_pairs_step"):
        delattr(old, name)
    loaded = pickle.loads(pickle.dumps(old))
    loaded.finish((0, 1, 1), 1)
    assert loaded.end_step() == 1 and loaded.recent == 0


def _longest_first(trajectories: list) -> list:
    """The trajectories by decreasing length, each task's runs refilled in file order (docs/routing-log.md)."""
    runs: dict[str, list] = {}
    for t in trajectories:
        runs.setdefault(t.prompt_id, []).append(t)
    queues = {task: iter(ts) for task, ts in runs.items()}
    order = sorted(range(len(trajectories)), key=lambda i: -trajectories[i].total_tokens)
    return [next(queues[trajectories[i].prompt_id]) for i in order]


def test_the_default_beats_the_baselines_on_the_coding_agent_longest_first() -> None:
    """Replayed longest first (quartile buckets), the default admitted from what the earlier, longer runs taught it
    and lost to the best baseline by 9.4 points; the recent expert follows the falling lengths: +31.2 at 2.9 %
    migrated (measured at 05513d8)."""
    trajs = _longest_first(load_corpus()["mini-swe-agent-gemini3pro-verified"])
    buckets = quantile_buckets(trajs)
    best = max(replay(make_router(p, buckets, **o), trajs).routing_accuracy for p, o in BASELINES.values())
    default = replay(make_router("cmlfq", buckets), trajs)
    assert default.routing_accuracy - best >= 0.05
    assert default.migrated_token_fraction <= MAX_MIGRATED


def test_a_pickled_default_routes_on_as_the_original_once_recent_is_chosen() -> None:
    """The default pickled in the middle of a longest-first run, with the recent expert chosen, routes the rest
    exactly as the original (the runtime's checkpoint pickles the router)."""
    trajs = _longest_first(load_corpus()["mini-swe-agent-gemini3pro-verified"])
    buckets = quantile_buckets(trajs)
    router = make_router("cmlfq", buckets)
    replay(router, trajs[:250], num_chunks=5)
    assert isinstance(router, CMLFQRouter) and router._experts is not None
    assert router._experts.chosen == RECENT
    twin = pickle.loads(pickle.dumps(router))
    rest = trajs[250:]
    assert replay(twin, rest, num_chunks=5).to_dict() == replay(router, rest, num_chunks=5).to_dict()
