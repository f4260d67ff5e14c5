"""`WorkloadProfile.groups`: the planner's length groups serve exactly the step's requests, however few (a
regression: a window of several small steps, or a trace of one trajectory per step, was planned as 32 requests a
step)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning import GlobalPlanner
from libra.spec import ClusterSpec, RLSettings, SpecError, WorkloadProfile, get_gpu, get_model


def length_groups(profile: WorkloadProfile, num_groups: int, requests: int):
    return attrs.evolve(profile, requests_per_step=requests).groups(num_groups)


def _profile(n: int, seed: int = 0) -> WorkloadProfile:
    rng = np.random.default_rng(seed)
    total = rng.integers(500, 20_000, n)
    shapes = [(float(t), float(t) / 3, float(rng.integers(1, 8))) for t in total]
    return WorkloadProfile.build(name="p", shapes=shapes)


@pytest.mark.parametrize("n", [1, 7, 100, 1000])
@pytest.mark.parametrize("requests", [1, 2, 10, 31, 50, 99, 100, 101, 333, 8192])
def test_counts_add_up_to_the_requests(n: int, requests: int) -> None:
    groups = length_groups(_profile(n), 32, requests)
    assert sum(g.count for g in groups) == requests
    assert len(groups) <= min(32, n, requests)
    assert min(g.count for g in groups) >= 1
    assert max(g.max_total for g in groups) == _profile(n).total_lengths[-1]  # the tail is kept


def test_equal_groups_keep_their_scaled_size() -> None:
    """Where each group's share is whole (128 samples in 32 groups of 4, a step of 64 or 256 requests), each group
    serves its size times requests / samples, as the profile's scaling always gave: nothing moves for an ordinary
    window; unscaled, a group's count is its size."""
    profile = _profile(128)
    for requests, each in ((64, 2), (256, 8), (128, 4)):
        groups = length_groups(profile, 32, requests)
        assert [g.count for g in groups] == [each] * 32


def test_no_requests_is_an_error() -> None:
    with pytest.raises(SpecError, match="requests_per_step must be >= 1"):
        length_groups(_profile(5), 32, 0)


def test_one_request_a_step_is_planned_as_one() -> None:
    """100 trajectories of a trace of one per step: the planner's rollout serves one request, on one instance
    (it was 32 requests, on as many instances as made them faster)."""
    planner = GlobalPlanner(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=1, samples_per_prompt=1),
    )
    profile = _profile(100)
    assert sum(g.count for g in planner.tables(profile).groups) == 1
    plan = planner.plan(profile)
    assert sum(g.count for g in plan.rollout.instances) == 1


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.sampled_from([100.0, 250.0, 1000.0, 1000.0, 1000.0, 4000.0]), min_size=1, max_size=80),
    num_groups=st.integers(1, 40),
    requests=st.integers(1, 200),
)
def test_no_group_boundary_splits_a_length(lengths: list[float], num_groups: int, requests: int) -> None:
    """A bucket's limit is its last group's `max_total`, and every request of that length is served there, so no
    boundary may cut requests of equal length in two (the upper part was priced in the next bucket: a final-length
    plan of ReAct on FEVER, 11 runs of exactly 1,000 tokens, 2 and 9 across a boundary, read 30 s where its
    requests take 41 s). Every group holds all the samples of its `max_total`, and the counts still add up."""
    profile = WorkloadProfile.build(name="ties", shapes=[(t, t / 2, 1.0) for t in lengths])
    groups = length_groups(profile, num_groups, requests)
    tops = [g.max_total for g in groups]
    assert tops == sorted(set(tops))  # strictly increasing: no length is the top of two groups
    assert sum(g.count for g in groups) == requests
    if requests == profile.num_samples:  # unscaled: a group's count is its size, so its samples are countable
        assert list(np.cumsum([g.count for g in groups])) == [sum(x <= top for x in lengths) for top in tops]
    assert 1 <= len(groups) <= min(num_groups, len(lengths), requests)
