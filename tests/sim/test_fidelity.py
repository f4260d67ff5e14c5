"""The time-slice approximation and the elastic pool, checked against finer runs and against the pool switched off."""

from pathlib import Path

import attrs
import pytest
from conftest import plan_vs_sim, small_scenario

from libra.planning.cost import CostModel, load_coefficients
from libra.sim import ReconfigCosts, WorkSource, simulate
from libra.sim.rollout import DONE, Instances, RolloutRun
from libra.sim.routing import CausalRouting, routes_for
from libra.spec import ClusterSpec, SpecError, get_gpu, get_model, parse_buckets


def test_default_slices_are_close_to_ten_times_finer():
    """The default 300 slices per rollout against 3,000 (measured here: 0.8 % slower; docs/sim.md)."""
    names = ["static-uniform", "libra-cmlfq"]
    coarse = simulate(small_scenario(slices=300, prompts=32, samples=16), num_steps=2, policies=names).summary()
    fine = simulate(small_scenario(slices=3000, prompts=32, samples=16), num_steps=2, policies=names).summary()
    for n in names:
        assert coarse[n]["throughput_tok_s"] == pytest.approx(fine[n]["throughput_tok_s"], rel=0.015)


FAST_TP = Path(__file__).resolve().parents[2] / "examples" / "coeffs" / "fast_tp.yaml"


@pytest.mark.parametrize(
    "buckets,instances,coeffs,steal,dispatch,tolerance",
    [
        # one bucket, 14 x TP-2: 4,418 s against 4,319 s (+2.3 %): moves of stuck turns are decided at boundaries
        ("2:inf", [(2, 0)] * 14, None, "all", "blocks", 0.03),
        # all admissions on two
        ("2:8825,4:19568,8:inf", [(2, 0), (2, 0), (4, 1), (8, 2)], FAST_TP, "all", "blocks", 0.02),
        # colocated's 24 x TP-2, dispatched as RL agent loops do
        ("2:inf", [(2, 0)] * 24, None, "off", "interleaved", 0.02),
    ],
)
def test_long_rollouts_do_not_lose_time_to_coarse_slices(buckets, instances, coeffs, steal, dispatch, tolerance):
    """A late r2e-gym step (8,192 requests, about 2,400-6,100 s of rollout) with the floor the default slicing gives
    it (a 300th of the rollout, 12-19 s) against 1-s slices. Slots that come free inside a slice are refilled as of
    when they came free; before that, the coarse floor lost 14-19 % here (docs/sim.md, fidelity notes)."""
    cm = CostModel(
        ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8),
        get_model("Qwen3-14B"),
        load_coefficients(coeffs) if coeffs else None,
    )
    work = WorkSource.from_generator(
        "r2e-gym", seed=0, num_prompts=512, samples_per_prompt=16, max_model_len=40960
    ).step(80)
    bks = parse_buckets(buckets)
    routes = routes_for("single" if len(bks) == 1 else "overflow", work, bks, None)
    ends = {}
    for floor in (1.0, 0.0):
        tps, home = zip(*instances, strict=True)
        run = RolloutRun(
            cm,
            work,
            routes,
            Instances(list(tps), list(home), [0.0] * len(tps)),
            start=0.0,
            min_slice_s=floor or ends[1.0] / 300,
            steal=steal,
            dispatch=dispatch,
        )
        run.run_to_end()
        assert (run.state == DONE).all()
        ends[floor] = run.end_time
    assert ends[1.0] > 2000  # a long rollout (about 2,400-4,400 s with the anchored defaults), where slicing matters
    assert ends[0.0] == pytest.approx(ends[1.0], rel=tolerance)


def test_elastic_pool_only_lends_and_borrows_when_on():
    sc = small_scenario(gpus=16, prompts=16)  # with the anchored cost model 32 GPUs x 32 prompts leave none idle
    report = simulate(sc, num_steps=4, policies=["libra-cmlfq", "libra"]).summary()
    assert report["libra-cmlfq"]["lent_gpu_s"] == 0 and report["libra-cmlfq"]["borrowed_gpu_s"] == 0
    # free switches: the pool can only help (the same plans, the same routes, idle GPUs put to work)
    free = attrs.evolve(sc, costs=ReconfigCosts(to_rollout_s=0.0, snapshot_s=0.0, restore_s=0.0, channel_setup_s=0.0))
    both = simulate(free, num_steps=4, policies=["libra-cmlfq", "libra"]).summary()
    assert both["libra"]["lent_gpu_s"] + both["libra"]["borrowed_gpu_s"] > 0
    assert both["libra"]["wall_s"] <= both["libra-cmlfq"]["wall_s"] * 1.001


def test_causal_routing_never_reads_the_future():
    sc = small_scenario()
    routing = CausalRouting()
    w0, w1 = sc.source.step(0), sc.source.step(1)
    buckets = parse_buckets("1:2000,2:8000,4:inf")
    routing.routes(w0, buckets)
    routing.learn(w0)
    with pytest.raises(SpecError, match="future"):
        routing.routes(w0, buckets)
    with pytest.raises(SpecError, match="already learned"):
        routing.learn(w0)
    r1 = routing.routes(w1, buckets)
    assert r1.bucket.min() >= 0 and r1.bucket.max() < len(buckets)


@pytest.mark.parametrize("workload", ["r2e-gym", "search-r1", "dapo-math"])
def test_the_planner_predicts_what_the_simulator_runs(workload):
    """The planner's default step-0 plan and colocated's instances, 512 x 16 requests: predicted and simulated
    rollout agree within 15 % (measured: -11 % to +8 %; examples/plan_vs_sim.py prints the docs/sim.md table)."""
    rows = plan_vs_sim().agreements(workload, routings=("start-small",))
    assert [a.routing for a in rows] == ["start-small", "colocated"]
    for a in rows:
        assert abs(a.error) <= 0.15, (a.routing, a.layout, a.predicted_s, a.simulated_s)


@pytest.mark.parametrize(
    "source", ["tora-70b-gsm8k", "held-out/webdancer-sft-sample", "held-out/fireact-llama2-13b-hotpotqa"]
)
def test_the_planner_predicts_what_the_simulator_runs_on_real_agents(source):
    """One step of a real source's own batch (short runs: a step of 25-90 s, where one slow tool call sets the
    tail): predicted and simulated rollout agree within 10 % (measured on all eleven sources: -1 % to +6 %; before
    the planner priced each request's own tool seconds, the most turns at the mean call: +31 % to +94 %)."""
    from libra.workloads.corpus import DEFAULT_CORPUS

    trace = DEFAULT_CORPUS / f"{source}.jsonl.gz"
    rows = plan_vs_sim().agreements(source, prompts=None, routings=("start-small",), trace=trace)
    assert [a.routing for a in rows] == ["start-small", "colocated"]
    for a in rows:
        assert abs(a.error) <= 0.10, (a.routing, a.layout, a.predicted_s, a.simulated_s)
