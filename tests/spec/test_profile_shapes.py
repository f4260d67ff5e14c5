"""Workload profiles and length groups that no set of trajectories can have are refused in one line naming the
trajectory or the field (libra/spec/profile.py): decoded tokens are part of a trajectory's total, so a profile with
more of them than its total, or a group whose mean is above its maximum, is a mistake upstream (a swapped column,
tokens counted twice), not a workload to plan for."""

from __future__ import annotations

import pytest

from libra.spec import LengthGroup, SpecError, WorkloadProfile


def test_a_trajectory_that_decodes_more_than_its_total_is_refused_naming_it() -> None:
    shapes = [(300.0, 100.0, 1.0), (100.0, 50.0, 1.0), (200.0, 250.0, 2.0)]
    # before: accepted; the planner priced 250 decoded tokens in a trajectory of 200
    with pytest.raises(SpecError) as err:
        WorkloadProfile.build(name="swapped", shapes=shapes)
    assert str(err.value) == (
        "WorkloadProfile 'swapped': trajectory 1 (by total length) decodes 250 tokens of a total of 200; "
        "gen_tokens must be <= total_lengths"
    )
    with pytest.raises(SpecError, match="trajectory 0 .* decodes 101 tokens of a total of 100;"):
        WorkloadProfile(name="p", total_lengths=(100.0, 200.0), gen_tokens=(101.0, 80.0))


def test_a_trajectory_made_only_of_decoded_tokens_is_a_profile() -> None:
    p = WorkloadProfile.build(name="all-decoded", shapes=[(100.0, 100.0, 1.0), (0.0, 0.0, 0.0)])
    assert p.gen_tokens == (0.0, 100.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mean_total": 200.0}, "LengthGroup.mean_total must be <= max_total 150.0 (no mean is above its maximum)"),
        ({"mean_gen": 120.0}, "LengthGroup.mean_gen must be <= mean_total 100.0 (decoded tokens are part of"),
        ({"max_gen": 151.0}, "LengthGroup.max_gen must be <= max_total 150.0 (no trajectory of the group is longer)"),
        ({"max_tool_gen": 400.0}, "LengthGroup.max_tool_gen must be <= max_total 150.0"),
    ],
)
def test_a_length_group_no_trajectories_can_make_is_refused(changes, message) -> None:
    with pytest.raises(SpecError) as err:
        LengthGroup(**{"count": 4, "mean_total": 100.0, "mean_gen": 50.0, "max_total": 150.0, **changes})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_mean_one_rounding_above_its_maximum_is_a_group() -> None:
    lengths = (0.1, 0.1, 0.1)
    mean = sum(lengths) / len(lengths)
    assert mean > 0.1  # floats: 0.30000000000000004 / 3
    group = LengthGroup(count=3, mean_total=mean, mean_gen=mean, max_total=0.1, max_gen=0.1)
    assert group.max_total == 0.1
    profile = WorkloadProfile(name="equal", total_lengths=lengths, gen_tokens=lengths)
    assert profile.groups(1)[0].mean_total == mean
