"""Policies in worker processes give the same numbers as one process; groups keep the prefix-tree users together."""

import itertools
import json
import math

import pytest
from conftest import small_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.sim import POLICY_NAMES, simulate
from libra.sim import parallel as parallel_module
from libra.sim.parallel import fork_available, policy_groups
from libra.sim.policies import uses_shared_tree
from libra.spec import SpecError
from tests.limits import scaled


def _canonical(report) -> list[str]:
    # JSON, not attrs equality: a plan's predicted time may be nan, and nan != nan
    return [json.dumps(r.to_dict(), sort_keys=True) for r in report.results]


@pytest.mark.skipif(not fork_available(), reason="worker processes need the fork start method")
def test_parallel_run_equals_serial_run():
    serial = simulate(small_scenario(), num_steps=3, policies=POLICY_NAMES)
    seen: list[tuple[str, int]] = []
    parallel = simulate(
        small_scenario(), num_steps=3, policies=POLICY_NAMES, workers=2, progress=lambda p, s: seen.append((p, s))
    )
    assert [r.name for r in parallel.results] == list(POLICY_NAMES)
    assert _canonical(parallel) == _canonical(serial)
    assert sorted(seen) == sorted((p, s) for p in POLICY_NAMES for s in range(3))


def test_groups_cover_every_policy_once_and_keep_tree_users_together():
    for workers in (1, 2, 3, 8):
        groups = policy_groups(POLICY_NAMES, workers)
        assert len(groups) <= workers
        assert sorted(p for g in groups for p in g) == sorted(POLICY_NAMES)
        holding = [g for g in groups if any(uses_shared_tree(p) for p in g)]
        assert len(holding) == 1
    assert policy_groups(["colocated"], 2) == [["colocated"]]
    with pytest.raises(SpecError, match="workers must be >= 1"):
        policy_groups(POLICY_NAMES, 0)


def test_two_workers_balance_the_measured_costs():
    # the tree's work and the two costliest policies use it (parallel.py): three policies in that group, the five
    # cheaper ones in the other
    groups = policy_groups(POLICY_NAMES, 2)
    assert [len(g) for g in groups] == [3, 5]
    assert {"libra", "libra-cmlfq"} <= set(groups[0])
    assert all(g == [p for p in POLICY_NAMES if p in g] for g in groups)  # each in the order asked
    costs = [sum(parallel_module.POLICY_COST[p] for p in g) for g in groups]
    costs[0] += parallel_module.TREE_COST
    assert abs(costs[0] - costs[1]) <= min(parallel_module.POLICY_COST.values())  # no move would balance better


def _costliest(groups: list[list[str]]) -> float:
    tree = parallel_module.TREE_COST
    return max(sum(parallel_module._cost(p) for p in g) + tree * any(uses_shared_tree(p) for p in g) for g in groups)


@settings(max_examples=60, deadline=None)
@given(
    costs=st.lists(st.integers(1, 40), min_size=len(POLICY_NAMES), max_size=len(POLICY_NAMES)),
    tree=st.integers(0, 60),
    workers=st.integers(1, 4),
    size=st.integers(1, len(POLICY_NAMES)),
)
def test_the_split_is_the_best_of_every_way_to_place_the_policies(costs, tree, workers, size):
    """Brute force: every assignment of the policies that do not use the tree to `workers` groups, the tree's users
    together; the split's costliest group costs no more than the best of them (costs in quarters: exact sums)."""
    policies = list(POLICY_NAMES[:size])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel_module, "POLICY_COST", {p: c / 4 for p, c in zip(POLICY_NAMES, costs)})
        patch.setattr(parallel_module, "TREE_COST", tree / 4)
        groups = policy_groups(policies, workers)
        assert sorted(p for g in groups for p in g) == sorted(policies) and len(groups) <= workers
        tree_users = [p for p in policies if uses_shared_tree(p)]
        rest = [p for p in policies if not uses_shared_tree(p)]
        best = math.inf
        for where in itertools.product(range(workers), repeat=len(rest)):
            split = [list(tree_users) if g == 0 else [] for g in range(workers)]
            for p, g in zip(rest, where):
                split[g].append(p)
            best = min(best, _costliest([g for g in split if g]))
        assert _costliest(groups) == best


def test_many_policies_fall_back_to_costliest_first(monkeypatch):
    monkeypatch.setattr(parallel_module, "EXACT_SPLITS", 1)  # (every split is "too many" to try)
    groups = policy_groups(POLICY_NAMES, 2)
    assert sorted(p for g in groups for p in g) == sorted(POLICY_NAMES) and len(groups) == 2


def test_tree_users_are_the_cmlfq_policies_over_buckets():
    assert {p for p in POLICY_NAMES if uses_shared_tree(p)} == {"libra-cmlfq", "libra"}


def _die_in_group(group, progress):
    import os

    if group == ["b"]:
        os._exit(3)  # a worker killed without a word (the OOM killer, a signal)
    return group


@pytest.mark.skipif(not fork_available(), reason="worker processes need the fork start method")
@pytest.mark.timeout(scaled(60))  # before the fix the parent waited forever
def test_a_worker_that_dies_fails_the_run_instead_of_hanging():
    from libra.sim.parallel import run_groups

    with pytest.raises(RuntimeError, match=r"worker for b died \(exit code 3\)"):
        run_groups(_die_in_group, [["a"], ["b"]])
    assert run_groups(_die_in_group, [["a"], ["c"]]) == [["a"], ["c"]]


def _hugepage_state(group, progress):
    import numpy as np

    switch = np._core.multiarray._set_madvise_hugepage
    was = switch(False)  # returns the state before
    return was


@pytest.mark.skipif(not fork_available(), reason="worker processes need the fork start method")
def test_workers_ask_numpy_for_small_pages_and_the_parent_keeps_its_setting():
    import numpy as np

    from libra.sim.parallel import run_groups, small_pages

    switch = np._core.multiarray._set_madvise_hugepage
    before = switch(True)
    try:
        assert run_groups(_hugepage_state, [["a"]]) == [False]  # off in the worker before its group ran
        assert switch(True) is True  # the parent's is untouched
        assert small_pages() is True
        assert switch(True) is False
    finally:
        switch(before)


def _collector_state(group, progress):
    import gc

    return gc.isenabled()


@pytest.mark.skipif(not fork_available(), reason="worker processes need the fork start method")
def test_workers_run_without_the_cyclic_collectors_automatic_passes_and_the_parent_keeps_its_own():
    import gc

    from libra.sim.parallel import run_groups

    was = gc.isenabled()
    gc.enable()
    try:
        assert run_groups(_collector_state, [["a"], ["b"]]) == [False, False]
        assert gc.isenabled()  # the parent's is untouched
    finally:
        if not was:
            gc.disable()


def test_workers_freeze_their_long_lived_state_at_each_step_end_and_a_serial_run_does_not(monkeypatch):
    """`simulate(workers=2)` has each group's `_simulate` call `freeze_long_lived` once per step, after the tree
    learnt it; a run in the caller's own process never freezes it. (The groups run in this process here, so the
    count can be read.)"""
    import gc

    from libra.sim import simulator as simulator_module
    from libra.sim.parallel import freeze_long_lived

    calls: list[int] = []
    monkeypatch.setattr(simulator_module, "freeze_long_lived", lambda: calls.append(1))
    monkeypatch.setattr(
        simulator_module,
        "run_groups",
        lambda run_group, groups, progress: [run_group(g, lambda *a: None) for g in groups],
    )
    monkeypatch.setattr(simulator_module, "fork_available", lambda: True)
    policies = ["static-uniform", "libra-cmlfq"]
    simulate(small_scenario(), num_steps=3, policies=policies, workers=2)
    assert len(calls) == 3 * len(policy_groups(policies, 2)) == 6
    calls.clear()
    simulate(small_scenario(), num_steps=3, policies=policies)
    assert calls == []
    before = gc.get_freeze_count()
    try:
        kept = [[i] for i in range(100)]  # containers alive now
        freeze_long_lived()
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()
