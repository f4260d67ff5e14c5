"""The colocated pipeline's three switch terms, each against its definition (bytes over a bandwidth, or a fixed
figure), on a made-up GPU whose numbers make the arithmetic plain."""

import pytest

from libra.planning.cost import CostCoefficients
from libra.planning.cost.switch import ColocatedSwitch, colocated_switch
from libra.spec import GPUSpec, get_gpu, get_model

GPU = GPUSpec(
    name="plain",
    memory_gb=80,
    bf16_tflops=100,
    hbm_bandwidth_gbs=1000,
    nvlink_bandwidth_gbs=100,
    network_bandwidth_gbs=10,
    host_bandwidth_gbs=20,
)
MODEL = get_model("Qwen3-14B")


def test_each_term_is_its_bytes_over_its_bandwidth():
    c = CostCoefficients(link_efficiency=0.5, colocated_switch_s=3.0, colocated_offload_bytes_per_param=16.0)
    s = colocated_switch(c, MODEL, GPU, rollout_tp=4, train_gpus=8)
    host, nvlink = 20e9 * 0.5, 100e9 * 0.5
    assert s.sleep_wake_s == 3.0
    assert s.offload_s == pytest.approx((MODEL.weight_bytes / 4 + MODEL.num_params * 16.0 / 8) / host, rel=1e-12)
    assert s.reshard_s == pytest.approx(MODEL.weight_bytes / nvlink, rel=1e-12)
    assert s.to_rollout_s == pytest.approx(3.0 + s.offload_s + s.reshard_s)
    assert s.to_training_s == pytest.approx(3.0 + s.offload_s)  # the reshard happens once, into rollout
    assert s.per_step_s == pytest.approx(6.0 + 2 * s.offload_s + s.reshard_s)


def test_wider_engines_and_more_training_gpus_move_fewer_bytes_per_gpu():
    c = CostCoefficients(colocated_offload_bytes_per_param=16.0)
    narrow = colocated_switch(c, MODEL, GPU, rollout_tp=1, train_gpus=8)
    wide = colocated_switch(c, MODEL, GPU, rollout_tp=8, train_gpus=64)
    assert wide.offload_s == pytest.approx(narrow.offload_s / 8)
    assert wide.reshard_s == narrow.reshard_s  # every rollout GPU gathers the whole model


def test_defaults_offload_only_the_engine_weights_and_faster_links_cut_them():
    c = CostCoefficients()
    a800 = colocated_switch(c, MODEL, get_gpu("A800-80GB"), rollout_tp=2, train_gpus=40)
    h200 = colocated_switch(c, MODEL, get_gpu("H200"), rollout_tp=2, train_gpus=40)
    assert a800.offload_s == pytest.approx(MODEL.weight_bytes / 2 / (32e9 * c.link_efficiency))  # no trainer state
    assert h200.offload_s == pytest.approx(a800.offload_s / 2)  # PCIe Gen5 against Gen4
    assert h200.reshard_s == pytest.approx(a800.reshard_s * 200 / 450)
    assert a800.sleep_wake_s == h200.sleep_wake_s == c.colocated_switch_s


def test_a_flat_figure_has_no_byte_terms_and_bad_sizes_are_refused():
    flat = ColocatedSwitch.fixed(7.0)
    assert (flat.to_rollout_s, flat.to_training_s, flat.per_step_s) == (7.0, 7.0, 14.0)
    with pytest.raises(ValueError, match="rollout_tp and train_gpus must be >= 1"):
        colocated_switch(CostCoefficients(), MODEL, GPU, rollout_tp=0, train_gpus=8)
