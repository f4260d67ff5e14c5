"""`libra plan` and `libra simulate` price the same rollout: a step's simulated rollout, less the weight broadcast
the asynchronous pipeline waits for before it (`StageRecord.switch_s`, which no plan changes and the planner's
makespan leaves out), is the plan's predicted rollout, on a step of one-token trajectories as on a normal step.
Before the simulator reported what it charges for moving the weights, a plan of 0.6 s met a simulated step of 14 s
on the tiny step, with nothing in either output to say why (docs/sim.md, "`libra plan` against `libra simulate`")."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_token_scenario, small_scenario

from libra.planning import GlobalPlanner
from libra.planning.cost import CostModel
from libra.planning.cost.switch import colocated_switch
from libra.sim import Scenario, simulate
from libra.sim.engine import profile_of, weight_sync_s
from libra.sim.report import plan_note, switch_note

# the simulated rollout less the weight broadcast against the plan's rollout (measured: +3.0 % on the tiny step,
# -0.9 % on the normal one)
TOLERANCE = 0.10


def _tiny(path: Path) -> Scenario:
    """The CLI's default cluster and model, one step of 88 trajectories of one prompt and one generated token: the
    plan puts them on 44 TP-1 instances, two each (a count that divides evenly: the planner spreads a step's
    requests as a fraction per instance, the simulator serves whole ones, which on a step this small is up to
    +50 % apart where the count does not divide; not what this test checks)."""
    return one_token_scenario(path)


def _plan_rollout_s(sc: Scenario) -> float:
    """The plan static-optimal runs (step 0's profile), as `libra plan` predicts its rollout."""
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    return planner.plan(profile_of([sc.source.step(0)], "step 0", sc.rl.global_batch)).rollout.time_s


@pytest.mark.parametrize("case", ["tiny", "normal"])
def test_the_simulated_rollout_less_the_weight_broadcast_is_the_planned_one(case, tmp_path) -> None:
    sc = _tiny(tmp_path / "tiny.jsonl") if case == "tiny" else small_scenario()
    result = simulate(sc, num_steps=1, policies=["static-optimal"], workers=1).results[0]
    rollout, drain = result.records
    sync = weight_sync_s(CostModel(sc.cluster, sc.model, sc.coeffs))
    assert rollout.switch_s == sync and drain.switch_s == 0.0  # the broadcast precedes a rollout, not training
    assert result.summary()["mean_switch_s"] == sync
    planned = _plan_rollout_s(sc)
    assert rollout.rollout_s - rollout.switch_s == pytest.approx(planned, rel=TOLERANCE), (rollout, planned)


def test_the_tiny_step_is_mostly_the_weight_broadcast(tmp_path) -> None:
    """Why the two outputs read 20-40x apart on a tiny step: the broadcast, not the work, is the simulated step."""
    sc = _tiny(tmp_path / "tiny.jsonl")
    rec = simulate(sc, num_steps=1, policies=["static-optimal"], workers=1).results[0].records[0]
    assert rec.switch_s > 0.9 * rec.rollout_s and rec.rollout_s > 10 * _plan_rollout_s(sc)


def test_colocated_reports_both_switches_of_its_step(tmp_path) -> None:
    sc = _tiny(tmp_path / "tiny.jsonl")
    result = simulate(sc, num_steps=1, policies=["colocated"], workers=1).results[0]
    (rec,) = result.records
    alloc = result.decisions[0]["allocation"]
    sw = colocated_switch(
        CostModel(sc.cluster, sc.model, sc.coeffs).coeffs,
        sc.model,
        sc.cluster.gpu,
        rollout_tp=max(g["tp"] for g in alloc["rollout"]),
        train_gpus=alloc["train"]["gpus"],
    )
    assert rec.switch_s == sw.per_step_s
    assert rec.rollout_s >= sw.to_rollout_s and rec.train_s >= sw.to_training_s  # inside the step's two sides


def test_each_output_says_what_its_step_includes(tmp_path) -> None:
    sc = _tiny(tmp_path / "tiny.jsonl")
    summary = simulate(sc, num_steps=1, policies=["colocated", "static-optimal", "libra"], workers=1).summary()
    sync = weight_sync_s(CostModel(sc.cluster, sc.model, sc.coeffs))
    note = switch_note(summary)
    assert note is not None and "\n" not in note
    assert (
        f"static-optimal, libra {sync:.1f} s a step" in note
        and f"colocated {summary['colocated']['mean_switch_s']:.1f} s" in note
    )
    assert "libra plan" in note
    assert switch_note({"p": {**summary["libra"], "mean_switch_s": 0.0}}) is None
    line = plan_note(CostModel(sc.cluster, sc.model, sc.coeffs))
    assert f"{sync:.1f} s" in line and "libra simulate" in line and "\n" not in line
