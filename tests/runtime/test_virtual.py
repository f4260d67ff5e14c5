"""The virtual cluster: the planner's decisions for the run, and their mapping onto engines (no engine starts).

The trajectories here are synthetic (built in the test), shaped like the embedded job's before and after its tool
outputs grow."""

from __future__ import annotations

import math
import random

import attrs

from libra.planning import ReplanGate
from libra.planning.placement import place
from libra.runtime import RunConfig, virtual
from libra.spec import Role
from libra.workloads.trace import Trajectory, Turn


def _trajectories(growth: int, seed: int = 0) -> list[Trajectory]:
    rnd = random.Random(seed)
    out = []
    for i in range(16):
        n = rnd.randint(2, 4)
        turns = [
            Turn(gen_tokens=12, tool="calculator", tool_status="ok", tool_tokens=min(160, rnd.randint(8, 20) * growth))
            for _ in range(n - 1)
        ]
        out.append(Trajectory(prompt_id=f"p{i % 4}", prompt_tokens=5, turns=(*turns, Turn(gen_tokens=12))))
    return out


def test_growth_of_tool_outputs_triggers_an_applied_replan_that_changes_the_pool() -> None:
    cfg = RunConfig()
    planner, cluster = virtual.virtual_planner(cfg), virtual.virtual_cluster(cfg)
    plan = planner.plan(virtual.prior_profile(cfg, [5, 6, 6, 5]))
    gate = ReplanGate(nonblocking_join=True)
    same, decision = virtual.replan_rollout(
        planner, plan, virtual.scaled_profile(_trajectories(1), cfg, name="before"), gate, 10
    )
    assert not decision.apply and virtual.mix(same) == virtual.mix(plan)
    grown, decision = virtual.replan_rollout(
        planner, plan, virtual.scaled_profile(_trajectories(6), cfg, name="after"), gate, 10
    )
    assert decision.apply and virtual.mix(grown) != virtual.mix(plan)
    assert grown.train == plan.train  # the core training pool is kept
    before, after = place(plan, cluster), place(grown, cluster, current=place(plan, cluster))
    assert [w for w in before.workers if w.role == Role.TRAIN_REPLICA] == [
        w for w in after.workers if w.role == Role.TRAIN_REPLICA
    ]
    specs = virtual.instance_specs(after, cfg)
    assert sorted(s.tp for s in specs.values()) == sorted(tp for tp, n in virtual.mix(grown) for _ in range(n))
    assert all(s.max_num_seqs == cfg.engine.seqs_per_tp * s.tp for s in specs.values())


def test_buckets_map_to_the_instances_of_their_group() -> None:
    cfg = attrs.evolve(RunConfig(), virtual=attrs.evolve(RunConfig().virtual, gpus=8, gpus_per_node=8, token_scale=16))
    planner, cluster = virtual.virtual_planner(cfg), virtual.virtual_cluster(cfg)
    plan, _ = virtual.replan_rollout(
        planner,
        planner.plan(virtual.prior_profile(cfg, [5, 6, 6, 5])),
        virtual.scaled_profile(_trajectories(6), cfg, name="x"),
        ReplanGate(),
        10,
    )
    placement = place(plan, cluster)
    mapping = virtual.bucket_instances(plan, placement)
    groups = sorted(plan.rollout.instances, key=lambda g: g.max_tokens)
    assert [len(mapping[k]) for k in range(len(groups))] == [g.count for g in groups]
    tps = {w.name: w.tp for w in placement.workers}
    assert all(tps[n] == groups[k].tp for k, names in mapping.items() for n in names)
    limits = [b.max_tokens for b in virtual.real_buckets(plan, cfg)]
    assert math.isinf(limits[-1]) and all(a < b for a, b in zip(limits, limits[1:]))
