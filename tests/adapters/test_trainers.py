"""Trainer adapters in real multi-process worlds (gloo on CPU): DeepSpeed ZeRO stages and plain torch DDP, each
with the elastic side channel as the gradient hook and a hybrid replica joining as a third replica."""

from __future__ import annotations

import adapter_procs as P
import adapter_scenarios as S
import pytest

from tests.limits import scaled

pytestmark = [pytest.mark.multiproc]


def _with_hybrid(core_fn, tmp_path, steps=20):
    port, side = P.free_port(), P.free_port()
    results = P.run_processes(
        [(core_fn, (0, steps, port, side)), (core_fn, (1, steps, port, side)), (S.hybrid, (side,))],
        tmp=tmp_path,
        timeout_s=scaled(240),
    )
    core0, core1, hybrid = results
    three = [t for t, n in core0["members"].items() if n == 3]
    assert three, f"the hybrid never contributed: membership per step {core0['members']}"
    assert hybrid["active_steps"] == len(three)
    assert core0["members"] == core1["members"]
    return core0, core1


@pytest.mark.timeout(scaled(300))
def test_torch_ddp_two_core_plus_hybrid_matches_three_replica_dp(tmp_path):
    core0, core1 = _with_hybrid(S.ddp_core, tmp_path)
    assert core0["worst_3dp_diff"] < 1e-6 and core1["worst_3dp_diff"] < 1e-6


@pytest.mark.slow
@pytest.mark.timeout(scaled(420))
def test_deepspeed_two_core_plus_hybrid_matches_three_replica_dp(tmp_path):
    pytest.importorskip("deepspeed")
    core0, core1 = _with_hybrid(S.ds_core, tmp_path)
    print("deepspeed 2 core + 1 hybrid vs 3-replica DP, max |diff|:", core0["worst_3dp_diff"])
    assert core0["worst_3dp_diff"] < 1e-6 and core1["worst_3dp_diff"] < 1e-6


@pytest.mark.slow
@pytest.mark.timeout(scaled(420))
def test_deepspeed_zero_stages_match_data_parallel(tmp_path):
    pytest.importorskip("deepspeed")
    port = P.free_port()
    r0, r1 = P.run_processes(
        [(S.ds_stages, (r, port, (0, 1, 2), 3)) for r in (0, 1)], tmp=tmp_path, timeout_s=scaled(360)
    )
    print("deepspeed vs 2-replica DP, max |diff| per stage:", r0)
    for key in ("zero0", "zero0+hook", "zero1", "zero1+hook", "zero2"):
        assert r0[key] < 1e-6 and r1[key] < 1e-6, (key, r0, r1)
    assert r0["export_buckets"] >= 1
    assert r0["zero2+hook"].startswith("refused: a gradient hook needs ZeRO stage 0 or 1"), r0["zero2+hook"]


@pytest.mark.slow
@pytest.mark.timeout(scaled(300))
def test_deepspeed_refuses_a_config_for_another_world_and_a_foreign_snapshot_in_one_line(tmp_path):
    pytest.importorskip("deepspeed")
    (r,) = P.run_processes([(S.ds_refusals, (0, P.free_port()))], tmp=tmp_path, timeout_s=scaled(240))
    assert r["dp2_in_world1"] == (
        "UnsupportedConfig: train_batch_size(4) != train_micro_batch_size_per_gpu(2) * gradient_accumulation_steps"
        "(1) * world size(1): the config is for dp = 2, this process group has 1 ranks"
    )
    assert r["stage7"] == "UnsupportedConfig: zero_optimization.stage must be 0, 1, 2 or 3, got 7"
    assert r["foreign_snapshot"] == (
        "StateMismatch: DeepSpeedTrainer.restore: snapshot lacks ['0.bias', '0.weight', '2.bias'] and has unknown "
        "['bias', 'weight'] parameters"
    )
    assert r["moved_by_zero_hook"] == 0.0  # the hook's returned gradients were used, not the local ones
