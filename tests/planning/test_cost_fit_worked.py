"""`calibrate()` and `libra profile`'s fit worked out by hand (scripts/mutation.sh cost_fit).

The tests of test_cost.py and test_cost_profile_fit.py recover known coefficients from points the same code
predicted, so a change to the optimizer's steps (it still converges, a little later), to the search space's maps
or to what a measured point predicts (the points move with it) passes them. Here the simplex search is traced by
hand, point by point; a fit that starts at the truth must stay there, exactly; and each kind of point predicts the
sum of the cost model's terms that its docstring names."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.cost.calibrate import (
    RolloutMeasurement,
    TrainingMeasurement,
    _nelder_mead,
    calibrate,
    mape,
)
from libra.planning.cost.profile_fit import (
    DecodeStep,
    Prefill,
    RequestBurst,
    TrainStep,
    _split,
    fit_profile,
    model_from_hf_config,
)
from libra.spec import ClusterSpec, SpecError, get_gpu, get_model

GPU = get_gpu("A800-80GB")
CLUSTER = ClusterSpec.from_total(gpu=GPU, num_gpus=8, gpus_per_node=8)
MODEL = get_model("Qwen3-4B")


class Traced:
    """f(x) from a table of points (100 elsewhere), with every point it was asked for."""

    def __init__(self, table: dict) -> None:
        self.table, self.calls = table, []

    def __call__(self, x: np.ndarray) -> float:
        v = tuple(float(c) for c in x)
        self.calls.append(v[0] if len(v) == 1 else v)
        for k, y in self.table.items():
            key = k if isinstance(k, tuple) else (k,)
            if all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(key, v, strict=True)):
                return y
        return 100.0


def test_the_simplex_search_reflects_expands_and_contracts_as_traced_by_hand():
    """f(x) = (x - 1)^2 from x = 0 with a step of 0.3. Iteration 1: reflect 0.6 (0.16 beats the best, 0.49), expand
    0.9 (0.01, kept). 2: reflect 1.5 (0.25, worse than both): contract halfway to the worst, 0.6. 3: reflect 1.2,
    contract 0.75. 4: reflect 1.05 (0.0025 beats 0.01), expand 1.2 (0.04, not kept): the reflection is."""
    calls: list[float] = []

    def quad(x: np.ndarray) -> float:
        calls.append(float(x[0]))
        return (float(x[0]) - 1.0) ** 2

    x, it = _nelder_mead(quad, np.array([0.0]), iterations=4)
    assert calls == pytest.approx([0.0, 0.3, 0.6, 0.9, 1.5, 0.6, 1.2, 0.75, 1.05, 1.2])
    assert (float(x[0]), it) == (pytest.approx(1.05), 4)


def test_the_simplex_shrinks_towards_its_best_point_when_contracting_fails():
    """From 1 (f 1) and 1.3 (f 2): reflect 0.7 (3) and contract 1.15 (5) both fail, so the simplex shrinks to
    (1, 1.15), 1.15 evaluated again; then reflect 0.85 (1.5) is no better than the best (1): contract to 1.075."""
    f = Traced({1.0: 1.0, 1.3: 2.0, 0.7: 3.0, 1.15: 5.0, 0.85: 1.5, 1.075: 0.5})
    x, it = _nelder_mead(f, np.array([1.0]), iterations=2)
    assert f.calls == pytest.approx([1.0, 1.3, 0.7, 1.15, 1.15, 0.85, 1.075])
    assert (float(x[0]), it) == (pytest.approx(1.075), 2)


def test_ties_go_the_cautious_way():
    """A reflection only as good as the best is not expanded, nor kept over the second best: it contracts; an
    expansion only as good as the reflection is not taken; a contraction only as good as the worst shrinks."""
    f = Traced({0.0: 1.0, 0.3: 2.0, -0.3: 1.0, 0.15: 2.0})
    _nelder_mead(f, np.array([0.0]), iterations=1)
    assert f.calls == pytest.approx([0.0, 0.3, -0.3, 0.15, 0.15])  # reflect, contract (a tie with the worst), shrink
    g = Traced({0.0: 1.0, 0.3: 2.0, -0.3: 0.5, -0.6: 0.5})
    x, _ = _nelder_mead(g, np.array([0.0]), iterations=1)
    assert g.calls == pytest.approx([0.0, 0.3, -0.3, -0.6]) and float(x[0]) == pytest.approx(-0.3)


def test_in_two_dimensions_the_worst_point_decides_contraction_and_stopping():
    """(0,0) 1, (0.3,0) 2, (0,0.3) 3: the centroid of the best two is (0.15,0); reflect (0.3,-0.3) (4) fails;
    contract to (0.075,0.15) (2.5): better than the worst, kept (a shrink would evaluate two more points)."""
    f = Traced({(0.0, 0.0): 1.0, (0.3, 0.0): 2.0, (0.0, 0.3): 3.0, (0.3, -0.3): 4.0, (0.075, 0.15): 2.5})
    _nelder_mead(f, np.array([0.0, 0.0]), iterations=1)
    assert f.calls == [pytest.approx(c) for c in [(0, 0), (0.3, 0), (0, 0.3), (0.3, -0.3), (0.075, 0.15)]]
    g = Traced({(0.0, 0.0): 1.0, (0.3, 0.0): 1.0, (0.0, 0.3): 5.0})  # the best two tie, the worst does not
    _nelder_mead(g, np.array([0.0, 0.0]), iterations=1)
    assert len(g.calls) > 3  # not stopped: the simplex's values are 4 apart


def test_the_simplex_stops_once_its_values_are_closer_than_the_tolerance_and_not_before():
    flat = Traced({0.0: 1.0, 0.3: 1.0})
    x, it = _nelder_mead(flat, np.array([0.0]), iterations=50)
    assert (flat.calls, float(x[0]), it) == ([0.0, 0.3], 0.0, 1)  # stopped at once: the values are equal
    edge = Traced({0.0: 0.0, 0.3: 1e-10})  # exactly the tolerance apart: not closer, so it goes on
    _nelder_mead(edge, np.array([0.0]), iterations=1)
    assert len(edge.calls) > 2
    none = Traced({})
    x, it = _nelder_mead(none, np.array([0.5]), iterations=0)
    assert (float(x[0]), it) == (0.5, 0)  # no iteration: the best of the first simplex, the start on a tie


def _rollout_points(coeffs: CostCoefficients) -> list[RolloutMeasurement]:
    cm = CostModel(CLUSTER, MODEL, coeffs)
    out = []
    for tp, n in ((1, 16), (2, 64), (4, 256)):
        m = RolloutMeasurement(
            tp=tp,
            num_requests=n,
            decode_tokens=n * 900.0,
            prefill_tokens=n * 300.0,
            resident_context=700.0,
            max_gen=1500.0,
            time_s=1.0,
        )
        out.append(attrs.evolve(m, time_s=m.predict(cm)))
    return out


def test_a_fit_that_starts_at_the_truth_stays_there_exactly():
    """Points the start predicts exactly: the start is the search's best point (loss 0), so a search of no
    iterations returns it, through the log and logit maps and back."""
    truth = CostCoefficients(hbm_efficiency=0.62, decode_mfu=0.3, per_request_overhead_s=0.05, step_overhead_s=0.004)
    points = _rollout_points(truth)
    fit = ("hbm_efficiency", "decode_mfu", "per_request_overhead_s", "step_overhead_s")
    result = calibrate(CLUSTER, MODEL, points, fit=fit, start=truth, iterations=0)
    assert result.iterations == 0
    for name in fit:
        assert getattr(result.coeffs, name) == pytest.approx(getattr(truth, name), rel=1e-12), name
    assert result.mape_before == pytest.approx(0.0, abs=1e-9) and result.mape_after == pytest.approx(0.0, abs=1e-9)
    assert result.errors == pytest.approx([0.0] * 3, abs=1e-12)


def test_a_fit_reports_its_error_before_at_the_start_and_after_at_the_result():
    truth = CostCoefficients(hbm_efficiency=0.62, per_request_overhead_s=0.05)
    points = _rollout_points(truth)
    start = CostCoefficients(hbm_efficiency=0.3, per_request_overhead_s=0.05)
    result = calibrate(CLUSTER, MODEL, points, fit=("hbm_efficiency",), start=start, iterations=400)
    assert result.mape_before == pytest.approx(mape(CostModel(CLUSTER, MODEL, start), points))
    assert result.mape_before > 10.0 and result.mape_after < 0.01
    assert result.coeffs.hbm_efficiency == pytest.approx(0.62, rel=1e-4)
    assert result.coeffs.per_request_overhead_s == 0.05  # not fitted: as in `start`
    assert 0 < result.iterations < 400  # stopped by the tolerance
    assert result.errors == pytest.approx(
        [m.predict(CostModel(CLUSTER, MODEL, result.coeffs)) / m.time_s - 1.0 for m in points]
    )


def test_an_efficiency_stays_a_fraction_and_an_overhead_stays_positive_however_far_the_search_goes():
    """A point that no efficiency in (0, 1) reaches: the fit runs to the boundary but never past it."""
    point = _rollout_points(CostCoefficients())[0]
    fast = attrs.evolve(point, time_s=point.time_s * 1e-3)
    result = calibrate(CLUSTER, MODEL, [fast], fit=("hbm_efficiency", "step_overhead_s"), iterations=300)
    assert 0.0 < result.coeffs.hbm_efficiency <= 1.0
    assert result.coeffs.step_overhead_s > 0.0


def test_unknown_coefficients_are_named_with_the_known_ones():
    with pytest.raises(SpecError) as e:
        calibrate(CLUSTER, MODEL, _rollout_points(CostCoefficients()), fit=("warp", "hbm_efficiency", "flux"))
    known = ", ".join(sorted(a.name for a in attrs.fields(CostCoefficients)))
    assert str(e.value) == f"cannot fit unknown coefficient(s) warp, flux; known: {known}"
    with pytest.raises(SpecError, match=r"^calibrate needs at least one measurement$"):
        calibrate(CLUSTER, MODEL, [])


def test_each_kind_of_point_predicts_the_terms_its_docstring_names():
    cm = CostModel(ClusterSpec.from_total(gpu=GPU, num_gpus=4, gpus_per_node=4), MODEL, CostCoefficients())
    r = cm.rollout
    assert DecodeStep(batch=8, context=1000.0, time_s=1.0, tp=2).predict(cm) == r.decode_step_time(2, 8.0, 1000.0)
    # time to the first token: the prefill at half the prompt's context, then one engine step's overhead
    assert Prefill(tokens=512.0, time_s=1.0, tp=2).predict(cm) == pytest.approx(
        r.prefill_time(2, 512.0, 256.0) + cm.coeffs.step_overhead_s
    )
    # a burst: each request's overhead, all prompts prefilled together, one decode step of all of them
    burst = RequestBurst(requests=16, prompt_tokens=40.0, time_s=1.0, tp=2)
    assert burst.predict(cm) == pytest.approx(
        16 * cm.coeffs.per_request_overhead_s + r.prefill_time(2, 640.0, 20.0) + r.decode_step_time(2, 16.0, 40.0)
    )
    step = TrainStep(seq_len=2048, micro_batch=4, time_s=3.0).measurement()
    assert (step.tp, step.pp, step.dp, step.micro_batch, step.time_s) == (1, 1, 1, 4, 3.0)
    assert step.batch == BatchStats.uniform(num_sequences=4, length=2048)
    recompute = TrainingMeasurement(tp=1, pp=1, dp=1, batch=step.batch, micro_batch=4, recompute=True, time_s=1.0)
    assert recompute.predict(cm) == cm.training.step_time(1, 1, 1, 1, 4, True, step.batch) > step.predict(cm)


def test_held_out_points_are_every_third_and_none_below_three():
    assert _split(list(range(7)), 3) == ([0, 1, 3, 4, 6], [2, 5])
    assert _split([0, 1], 3) == ([0, 1], [])
    assert _split(list(range(5)), 1) == (list(range(5)), [])
    assert _split(list(range(6)), 2) == ([0, 2, 4], [1, 3, 5])


def test_a_profile_fit_of_one_group_leaves_the_others_as_they_were():
    cm = CostModel(ClusterSpec.from_total(gpu=GPU, num_gpus=1, gpus_per_node=1), MODEL, CostCoefficients())
    slow = [Prefill(tokens=float(n), time_s=1.0) for n in (256, 1024, 4096)]
    prefill = [attrs.evolve(p, time_s=1.3 * p.predict(cm)) for p in slow]  # 30 % slower than the defaults say
    fit = fit_profile(GPU, MODEL, prefill=prefill)
    (group,) = fit.groups
    assert (group.kind, group.points, group.held_out) == ("prefill", 3, 1)
    assert set(fit.changed()) == {"prefill_mfu"} and fit.coeffs.prefill_mfu < CostCoefficients().prefill_mfu
    assert attrs_equal_except(fit.coeffs, CostCoefficients(), "prefill_mfu")


def attrs_equal_except(a: CostCoefficients, b: CostCoefficients, name: str) -> bool:
    return all(getattr(a, f.name) == getattr(b, f.name) for f in attrs.fields(CostCoefficients) if f.name != name)


def test_a_dense_config_with_grouped_query_attention_and_tied_embeddings():
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 48,  # given: not hidden / heads
        "intermediate_size": 640,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
        "num_experts_per_tok": 4,  # read only for an MoE model
    }
    m = model_from_hf_config(config, name="dense")
    assert attrs.asdict(m) == {
        "name": "dense",
        "num_layers": 4,
        "hidden_size": 256,
        "num_heads": 8,
        "num_kv_heads": 2,
        "head_dim": 48,
        "ffn_hidden_size": 640,
        "vocab_size": 1000,
        "num_experts": 1,
        "experts_per_token": 1,
        "moe_ffn_hidden_size": None,
        "dtype_bytes": 2,
        "tie_embeddings": True,
    }


def test_a_config_without_the_optional_keys_takes_their_defaults():
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 96,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 320,
        "num_key_value_heads": None,  # null in some exports: as absent
    }
    m = model_from_hf_config(config, name="bare")
    assert (m.num_kv_heads, m.head_dim, m.tie_embeddings, m.num_experts) == (4, 24, False, 1)


@pytest.mark.parametrize("key", ["num_experts", "num_local_experts"])
def test_an_moe_config_by_either_name_of_its_expert_count(key):
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "moe_intermediate_size": 96,
        "vocab_size": 320,
        key: 2,
        "num_experts_per_tok": 2,
    }
    m = model_from_hf_config(config, name="moe")
    assert (m.num_experts, m.experts_per_token, m.moe_ffn_hidden_size, m.is_moe) == (2, 2, 96, True)
    del config["num_experts_per_tok"]
    assert model_from_hf_config(config, name="moe").experts_per_token == 1


def _percent_error(cm: CostModel, points) -> float:
    """The mean of |predicted / measured - 1|, in percent."""
    return 100.0 * sum(abs(p.predict(cm) / p.time_s - 1.0) for p in points) / len(points)


def test_a_whole_profile_fit_names_its_groups_reports_held_out_errors_and_starts_where_asked():
    cm = CostModel(ClusterSpec.from_total(gpu=GPU, num_gpus=1, gpus_per_node=1), MODEL, CostCoefficients())
    decode = [DecodeStep(batch=b, context=c, time_s=1.0) for c in (512.0, 4096.0) for b in (1, 16, 64)]
    decode = [attrs.evolve(d, time_s=1.2 * d.predict(cm)) for d in decode]
    prefill = [
        attrs.evolve(p, time_s=p.predict(cm)) for p in (Prefill(tokens=float(n), time_s=1.0) for n in (256, 2048, 8192))
    ]  # noqa: E501
    burst = RequestBurst(requests=8, prompt_tokens=16.0, time_s=1.0)
    burst = attrs.evolve(burst, time_s=burst.predict(cm))
    # 4 steps: the fit sees 3 (one in 3 held out) for its 3 coefficients (with 3 steps it saw 2: refused now)
    steps = [TrainStep(seq_len=n, micro_batch=2, time_s=1.0) for n in (512, 1024, 2048, 4096)]
    no_logp = CostModel(cm.cluster, MODEL, CostCoefficients(logprob_forward_passes=0))
    steps = [attrs.evolve(t, time_s=t.measurement().predict(no_logp)) for t in steps]
    start = CostCoefficients(kv_fill=0.5)  # not fitted by any group: kept
    fit = fit_profile(GPU, MODEL, decode=decode, prefill=prefill, requests=[burst], train=steps, start=start)
    assert [(g.kind, g.points, g.held_out) for g in fit.groups] == [
        ("decode", 6, 2),
        ("prefill", 3, 1),
        ("requests", 1, 0),
        ("train", 4, 1),
    ]
    assert fit.coeffs.kv_fill == 0.5 and fit.coeffs.logprob_forward_passes == start.logprob_forward_passes
    fitted = CostModel(cm.cluster, MODEL, fit.coeffs)
    one_step = CostModel(cm.cluster, MODEL, attrs.evolve(fit.coeffs, logprob_forward_passes=0))  # a measured step
    train = [t.measurement() for t in steps]
    for g, points, model in zip(
        fit.groups, (decode, prefill, [burst], train), (fitted,) * 3 + (one_step,), strict=True
    ):
        seen, held = _split(points, 3)
        assert g.mape_fit == pytest.approx(_percent_error(model, seen), abs=1e-9), g.kind
        if held:
            assert g.mape_held_out == pytest.approx(_percent_error(model, held), abs=1e-9), g.kind
        else:
            assert math.isnan(g.mape_held_out), g.kind
    assert fit.groups[0].mape_fit < 1.0  # a decode 20 % slower than the defaults is fitted


def test_the_fit_needs_something_measured():
    with pytest.raises(SpecError) as e:
        fit_profile(GPU, MODEL, requests=[RequestBurst(requests=1, prompt_tokens=1.0, time_s=1.0)])
    assert str(e.value) == "nothing measured: profile needs decode, prefill or training points"


def test_a_fraction_that_starts_at_one_is_searched_from_just_inside_its_bounds():
    """An efficiency may be exactly 1 (a valid value); its logit is infinite, so the search starts at 0.999 and a
    fit from there still reaches the truth."""
    truth = CostCoefficients(hbm_efficiency=0.62)
    points = _rollout_points(truth)
    result = calibrate(CLUSTER, MODEL, points, fit=("hbm_efficiency",), start=CostCoefficients(hbm_efficiency=1.0))
    assert result.coeffs.hbm_efficiency == pytest.approx(0.62, rel=1e-4) and result.iterations > 1


def test_a_fraction_that_starts_below_one_in_a_million_is_searched_from_one_in_a_million():
    """An efficiency may start as low as anything above 0; the search starts no lower than 1e-6 (its logit, -13.8,
    against -20.7 at 1e-9). Where the start is the truth, the start is the best point of the first simplex, which a
    search of no iterations returns: 1e-6 for a truth of 1e-9, and a start of 3e-6 as it is. A whole fit from 1e-9
    still reaches a truth of 0.62."""
    tiny = CostCoefficients(hbm_efficiency=1e-9)
    low = calibrate(CLUSTER, MODEL, _rollout_points(tiny), fit=("hbm_efficiency",), start=tiny, iterations=0)
    assert low.coeffs.hbm_efficiency == pytest.approx(1e-6, rel=1e-9)
    small = CostCoefficients(hbm_efficiency=3e-6)
    kept = calibrate(CLUSTER, MODEL, _rollout_points(small), fit=("hbm_efficiency",), start=small, iterations=0)
    assert kept.coeffs.hbm_efficiency == pytest.approx(3e-6, rel=1e-9)
    truth = CostCoefficients(hbm_efficiency=0.62)
    result = calibrate(CLUSTER, MODEL, _rollout_points(truth), fit=("hbm_efficiency",), start=tiny)
    assert result.coeffs.hbm_efficiency == pytest.approx(0.62, rel=1e-4)
