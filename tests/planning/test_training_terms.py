"""The training cost model term by term, each against the formula its module docstring states (libra/planning/cost/
training.py) with the other terms held still: the anchors check the sum against published measurements, which a
wrong factor inside one term can pass. Also the training job of the simulator (libra/sim/training.py): a step's
progress at the replica count it has, joins mid-step, and the GPU-seconds it keeps busy."""

from __future__ import annotations

import attrs
import pytest

from libra.planning.cost import BatchStats, CostModel
from libra.planning.cost.switch import ColocatedSwitch, colocated_switch
from libra.sim.training import TrainingJob, best_layout, step_time
from libra.spec import ClusterSpec, SpecError, TrainConfig, get_gpu, get_model


def _cm(model: str = "Qwen3-14B", *, gpus: int = 64, coeffs=None, **gpu_changes) -> CostModel:
    gpu = attrs.evolve(get_gpu("A800-80GB"), **gpu_changes)
    return CostModel(ClusterSpec.from_total(gpu=gpu, num_gpus=gpus, gpus_per_node=8), get_model(model), coeffs)


def test_a_dense_model_holds_no_expert_parameters() -> None:
    tc = _cm().training
    assert tc.params_per_gpu(1, 1) == (tc.model.num_params, 0.0)
    assert tc.params_per_gpu(2, 4) == (tc.model.num_params / 8, 0.0)
    moe = _cm("Qwen3-30B-A3B").training
    m = moe.model
    expert = m.num_layers * m.num_experts * m.expert_params
    assert moe.params_per_gpu(1, 1) == (m.num_params - expert, expert)  # without EP every expert on every rank
    assert moe.params_per_gpu(2, 1, ep=4) == ((m.num_params - expert) / 2, expert / 8)


def test_model_states_are_6_bytes_a_parameter_plus_12_sharded_over_data_parallel_ranks() -> None:
    """bf16 weights and fp32 main grads (6 bytes) on every rank, fp32 master weights and Adam's two moments (12
    bytes) sharded over the data-parallel ranks (Megatron's distributed optimizer: 6 + 12 / dp bytes)."""
    tc = _cm().training
    params = tc.model.num_params
    tiny = BatchStats.uniform(num_sequences=64, length=1.0)  # one token: activations are a few MB
    for dp, per_param in ((1, 18.0), (4, 9.0), (12, 7.0)):
        mem = float(tc.memory_bytes(1, 1, dp, 1, 1, True, tiny))
        assert mem == pytest.approx(per_param * params, rel=2e-4), dp


def test_activations_grow_per_token_as_the_docstring_counts_them() -> None:
    """Per token of a micro-batch: the layers' inputs (recompute) or all their activations (34 bytes a hidden unit),
    one layer's full activations as working memory, and the fp32 logits, each sharded over TP."""
    tc = _cm().training
    m = tc.model
    h, d, layers, vocab = m.hidden_size, m.dtype_bytes, m.num_layers, m.vocab_size
    for tp, recompute in ((1, True), (2, False), (4, True)):
        short = BatchStats.uniform(num_sequences=64, length=1024.0)
        long = BatchStats.uniform(num_sequences=64, length=3072.0)
        per_token = (
            float(tc.memory_bytes(tp, 1, 8, 1, 1, recompute, long))
            - float(tc.memory_bytes(tp, 1, 8, 1, 1, recompute, short))
        ) / 2048.0
        kept = h * d * (1.0 if recompute else 34.0) * layers
        assert per_token == pytest.approx((kept + h * d * 34.0 + 4.0 * vocab) / tp, rel=1e-9), (tp, recompute)


def test_a_layout_fits_in_95_percent_of_gpu_memory_and_not_beyond() -> None:
    tc = _cm().training
    limit = tc.gpu.memory_bytes * 0.95
    assert limit == 76e9  # an 80 GB A800
    assert tc.fits(limit) and not tc.fits(limit * (1 + 1e-12))


def test_one_gpu_doing_nothing_but_compute_attains_the_ideal_step_time() -> None:
    """`ideal_step_time` is compute at perfect scaling: with the optimizer's memory traffic and the per-micro-batch
    overhead at zero, one GPU (no bubble, no collective) takes exactly that long, whatever the lengths."""
    base = _cm().coeffs
    cm = _cm(coeffs=attrs.evolve(base, optimizer_bytes_per_param=0.0, microbatch_overhead_s=0.0))
    tc = cm.training
    for batch in (
        BatchStats.uniform(num_sequences=64, length=2048.0),
        BatchStats.from_lengths([100.0, 900.0, 9000.0, 30000.0] * 16),
    ):
        for micro in (1, 4):
            got = float(tc.step_time(1, 1, 1, 1, micro, False, batch))
            assert got == pytest.approx(float(tc.ideal_step_time(1, batch)), rel=1e-12)
            assert float(tc.ideal_step_time(8, batch)) == pytest.approx(got / 8, rel=1e-12)


def test_attention_work_is_two_flops_per_head_dimension_per_pair_of_tokens() -> None:
    """The attention term: 2 x layers x heads x head_dim per token pair (mean squared length), over its own
    efficiency, times the passes; with the mean length fixed, only it moves with the mean squared length."""
    tc = _cm().training
    m, c, g = tc.model, tc.c, tc.gpu
    a = BatchStats(num_sequences=64, mean_len=4096.0, mean_sq_len=4096.0**2, max_len=4096.0)
    b = attrs.evolve(a, mean_sq_len=2 * 4096.0**2, max_len=8192.0)
    for micro, recompute in ((1, False), (2, True)):
        f = 4.0 if recompute else 3.0
        delta = tc.stage_time(1, 1, 1, micro, recompute, b) - tc.stage_time(1, 1, 1, micro, recompute, a)
        flops = f * micro * 4096.0**2 * 2.0 * m.num_layers * m.num_heads * m.head_dim / c.train_attention_efficiency
        assert delta == pytest.approx(flops / (g.flops * c.train_mfu), rel=1e-9)


def _faster_links(model: str = "Qwen3-14B") -> CostModel:
    """Twice the NVLink and network bandwidth: a collective's bytes take half as long, its latency as long."""
    g = get_gpu("A800-80GB")
    return _cm(
        model, nvlink_bandwidth_gbs=2 * g.nvlink_bandwidth_gbs, network_bandwidth_gbs=2 * g.network_bandwidth_gbs
    )


def test_tensor_parallel_all_reduces_move_a_ring_of_the_activations() -> None:
    """Each layer's 4 all-reduces per forward and backward (3 passes) move 2 (tp - 1) / tp of a micro-batch's
    activations over NVLink."""
    for tp in (2, 4, 8):
        batch = BatchStats.uniform(num_sequences=64, length=2048.0)
        slow, fast = _cm().training, _faster_links().training
        m, c = slow.model, slow.c
        delta = slow.stage_time(tp, 1, 1, 1, False, batch) - fast.stage_time(tp, 1, 1, 1, False, batch)
        act = 2048.0 * m.hidden_size * m.dtype_bytes
        ring = 2.0 * (tp - 1) / tp * act / (slow.gpu.nvlink_bandwidth_gbs * 1e9 * c.link_efficiency)
        assert delta == pytest.approx(m.num_layers * 4.0 * ring / 2, rel=1e-9), tp


def test_expert_all_to_alls_move_the_routed_share_of_the_tokens() -> None:
    """MoE with EP: per layer, dispatch and combine, forward and backward (4 per 3 passes), each moving the
    (ep - 1) / ep of the micro-batch's routed tokens that leave the rank, over the group's link."""
    for ep, link in ((2, "nvlink_bandwidth_gbs"), (16, "network_bandwidth_gbs")):
        batch = BatchStats.uniform(num_sequences=64, length=2048.0)
        slow, fast = _cm("Qwen3-30B-A3B").training, _faster_links("Qwen3-30B-A3B").training
        m, c = slow.model, slow.c
        delta = slow.stage_time(1, 1, ep, 1, False, batch) - fast.stage_time(1, 1, ep, 1, False, batch)
        act = 2048.0 * m.hidden_size * m.dtype_bytes
        bw = getattr(slow.gpu, link) * 1e9 * c.link_efficiency
        assert delta == pytest.approx(m.num_layers * 4.0 * (ep - 1) / ep * act * m.experts_per_token / bw / 2, rel=1e-9)


def test_the_gradient_all_reduce_is_hidden_behind_backward_but_for_its_exposed_share() -> None:
    batch = BatchStats.uniform(num_sequences=64, length=2048.0)
    for dp in (2, 4):
        slow, fast = _cm().training, _faster_links().training
        c = slow.c
        delta = float(slow.step_time(1, 1, dp, 1, 1, False, batch) - fast.step_time(1, 1, dp, 1, 1, False, batch))
        grad_bytes = slow.model.num_params * slow.model.dtype_bytes
        ring = 2.0 * (dp - 1) / dp * grad_bytes / (slow.gpu.nvlink_bandwidth_gbs * 1e9 * c.link_efficiency)
        assert 0 < c.dp_overlap < 1
        assert delta == pytest.approx((1.0 - c.dp_overlap) * ring / 2, rel=1e-9), dp


def test_best_layout_is_on_exactly_the_gpus_asked_or_a_clear_error() -> None:
    cm = _cm()
    batch = BatchStats.uniform(num_sequences=64, length=4096.0)
    for gpus in (4, 8, 16):
        cfg = best_layout(cm, gpus, batch)
        assert cfg.num_gpus == gpus
    with pytest.raises(SpecError, match=r"no training layout of Qwen3-14B fits 1 x A800-80GB"):
        best_layout(cm, 1, batch)  # 18 bytes a parameter of 14.8 B parameters on one 80 GB GPU


def test_the_colocated_switch_reports_its_three_terms() -> None:
    cm = _cm()
    sw = colocated_switch(cm.coeffs, cm.model, cm.cluster.gpu, rollout_tp=2, train_gpus=8)
    d = sw.to_dict()
    assert d == {
        "sleep_wake_s": sw.sleep_wake_s,
        "offload_s": sw.offload_s,
        "reshard_s": sw.reshard_s,
        "per_step_s": 2 * (sw.sleep_wake_s + sw.offload_s) + sw.reshard_s,
    }
    assert sw.reshard_s > 0  # the weights resharded from the training layout to the rollout's
    assert ColocatedSwitch.fixed(5.0).to_dict()["reshard_s"] == 0.0


def _job(replicas: int, dp: int = 4) -> TrainingJob:
    cm = _cm()
    cfg = TrainConfig(num_gpus=2 * dp, tp=2, pp=1, dp=dp)
    return TrainingJob(cm, cfg, BatchStats.uniform(num_sequences=64, length=4096.0), start=10.0, replicas=replicas)


def test_a_training_step_runs_at_its_replica_count() -> None:
    full, one = _job(4), _job(1)
    assert one.time_for(1) == step_time(one.cm, one.cfg, one.batch, 1)
    assert full.time_for(4) == step_time(full.cm, full.cfg, full.batch, 4)
    assert one.time_for(1) > 2 * full.time_for(4)  # data parallelism shortens a step
    end = full.run_to_end()
    assert end == pytest.approx(10.0 + full.time_for(4), rel=1e-12)
    assert full.busy_gpu_s == pytest.approx(full.time_for(4) * 4 * 2, rel=1e-12)  # seconds x replicas x GPUs each


def test_a_replica_that_joins_mid_step_takes_the_rest_of_it_at_the_larger_count() -> None:
    job = _job(1)
    t1, t2 = job.time_for(1), job.time_for(2)
    job.join(10.0 + t1 / 2, 1)
    end = job.run_to_end()
    assert end == pytest.approx(10.0 + t1 / 2 + t2 / 2, rel=1e-12)
    assert job.replicas == 2
    assert job.busy_gpu_s == pytest.approx((t1 / 2) * 1 * 2 + (t2 / 2) * 2 * 2, rel=1e-12)


def test_advancing_stops_at_the_time_asked() -> None:
    job = _job(2)
    t = job.time_for(2)
    job.advance_to(10.0 + t / 4)
    assert job.end is None and job.clock == 10.0 + t / 4
    assert job.done_frac == pytest.approx(0.25, rel=1e-12)
    assert job.remaining_s() == pytest.approx(0.75 * t, rel=1e-12)
