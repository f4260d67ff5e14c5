"""Megatron-core adapter: plan -> parallel sizes (pure), and a TP=2 world on gloo (process groups, sharded
GPTModel, Megatron DDP, gradient hook). Forward/backward on CPU uses the test-only shim in megatron_shim.py;
Megatron's optimizers allocate on CUDA, so the optimizer step is checked by examples/gpu_check_megatron.py."""

from __future__ import annotations

import adapter_procs as P
import adapter_scenarios as S
import pytest

from libra.adapters import UnsupportedConfig
from libra.spec import TrainConfig
from tests.limits import scaled


def test_train_config_maps_to_parallel_state_sizes():
    from libra.adapters.megatron_trainer import parallel_sizes

    sizes = parallel_sizes(TrainConfig(num_gpus=16, tp=2, pp=2, dp=4, ep=2))
    assert sizes == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "expert_model_parallel_size": 2,
    }


def test_gpt_config_rejects_layouts_megatron_cannot_build():
    pytest.importorskip("megatron.core")
    from libra.adapters.megatron_trainer import gpt_config

    with pytest.raises(UnsupportedConfig, match=r"pp\(3\) must divide num_layers\(4\)"):
        gpt_config(TrainConfig(num_gpus=3, tp=1, pp=3, dp=1), num_layers=4, hidden_size=64, num_attention_heads=2)
    with pytest.raises(UnsupportedConfig, match=r"tp\(4\) must divide num_attention_heads\(2\)"):
        gpt_config(TrainConfig(num_gpus=4, tp=4, pp=1, dp=1), num_layers=4, hidden_size=64, num_attention_heads=2)


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(240))
def test_tp2_groups_sharded_model_and_gradient_hook(tmp_path):
    pytest.importorskip("megatron.core")
    port = P.free_port()
    r0, r1 = P.run_processes([(S.megatron_tp2, (r, port)) for r in (0, 1)], tmp=tmp_path, timeout_s=scaled(200))
    for r, rank in ((r0, 0), (r1, 1)):
        assert (r["tp"], r["dp"], r["tp_rank"]) == (2, 1, rank)
        # vocab-parallel embedding and column-parallel qkv hold half of the rows on each TP rank
        assert r["shapes"]["embedding.word_embeddings.weight"] == [64, 64]
        assert r["shapes"]["decoder.layers.0.self_attention.linear_qkv.weight"] == [3 * 64 // 2, 64]
        assert r["hook_steps"] == [41]
        assert r["hook_vs_plain"] == 0.0 and r["grad_norm"] > 0  # the hook's output is the synced gradient
        assert r["hooked_loss"] == r["loss"]
        assert r["relayout"] == (
            "UnsupportedConfig: Megatron's process groups exist for tp(2) * pp(1) * dp(1) (ep 1); "
            "TrainConfig asks for tp(1) * pp(1) * dp(2) (ep 1) on the same ranks"
        ), r["relayout"]
    assert r0["losses"][0] == r0["losses"][1]  # TP ranks agree on the loss


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_a_tp2_hybrid_replica_joins_a_tp2_core_replica_and_stays_bitwise_equal_per_coordinate(tmp_path):
    """Megatron-core TP = 2 on both sides: each coordinate's hybrid rank restores its shard from its core rank; the
    rank at coordinate 1 attaches later than the one at coordinate 0, which waits as a placeholder (no forward pass:
    its TP peer is not there), and the coordinates promote the hybrid replica at one boundary; from then on every
    step counts two replicas, both ranks run one TP forward and backward, and each hybrid rank's state is bitwise its
    core rank's after every step."""
    pytest.importorskip("megatron.core")
    world_ports, side_ports = (P.free_port(), P.free_port()), (P.free_port(), P.free_port())
    steps = 16
    procs = P.run_processes(
        [(S.megatron_tp2_pool, (i, world_ports, side_ports, steps, str(tmp_path))) for i in range(4)],
        tmp=tmp_path,
        timeout_s=scaled(240),
    )
    cores, hybrids = procs[:2], procs[2:]
    modes = [{int(s): m for s, m in h["modes"].items()} for h in hybrids]
    first = min(s for s, m in modes[0].items() if m == "active")
    assert min(modes[0]) < first  # coordinate 0's rank waited as a placeholder for its peer
    assert modes[0] == {s: "placeholder" if s < first else "active" for s in range(min(modes[0]), steps)}
    assert modes[1] == {s: "active" for s in range(first, steps)}  # attached late, promoted with its peer
    for coord in (0, 1):
        core, hybrid = cores[coord], hybrids[coord]
        for s in hybrid["digests"]:
            assert hybrid["digests"][s] == core["digests"][s], (coord, s)
        assert core["counted"] == [[s, 2 if s >= first else 1] for s in range(steps)], core["counted"]
    assert hybrids[0]["losses"] == hybrids[1]["losses"] and cores[0]["losses"] == cores[1]["losses"]
