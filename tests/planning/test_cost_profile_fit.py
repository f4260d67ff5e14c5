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
