"""A run's summary (`PolicyResult.summary`) and what its plots draw, worked out by hand on three stages of an
asynchronous run, and on runs with nothing rolled out; and the routes of a step when the caller names no admission
rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import small_scenario

from libra.sim import CausalRouting, PolicyResult, SimReport, StageRecord, overflow_routes, routes_for
from libra.sim.report import breakdown_series, gpu_series, throughput_series
from libra.spec import Bucket


def _stage(step: int, start: float, end: float, **fields) -> StageRecord:
    base: dict[str, Any] = dict(
        rollout_s=0.0, train_s=0.0, train_gpus=8, rollout_gpus=8, lent_gpu_s=0.0, borrowed_gpu_s=0.0,
        busy_gpu_s=0.0, available_gpu_s=16 * (end - start), tokens=0, gen_tokens=0, trajectories=0, migrations=0,
        migrated_tokens=0, rebalanced_tokens=0, reconfiguration_s=0.0, staleness=1, trained=False,
    )  # fmt: skip
    base.update(fields)
    return StageRecord(step=step, start=start, end=end, **base)


def _run() -> PolicyResult:
    """Rollout of step 0 (100 s), rollout of step 1 beside training of step 0 (a 150 s stage), training of step 1
    (50 s); a reconfiguration decided for step 1."""
    records = (
        _stage(0, 0.0, 100.0, rollout_s=100.0, busy_gpu_s=800.0, tokens=10_000, gen_tokens=6_000, trajectories=64,
               migrations=4, migrated_tokens=500, rebalanced_tokens=100, decoded_tokens=6_000.0,
               decode_capacity_tokens=12_000.0, switch_s=13.5),
        _stage(1, 100.0, 250.0, rollout_s=150.0, train_s=120.0, busy_gpu_s=1_800.0, tokens=20_000, gen_tokens=12_000,
               trajectories=64, migrations=6, migrated_tokens=1_500, rebalanced_tokens=300, staleness=1, trained=True,
               reconfiguration_s=10.8, lent_gpu_s=40.0, decoded_tokens=12_000.0, decode_capacity_tokens=18_000.0,
               switch_s=12.5),
        _stage(2, 250.0, 300.0, train_s=50.0, busy_gpu_s=400.0, staleness=1, trained=True, borrowed_gpu_s=25.0),
    )  # fmt: skip
    decisions = ({"step": 0, "reason": "initial"}, {"step": 1, "reason": "replan"})
    return PolicyResult(name="p", records=records, decisions=decisions, num_gpus=16)


def test_the_summary_of_a_run_worked_by_hand() -> None:
    s = _run().summary()
    assert s == {
        "throughput_tok_s": 30_000 / 300.0,
        "steady_throughput_tok_s": 20_000 / 150.0,  # step 1 only: the fill and the drain left out
        "gen_throughput_tok_s": 18_000 / 300.0,
        "mean_step_s": 300.0 / 2,
        "gpu_idle_fraction": pytest.approx(1.0 - 3_000.0 / (16 * 300.0)),
        "reconfigurations": 1,
        "migrations": 10,
        "migrated_token_fraction": 2_000 / 30_000,
        "rebalanced_token_fraction": 400 / 30_000,
        "staleness": 1.0,
        "utilisation": 18_000.0 / 30_000.0,
        "mean_rollout_s": 125.0,
        "mean_train_s": 85.0,
        "mean_switch_s": 13.0,  # over the steps that rolled out: the drain moves no weights
        "reconfiguration_s": 10.8,
        "lent_gpu_s": 40.0,
        "borrowed_gpu_s": 25.0,
        "steps": 2,
        "wall_s": 300.0,
        "tokens": 30_000,
    }


def test_a_synchronous_run_is_on_policy() -> None:
    run = _run()
    records = tuple(_stage(x.step, x.start, x.end, **{**_fields(x), "staleness": 0}) for x in run.records)
    s = PolicyResult(name="colocated", records=records, decisions=run.decisions, num_gpus=16).summary()
    assert s["staleness"] == 0.0 and s["mean_train_s"] == 85.0


def _fields(x: StageRecord) -> dict:
    d = x.to_dict()
    for key in ("step", "start", "end"):
        d.pop(key)
    return d


def test_a_run_with_nothing_rolled_out_or_trained_sums_to_zeros() -> None:
    idle = PolicyResult(name="p", records=(_stage(0, 0.0, 10.0),), decisions=({"step": 0},), num_gpus=16)
    s = idle.summary()
    assert s["tokens"] == 0 and s["steps"] == 0
    assert s["migrated_token_fraction"] == s["rebalanced_token_fraction"] == 0.0
    assert s["staleness"] == s["mean_train_s"] == s["mean_rollout_s"] == s["mean_switch_s"] == 0.0
    assert s["steady_throughput_tok_s"] is None and s["gpu_idle_fraction"] == 1.0
    empty = PolicyResult(name="p", records=(), decisions=(), num_gpus=16).summary()
    assert empty["wall_s"] == 0.0 and empty["throughput_tok_s"] == 0.0 and empty["reconfigurations"] == 0


def test_cmlfq_routes_admit_to_the_smallest_bucket_unless_told() -> None:
    sc = small_scenario(workload="search-r1")
    buckets = (Bucket(tp=1, max_tokens=2000.0), Bucket(tp=2, max_tokens=float("inf")))
    work = sc.source.step(0)
    default = routes_for("cmlfq", work, buckets, CausalRouting())
    smallest = routes_for("cmlfq", work, buckets, CausalRouting(), admit="smallest")
    assert np.array_equal(default.bucket, smallest.bucket) and np.array_equal(default.carried, smallest.carried)
    assert (default.bucket[:, 0] == 0).all()  # the published rule: every request starts in the smallest bucket


def test_the_plots_draw_each_stage_throughput_and_the_gpus_each_side_held() -> None:
    run = _run()
    assert throughput_series(run) == ([0, 1], [10_000 / 100.0, 20_000 / 150.0])  # the drain rolled nothing out
    steps, train, roll = gpu_series(run)
    assert steps == [0, 1, 2]
    # stage 1 lent 40 GPU-seconds over 150 s to training; stage 2 borrowed 25 over 50 s back to rollout
    assert train == [8.0, 8.0 + 40.0 / 150.0, 8.0 - 25.0 / 50.0]
    assert roll == [8.0, 8.0 - 40.0 / 150.0, 8.0 + 25.0 / 50.0]
    instant = PolicyResult(
        name="p", records=(_stage(0, 5.0, 5.0, trajectories=1, tokens=10),), decisions=(), num_gpus=16
    )
    assert throughput_series(instant) == ([0], [0.0]) and gpu_series(instant)[1] == [8.0]  # a stage of no time


def test_the_breakdown_plot_draws_each_policy_mean_times() -> None:
    run = _run()
    report = SimReport(workload="w", num_gpus=16, num_steps=2, seed=0, results=(run,), elapsed_s=0.0)
    assert breakdown_series(report) == {
        "policy": ["p"],
        "rollout": [125.0],
        "training": [85.0],
        "steady stage (wall)": [150.0],  # stage 1 alone: the fill (stage 0) and the drain (stage 2) left out
        "run wall / steps": [150.0],  # mean_step_s: 300 s of wall time over 2 steps
    }


def test_overflow_routes_over_one_bucket_move_nothing() -> None:
    work = small_scenario(workload="search-r1").source.step(0)
    routes = overflow_routes(work, (Bucket(tp=2, max_tokens=float("inf")),))
    assert routes.bucket.shape == routes.carried.shape == work.gen.shape
    assert not routes.bucket.any() and routes.migrations == 0
