"""The simulator's stages and its simple policies, checked against what each pipeline and decision says they do:
a stage lasts its rollout and its training as its pipeline composes them, clocks start at zero and run forward,
the elastic pool lends and borrows, workers that switched pay their way back, colocated rollout runs in its share
of GPU memory, and the greedy policy moves GPUs toward the slower side."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from conftest import policy_env, policy_run, small_scenario

from libra.planning.cost import CostModel
from libra.sim import (
    POLICY_NAMES,
    Decision,
    Observation,
    PolicyRun,
    SimOptions,
    make_policy,
    routes_for,
    simulate,
)
from libra.sim.engine import batch_stats, profile_of, weight_sync_s
from libra.sim.rollout import RolloutRun
from libra.sim.training import TrainingJob
from libra.spec import SpecError, TrainConfig

# search-r1 on 16 GPUs, 32 prompts x 4: `libra` borrows hybrid replicas in step 0 and lends idle instances in step 2
ELASTIC = {"workload": "search-r1", "gpus": 16, "prompts": 32}


def test_weights_reach_rollout_at_the_network_rate() -> None:
    sc = small_scenario()
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    rate = sc.cluster.gpu.network_bandwidth_gbs * 1e9 * cm.coeffs.link_efficiency  # bytes per second
    assert weight_sync_s(cm) == pytest.approx(sc.model.weight_bytes / rate, rel=1e-12)
    assert 0.1 < weight_sync_s(cm) < 60.0  # Qwen3-14B's 29 GB of bf16 weights over one node's network link


@pytest.fixture
def report():
    # (per test, not per module: a mutation tool attributes the code a shared fixture runs to one test only)
    return simulate(small_scenario(**ELASTIC), num_steps=4, policies=POLICY_NAMES)


def test_a_stage_lasts_as_its_pipeline_composes_rollout_and_training(report) -> None:
    for r in report.results:
        assert r.records[0].start == 0.0, r.name  # every clock starts at zero
        for x in r.records:
            span = x.end - x.start
            if r.name == "colocated":  # rollout, then training (its switch included) on the same GPUs
                assert span == pytest.approx(x.rollout_s + x.train_s, rel=1e-12), (r.name, x)
            else:  # rollout of step k beside training of step k - 1: the later of the two ends the stage
                assert span == pytest.approx(max(x.rollout_s, x.train_s), rel=1e-12), (r.name, x)
                assert (x.rollout_s > 0) == (x.trajectories > 0) and (x.train_s > 0) == x.trained


def test_the_training_only_last_stage_reports_no_rollout(report) -> None:
    for r in report.results:
        if r.name == "colocated":
            continue
        last = r.records[-1]
        assert last.trained and last.trajectories == 0
        assert (last.tokens, last.migrations, last.migrated_tokens, last.rebalanced_tokens) == (0, 0, 0, 0)
        assert last.rollout_s == 0.0 and last.decoded_tokens == 0.0


def test_a_stage_rollout_is_the_plain_event_loop_of_its_rollout() -> None:
    """For a policy without the elastic pool, the stage's rollout is its `RolloutRun` driven from one event to the
    next from the stage start, its instances ready once the weights are synchronised."""
    sc = small_scenario(**ELASTIC)
    for name in ("static-uniform", "libra-hetero-tp"):
        run, alone = policy_run(sc, name), policy_run(sc, name)
        work = sc.source.step(0)
        profile = profile_of([work], "p", sc.rl.global_batch)
        for r in (run, alone):
            r.decide(r.policy.initial(profile))
        alloc = run.begin_stage()
        alone.begin_stage()
        routes = routes_for(alloc.routing, work, alloc.buckets, None)
        roll = alone._rollout(work, routes, 0.0, weight_sync_s(alone.cm))
        assert np.all(roll.inst.ready_at == weight_sync_s(alone.cm))
        t = 0.0
        while not roll.done:
            dt = roll.next_event(t) - t
            roll.advance(t, dt)
            t += dt
        rec = run.stage(work, routes)
        assert rec.rollout_s == roll.elapsed_s == roll.end_time > 0.0, name


def test_colocated_rolls_out_in_its_share_of_gpu_memory() -> None:
    """verl's hybrid engine leaves the rollout `colocated_kv_fraction` of GPU memory: with less of it the rollout
    holds fewer requests at once and takes longer."""
    sc = small_scenario(workload="r2e-gym", gpus=16, prompts=64, samples=16)
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    seconds = {}
    for fraction in (0.3, 0.9):
        coeffs = cm.coeffs.replace(colocated_kv_fraction=fraction)
        rep = simulate(attrs.evolve(sc, coeffs=coeffs), num_steps=1, policies=["colocated"])
        seconds[fraction] = rep.results[0].records[0].rollout_s
    assert seconds[0.3] > 1.2 * seconds[0.9]  # 619 s against 414 s


def test_stuck_turns_moved_to_idle_instances_are_counted() -> None:
    """Work-conserving admission re-prefills stuck turns on idle instances; the stage's record carries the tokens."""
    sc = small_scenario(workload="r2e-gym", gpus=16, prompts=64, samples=16)
    (rec,) = simulate(sc, num_steps=1, policies=["colocated"]).results[0].records
    assert 0 < rec.rebalanced_tokens < rec.tokens


def test_libra_lends_idle_instances_and_borrows_hybrids_and_they_pay_their_way_back(report) -> None:
    libra = next(r for r in report.results if r.name == "libra")
    lent = [x.lent_gpu_s for x in libra.records]
    borrowed = [x.borrowed_gpu_s for x in libra.records]
    assert sum(lent) > 0 and sum(borrowed) > 0, (lent, borrowed)
    for r in report.results:  # only the elastic pool moves workers inside a stage
        if r.name != "libra":
            assert all(x.lent_gpu_s == 0 == x.borrowed_gpu_s for x in r.records), r.name


def test_instances_that_trained_last_stage_start_their_engines_again() -> None:
    """Rollout GPUs lent to training in the last stage (`restart_gpus`) start their engine again: their
    instances are ready `to_rollout_s` after the stage start; the others at once (the stage's clock: 0 at its
    start, whatever the run's clock)."""
    sc = small_scenario(**ELASTIC)
    run = policy_run(sc, "static-uniform")
    run.decide(run.policy.initial(profile_of([sc.source.step(0)], "p", sc.rl.global_batch)))
    alloc = run.begin_stage()
    (group,) = alloc.rollout
    run.restart_gpus = 2 * group.tp
    run.clock = 100.0
    inst = run._instances()
    assert len(inst) == group.count >= 3
    assert inst.ready_at.tolist() == [sc.costs.to_rollout_s] * 2 + [0.0] * (group.count - 2)
    assert run.restart_gpus == 0  # paid once
    assert run._instances().ready_at.tolist() == [0.0] * group.count


def _training_only(run: PolicyRun, sc, train: TrainConfig, *, rejoin: int) -> float:
    """A training-only stage of `run` on `train` after a rolled-out step, `rejoin` hybrid replicas to align again;
    its training seconds."""
    run.prev_batch = batch_stats(sc.source.step(0), sc.rl.max_model_len)
    run.rejoin = rejoin
    assert run.alloc is not None
    run.decide(Decision(step=1, allocation=attrs.evolve(run.alloc, train=train), reason="test"))
    run.begin_stage()
    return run.stage(None, None).train_s


def test_hybrid_replicas_back_from_rollout_align_before_they_train() -> None:
    """Hybrid replicas that served rollout in the last stage join the core again (`join_s` later), so the stage
    trains on the core alone until then; the next stage has nothing left to align."""
    sc = small_scenario(**ELASTIC)
    run = policy_run(sc, "libra")
    run.decide(run.policy.initial(profile_of([sc.source.step(0)], "p", sc.rl.global_batch)))
    run.begin_stage()
    assert run.alloc is not None
    train = run.alloc.train
    assert train.dp >= 2
    batch = batch_stats(sc.source.step(0), sc.rl.max_model_len)

    def job(replicas: int, joining: int) -> float:
        j = TrainingJob(run.cm, train, batch, start=0.0, replicas=replicas)
        j.clock = j.start
        if joining:
            j.join(sc.costs.join_s, joining)
        return j.run_to_end()

    assert _training_only(run, sc, train, rejoin=1) == pytest.approx(job(train.dp - 1, 1), rel=1e-12)
    assert run.rejoin == 0
    assert _training_only(run, sc, train, rejoin=0) == pytest.approx(job(train.dp, 0), rel=1e-12)
    # at most all but one replica: the core keeps training
    assert _training_only(run, sc, train, rejoin=train.dp + 3) == pytest.approx(job(1, train.dp - 1), rel=1e-12)
    assert job(train.dp - 1, 1) > job(train.dp, 0)


def test_a_training_layout_without_a_core_left_is_rebuilt() -> None:
    """Joining replicas of a larger layout plus hybrids still aligning leave no replica of the old core: the stage
    rebuilds training (`to_training_s`, all replicas from then on) instead of joining."""
    sc = small_scenario(**ELASTIC)
    run = policy_run(sc, "libra")
    run.decide(run.policy.initial(profile_of([sc.source.step(0)], "p", sc.rl.global_batch)))
    run.begin_stage()
    assert run.alloc is not None
    small = TrainConfig(num_gpus=4, tp=4, pp=1, dp=1)
    large = TrainConfig(num_gpus=8, tp=4, pp=1, dp=2)
    _training_only(run, sc, small, rejoin=0)
    seconds = _training_only(run, sc, large, rejoin=1)  # one joining, one aligning: none of the core left
    batch = batch_stats(sc.source.step(0), sc.rl.max_model_len)
    j = TrainingJob(run.cm, large, batch, start=sc.costs.to_training_s, replicas=2)
    j.clock = j.start
    assert seconds == pytest.approx(j.run_to_end(), rel=1e-12)


def _greedy(gpus: int = 32, **options):
    sc = small_scenario(gpus=gpus, prompts=16)
    env = policy_env(sc)
    policy = make_policy("greedy", env, **options)
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    first = policy.initial(profile)
    return policy, first, profile


def _obs(profile, rollout_s: float, train_s: float) -> Observation:
    return Observation(step=3, rollout_s=rollout_s, train_s=train_s, profile=lambda: profile)


def test_greedy_moves_gpus_toward_the_slower_side() -> None:
    policy, first, profile = _greedy()
    train0 = first.allocation.train.num_gpus
    assert train0 == 16
    slower_rollout = policy.after_step(_obs(profile, rollout_s=200.0, train_s=50.0))
    assert slower_rollout is not None and slower_rollout.step == 4
    assert slower_rollout.allocation.train.num_gpus == train0 - 8  # `move_gpus`: a node
    assert slower_rollout.allocation.rollout_gpus == 32 - (train0 - 8)
    assert "rollout slower" in slower_rollout.reason
    slower_training = policy.after_step(_obs(profile, rollout_s=10.0, train_s=50.0))
    assert slower_training is not None and slower_training.allocation.train.num_gpus == train0
    assert "training slower" in slower_training.reason


def test_greedy_keeps_a_balanced_split_and_waits_for_training() -> None:
    policy, _, profile = _greedy(threshold=0.2)
    assert policy.after_step(_obs(profile, rollout_s=110.0, train_s=100.0)) is None
    assert policy.after_step(_obs(profile, rollout_s=100.0, train_s=110.0)) is None
    assert policy.after_step(_obs(profile, rollout_s=100.0, train_s=0.0)) is None  # nothing trained yet
    moved = policy.after_step(_obs(profile, rollout_s=100.0, train_s=0.5))  # a short training step still counts
    assert moved is not None and "rollout slower" in moved.reason


def test_greedy_moves_to_the_nearest_gpu_count_that_has_a_training_layout() -> None:
    """With a move of 3 GPUs the first counts tried may have no training layout of exactly that many GPUs: greedy
    takes the nearest count beyond them that has one, at least the move away, never a layout of another count."""
    for rollout_s, train_s, direction in ((200.0, 50.0, -1), (10.0, 50.0, 1)):
        policy, first, profile = _greedy(move_gpus=3)
        before = first.allocation.train.num_gpus
        d = policy.after_step(_obs(profile, rollout_s=rollout_s, train_s=train_s))
        assert d is not None
        got = d.allocation.train.num_gpus
        assert direction * (got - before) >= 3
        assert policy.split(got, profile).train.num_gpus == got
        for count in range(before + 3 * direction, got, direction):  # the counts skipped had no exact layout
            try:
                skipped = policy.split(count, profile)
            except SpecError:
                continue
            assert skipped.train.num_gpus != count


def test_a_rollout_degree_may_fill_a_whole_node() -> None:
    sc = small_scenario(gpus=16)
    env = policy_env(sc)
    d = make_policy("colocated", env, tp=8).initial(profile_of([sc.source.step(0)], "p", sc.rl.global_batch))
    assert [(g.tp, g.count) for g in d.allocation.rollout] == [(8, 2)]
    with pytest.raises(SpecError, match="TP >= 16"):
        make_policy("static-uniform", env, tp=16).initial(profile_of([sc.source.step(0)], "p", sc.rl.global_batch))


def test_first_decisions_are_data_a_report_can_show(report) -> None:
    for r in report.results:
        first = r.decisions[0]
        assert first["step"] == 0, r.name
        assert isinstance(first["reason"], str) and first["reason"], r.name
        assert set(first["allocation"]) == {"train", "rollout", "routing", "predicted_s"}
        assert first["allocation"]["rollout"] and all(g["count"] >= 1 for g in first["allocation"]["rollout"])
    routing = {r.name: r.decisions[0]["allocation"]["routing"] for r in report.results}
    single = ("colocated", "static-uniform", "greedy", "libra-homogeneous")
    assert routing == {
        **dict.fromkeys(single, "single"),
        "static-optimal": "overflow",
        "libra-hetero-tp": "overflow",
        "libra-cmlfq": "cmlfq",
        "libra": "cmlfq",
    }


def test_a_policy_option_it_lacks_is_named_in_the_error() -> None:
    env = policy_env(small_scenario())
    with pytest.raises(SpecError, match=r"policy 'greedy'.*bogus"):
        make_policy("greedy", env, bogus=1)
    with pytest.raises(SpecError, match="admit must be"):
        make_policy("libra", env, admit="largest")
    assert make_policy("libra", env, admit="predicted").admit == "predicted"


def test_a_step_the_model_cannot_price_is_not_measured(monkeypatch) -> None:
    sc = small_scenario(**ELASTIC)
    env = policy_env(sc)
    policy = make_policy("libra", env)
    profile = profile_of([sc.source.step(0)], "p", sc.rl.global_batch)
    policy.initial(profile)
    monkeypatch.setattr(env.planner, "evaluate", lambda plan, prof: (1.0, math.inf))
    policy.after_step(_obs(profile, rollout_s=100.0, train_s=50.0))
    assert policy.ratios == {"single": [], "mixed": []}


def test_the_dispatch_option_reaches_the_rollout() -> None:
    sc = small_scenario(**ELASTIC)
    for dispatch in ("blocks", "interleaved"):
        s = attrs.evolve(sc, options=SimOptions(dispatch=dispatch))
        run = policy_run(s, "static-uniform")
        work = s.source.step(0)
        run.decide(run.policy.initial(profile_of([work], "p", s.rl.global_batch)))
        alloc = run.begin_stage()
        roll = run._rollout(work, routes_for(alloc.routing, work, alloc.buckets, None), 0.0, 0.0)
        assert isinstance(roll, RolloutRun) and roll.dispatch == dispatch


def test_the_planner_profile_keeps_each_trajectory_shape() -> None:
    sc = small_scenario(workload="r2e-gym")
    works = [sc.source.step(0), sc.source.step(1)]
    p = profile_of(works, "p", sc.rl.global_batch)
    shapes = sorted(
        (float(t), float(g), float(n))
        for w in works
        for t, g, n in zip(w.total_tokens, w.gen_tokens, w.num_turns, strict=True)
    )
    assert sorted(zip(p.total_lengths, p.gen_tokens, p.turns, strict=True)) == shapes
    assert max(p.turns) > 1  # many-turn: the turns are not a default of one
