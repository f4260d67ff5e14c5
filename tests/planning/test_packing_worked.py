"""The node-packing search's parts (`libra.planning.packing`), checked where mutation testing found them unchecked
(`scripts/mutation.sh packing`, docs/testing.md): the packed rollout DP's buckets read back whole and in order, and
units of count 0 take no part in the packing condition."""

from __future__ import annotations

import math

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.packing import NodePacking, packs_into_nodes
from libra.spec import ClusterSpec, get_gpu
from tests.planning.test_packing import _odd_instance


def test_units_of_count_zero_are_no_part_of_the_chain() -> None:
    """A size listed with no unit neither breaks the divisibility chain nor binds (4 and 3 are no chain)."""
    assert packs_into_nodes([(4, 1), (3, 0), (2, 1)], 1, 6)
    assert not packs_into_nodes([(4, 1), (3, 0), (2, 2)], 1, 6)


def test_a_size_reaches_the_thresholds_up_to_it_and_packs_within_each_cap() -> None:
    """2 nodes of 7 GPUs, sizes 1, 2 and 4: sizes >= 2 hold at most 12 GPUs (3 pairs a node), sizes >= 4 at most 8."""
    cluster = ClusterSpec(gpu=get_gpu("A800-80GB"), num_nodes=2, gpus_per_node=7)
    p = NodePacking.for_sizes(cluster, (1, 2, 4), 14)
    assert p == NodePacking(thresholds=(2, 4), caps=(12, 8))
    assert [p.unit_class(size) for size in (1, 2, 4)] == [0, 1, 2]
    assert p.loads([(1, 3), (2, 2), (4, 1)]) == (8, 4)
    assert p.packs([(4, 2), (2, 2)]) and p.packs([(2, 6), (1, 2)])
    assert not p.packs([(4, 3)]) and not p.packs([(4, 2), (2, 3)])


def _packed_searches(seeds):
    """The packed searches of the odd-node instances whose unit sizes bind (`_packed_search` not None)."""
    for seed in seeds:
        cm, profile, rl, tps = _odd_instance(20_000 + seed)
        options = PlannerOptions(tp_degrees=tps, num_groups=3, fill_spare_gpus=False)
        planner = GlobalPlanner(cluster=cm.cluster, model=cm.model, rl=rl, coeffs=cm.coeffs, options=options)
        tab = planner.tables(profile, tps)
        packed = planner._packed_search(tab, cm.cluster.num_gpus)
        if packed is not None:
            yield packed


def test_packed_buckets_cover_the_groups_in_order_with_the_fewest_gpus_that_pack() -> None:
    """For every limit among the bucket times and every training side's loads: the buckets start at group 0, each
    begins where the one before stopped, the last stops at the last group, each finishes within the limit with its
    table time, their GPUs are the packed front's fewest, and they pack beside the training side. Beside no training,
    the fewest are the plain DP's where its buckets pack (and never fewer): the packed DP loses no plan."""
    checked = first_alone = plain_packs = 0
    for packed in _packed_searches(range(24)):
        rollout, packing = packed.rollout, packed.rollout.packing
        table = rollout.table
        sides = [(0,) * len(packing.thresholds), *{o[1] for o in packed.options(math.inf)}]
        for limit in table.candidates(0.0, math.inf)[::7].tolist():
            front, _ = rollout.front(table.min_counts(limit))
            plain, plain_buckets = table.min_gpus(limit)
            alone = rollout.fewest(front, sides[0])
            assert alone >= plain
            if math.isfinite(plain) and packing.packs((b.tp, b.count) for b in plain_buckets):
                assert alone == plain
                plain_packs += 1
            for reserved in sides:
                fewest = rollout.fewest(front, reserved)
                buckets = rollout.buckets(limit, reserved)
                if not math.isfinite(fewest):
                    assert buckets == []
                    continue
                assert [b.start for b in buckets] == [0, *(b.stop for b in buckets[:-1])]
                assert buckets[-1].stop == table.num_groups
                assert sum(b.tp * b.count for b in buckets) == fewest
                for b in buckets:
                    assert b.time_s == table.time(b.start, b.stop, b.tp, b.count) <= limit
                loads = packing.loads((b.tp, b.count) for b in buckets)
                assert all(a + r <= c for a, r, c in zip(loads, reserved, packing.caps, strict=True))
                checked += 1
                first_alone += len(buckets) > 1 and buckets[0].stop == 1
    assert checked >= 50 and first_alone >= 5 and plain_packs >= 20, (checked, first_alone, plain_packs)


def test_the_search_takes_the_plain_dps_buckets_beside_the_fewest_training_gpus_that_take_them() -> None:
    """`PackedSearch.choose`: where the plain DP's buckets fit the budget and pack beside some training option (at
    the budget and at a cap exactly included), the first such option with those buckets; else the first option
    the packed front fits within the budget, with its fewest GPUs; else None."""
    plain_taken = grid_taken = at_budget = at_cap = 0
    for packed in _packed_searches([*range(24), 122]):  # seed 122: the plain DP packs beside no option
        table, packing, budget = packed.rollout.table, packed.rollout.packing, packed.budget
        for limit in table.candidates(0.0, math.inf).tolist():
            options = sorted(o for o in packed.options(limit) if o[0] < budget)
            gpus, buckets = table.min_gpus(limit)
            loads = packing.loads((b.tp, b.count) for b in buckets)
            chosen = packed.choose(limit)
            plain = [
                o
                for o in options
                if o[0] + gpus <= budget and all(a + r <= c for a, r, c in zip(loads, o[1], packing.caps, strict=True))
            ]
            if plain:
                assert chosen == (plain[0], buckets)
                plain_taken += 1
                at_budget += plain[0][0] + gpus == budget
                at_cap += any(a + r == c for a, r, c in zip(loads, plain[0][1], packing.caps, strict=True))
                continue
            front, _ = packed.rollout.front(table.min_counts(limit))
            grid = [o for o in options if o[0] + packed.rollout.fewest(front, o[1]) <= budget]
            if not grid:
                assert chosen is None
                continue
            assert chosen is not None and chosen[0] == grid[0]
            assert sum(b.tp * b.count for b in chosen[1]) == packed.rollout.fewest(front, grid[0][1])
            grid_taken += 1
    assert plain_taken >= 20 and grid_taken >= 1 and at_budget >= 1 and at_cap >= 1, (plain_taken, grid_taken)
