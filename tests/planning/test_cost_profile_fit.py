"""The fit behind `libra profile`: points made by known coefficients come back, held-out points are predicted."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libra.planning.cost import CostCoefficients, CostModel
from libra.planning.cost.profile_fit import (
    DecodeStep,
    Prefill,
    RequestBurst,
    TrainStep,
    fit_profile,
    model_from_hf_config,
)
from libra.spec import ClusterSpec, SpecError, get_gpu, get_model

GPU = get_gpu("A800-80GB")
MODEL = get_model("Qwen3-4B")
TRUTH = CostCoefficients(
    step_overhead_s=0.003,
    per_seq_overhead_s=80e-6,
    hbm_efficiency=0.55,
    prefill_mfu=0.4,
    per_request_overhead_s=0.02,
    train_mfu=0.35,
    train_attention_efficiency=0.5,
    microbatch_overhead_s=0.002,
)


def _points(noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    cm = CostModel(ClusterSpec.from_total(gpu=GPU, num_gpus=1, gpus_per_node=1), MODEL, TRUTH)

    def jitter(t: float) -> float:
        return t * float(np.exp(rng.normal(0.0, noise)))

    decode = [
        DecodeStep(batch=b, context=c, time_s=jitter(float(cm.rollout.decode_step_time(1, float(b), float(c)))))
        for c in (256, 2048, 8192)
        for b in (1, 8, 32, 128)
    ]
    prefill = [
        Prefill(tokens=n, time_s=jitter(float(cm.rollout.prefill_time(1, float(n), n / 2.0)) + TRUTH.step_overhead_s))
        for n in (128, 512, 2048, 4096, 8192)
    ]
    burst = RequestBurst(requests=16, prompt_tokens=8, time_s=1.0)
    burst = RequestBurst(requests=16, prompt_tokens=8, time_s=burst.predict(cm))
    no_logp = CostModel(cm.cluster, MODEL, TRUTH.replace(logprob_forward_passes=0))
    train = []
    for length in (512, 2048, 4096):
        for mb in (1, 2, 4):
            step = TrainStep(seq_len=length, micro_batch=mb, time_s=1.0)
            train.append(TrainStep(seq_len=length, micro_batch=mb, time_s=jitter(step.measurement().predict(no_logp))))
    return decode, prefill, [burst], train


def test_exact_points_give_back_the_coefficients() -> None:
    decode, prefill, burst, train = _points(noise=0.0)
    fit = fit_profile(GPU, MODEL, decode=decode, prefill=prefill, requests=burst, train=train)
    for g in fit.groups:
        assert g.mape_fit < 1.0, g
        assert math.isnan(g.mape_held_out) or g.mape_held_out < 1.0, g
    for name in ("step_overhead_s", "hbm_efficiency", "prefill_mfu", "per_request_overhead_s", "train_mfu"):
        assert getattr(fit.coeffs, name) == pytest.approx(getattr(TRUTH, name), rel=0.05), name
    assert fit.coeffs.logprob_forward_passes == CostCoefficients().logprob_forward_passes
    assert set(fit.changed()) >= {"step_overhead_s", "prefill_mfu", "per_request_overhead_s", "train_mfu"}


def test_noisy_points_are_predicted_to_the_noise_level_on_held_out_points() -> None:
    decode, prefill, burst, train = _points(noise=0.03, seed=1)
    fit = fit_profile(GPU, MODEL, decode=decode, prefill=prefill, requests=burst, train=train)
    for g in fit.groups:
        assert g.mape_fit < 6.0, g
        assert math.isnan(g.mape_held_out) or g.mape_held_out < 8.0, g


def test_nothing_measured_is_an_error() -> None:
    with pytest.raises(SpecError, match="nothing measured"):
        fit_profile(GPU, MODEL)


def test_model_from_a_hugging_face_config() -> None:
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 320,
        "tie_word_embeddings": False,
    }
    m = model_from_hf_config(config, name="tiny", dtype_bytes=4)
    assert (m.num_layers, m.head_dim, m.dtype_bytes, m.is_moe) == (2, 32, 4, False)
    with pytest.raises(SpecError, match="config.json"):
        model_from_hf_config({"hidden_size": 64}, name="broken")


# -- points and groups that cannot have been measured: refused in one line naming them --------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DecodeStep(batch=4, context=512.0, time_s=-0.01), "DecodeStep(batch=4, context=512.0).time_s"),
        (lambda: DecodeStep(batch=4, context=512.0, time_s=0.0), "DecodeStep(batch=4, context=512.0).time_s"),
        (lambda: DecodeStep(batch=0, context=512.0, time_s=0.01), "DecodeStep(batch=0, context=512.0).batch"),
        (lambda: DecodeStep(batch=4, context=-1.0, time_s=0.01), "DecodeStep(batch=4, context=-1.0).context"),
        (lambda: DecodeStep(batch=4, context=512.0, time_s=0.01, tp=0), "DecodeStep(batch=4, context=512.0).tp"),
        (lambda: Prefill(tokens=512.0, time_s=-1.0), "Prefill(tokens=512.0).time_s"),
        (lambda: Prefill(tokens=0.0, time_s=0.1), "Prefill(tokens=0.0).tokens"),
        (lambda: Prefill(tokens=512.0, time_s=math.nan), "Prefill(tokens=512.0).time_s"),
        (
            lambda: RequestBurst(requests=0, prompt_tokens=8.0, time_s=1.0),
            "RequestBurst(requests=0, prompt_tokens=8.0)",
        ),
        (lambda: RequestBurst(requests=8, prompt_tokens=8.0, time_s=-1.0), "prompt_tokens=8.0).time_s"),
        (lambda: TrainStep(seq_len=512, micro_batch=2, time_s=-3.0), "TrainStep(seq_len=512, micro_batch=2).time_s"),
        (lambda: TrainStep(seq_len=0, micro_batch=2, time_s=3.0), "TrainStep(seq_len=0, micro_batch=2).seq_len"),
        (
            lambda: TrainStep(seq_len=512, micro_batch=0, time_s=3.0),
            "TrainStep(seq_len=512, micro_batch=0).micro_batch",
        ),
    ],
)
def test_a_point_that_cannot_have_been_measured_is_refused_naming_it(make, message) -> None:
    # before: accepted; a time of 0 made the fit's relative error infinite, a negative one fitted a negative time
    with pytest.raises(SpecError) as err:
        make()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_group_with_fewer_points_for_its_fit_than_coefficients_is_refused() -> None:
    decode, prefill, burst, train = _points(noise=0.0)
    # 3 training steps: one held out, 2 seen by a fit of 3 coefficients (before: fitted, any of many answers)
    with pytest.raises(SpecError) as err:
        fit_profile(GPU, MODEL, decode=decode, train=train[:3])
    assert str(err.value) == (
        "train: 3 point(s), 2 for the fit, cannot fit 3 coefficients (train_mfu, train_attention_efficiency, "
        "microbatch_overhead_s); measure at least 4 (one point in 3 is held out)"
    )
    with pytest.raises(SpecError, match=r"^decode: 2 point\(s\), 2 for the fit, cannot fit 3 .*at least 3 \(none"):
        fit_profile(GPU, MODEL, decode=decode[:2], held_out_every=0)
    fit = fit_profile(GPU, MODEL, decode=decode, prefill=prefill[:1], requests=burst, train=train[:4])
    assert [(g.kind, g.points, g.held_out) for g in fit.groups] == [
        ("decode", 12, 4),
        ("prefill", 1, 0),  # one coefficient, one point
        ("requests", 1, 0),
        ("train", 4, 1),
    ]
