"""Spec values validate at construction and name the field, the value and what would be valid."""

from __future__ import annotations

import json
import math

import pytest

from libra.spec import (
    GPU_PRESETS,
    MODEL_PRESETS,
    ClusterSpec,
    ModelSpec,
    RLSettings,
    SpecError,
    TrainConfig,
    WorkloadProfile,
    get_gpu,
    get_model,
    load_cluster,
    load_model,
    parse_buckets,
)


def test_presets_exist_and_are_consistent() -> None:
    assert {"A800-80GB", "A100-80GB", "H100-80GB", "H200"} <= set(GPU_PRESETS)
    assert {"Qwen3-4B", "Qwen3-14B", "Qwen3-30B-A3B", "Qwen2.5-7B", "Llama-3-70B"} <= set(MODEL_PRESETS)
    assert 65e9 < get_model("llama-3-70b").num_params < 75e9
    assert 7.0e9 < get_model("Qwen2.5-7B").num_params < 8.0e9
    assert 3.8e9 < get_model("Qwen3-4B").num_params < 4.5e9
    assert get_gpu("h200").memory_gb == 141


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unknown model 'GPT-9'.*Qwen3-14B"):
        get_model("GPT-9")
    with pytest.raises(SpecError, match="unknown GPU"):
        get_gpu("TPU")


def test_cluster_validation_names_every_factor() -> None:
    a800 = get_gpu("A800-80GB")
    with pytest.raises(SpecError, match=r"GPUs per node \(8\) must divide the number of GPUs \(12\)"):
        ClusterSpec.from_total(gpu=a800, num_gpus=12, gpus_per_node=8)
    with pytest.raises(SpecError, match="must be between 1 and 65,536, got 0"):
        ClusterSpec.from_total(gpu=a800, num_gpus=0, gpus_per_node=8)
    c = ClusterSpec.from_total(gpu=a800, num_gpus=16, gpus_per_node=8)
    assert c.nvlink_domains() == [list(range(8)), list(range(8, 16))]
    g = c.graph()
    assert g.edges[0, 1]["kind"] == "nvlink" and not g.has_edge(0, 8)
    assert c.node_of(9) == 1


def test_model_validation() -> None:
    with pytest.raises(SpecError, match="num_kv_heads"):
        ModelSpec(
            name="x",
            num_layers=2,
            hidden_size=64,
            num_heads=6,
            num_kv_heads=4,
            head_dim=16,
            ffn_hidden_size=128,
            vocab_size=100,
        )
    with pytest.raises(SpecError, match="moe_ffn_hidden_size"):
        ModelSpec(
            name="x",
            num_layers=2,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=4,
            head_dim=16,
            ffn_hidden_size=128,
            vocab_size=100,
            num_experts=4,
            experts_per_token=2,
        )
    with pytest.raises(SpecError, match=r"num_layers must be an integer in \[1, 10,000\], got 0"):
        ModelSpec(
            name="x",
            num_layers=0,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=4,
            head_dim=16,
            ffn_hidden_size=128,
            vocab_size=100,
        )


def test_train_config_checks_its_factors() -> None:
    with pytest.raises(SpecError, match=r"tp\(2\) \* pp\(2\) \* dp\(2\) != num_gpus\(16\)"):
        TrainConfig(num_gpus=16, tp=2, pp=2, dp=2)
    with pytest.raises(SpecError, match=r"ep\(4\) must divide dp\(2\)"):
        TrainConfig(num_gpus=4, tp=2, pp=1, dp=2, ep=4)


def test_bucket_specs() -> None:
    b = parse_buckets("1:4000, 2:12000,4:30000,8:inf")
    assert [x.tp for x in b] == [1, 2, 4, 8] and math.isinf(b[-1].max_tokens)
    for bad, message in [
        ("", "empty"),
        ("1:4000,2:3000", "must increase"),
        ("1-4000", "tp:max_tokens"),
        ("x:4", "integer"),
        ("0:100", "tp must be between 1 and 64"),
        ("1:0.5,2:inf", "whole number of tokens"),
        ("1:nan", "whole number of tokens"),
        ("1:-inf", "whole number of tokens"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_buckets(bad)


def test_rl_settings_and_profile() -> None:
    assert RLSettings().global_batch == 8192
    with pytest.raises(SpecError, match="samples_per_prompt"):
        RLSettings(samples_per_prompt=0)
    p = WorkloadProfile.build(name="t", shapes=[(300, 100, 1), (100, 50, 1), (200, 80, 2)], requests_per_step=30)
    assert p.total_lengths == (100, 200, 300) and p.quantile(0.5) == 200
    groups = p.groups(2)
    assert sum(g.count for g in groups) == 30 and groups[-1].max_total == 300
    with pytest.raises(SpecError, match="no trajectories"):
        WorkloadProfile.build(name="t", shapes=[])


def test_models_and_clusters_load_from_files(tmp_path) -> None:
    mf = tmp_path / "tiny.yaml"
    mf.write_text(
        "num_layers: 4\nhidden_size: 256\nnum_heads: 4\nnum_kv_heads: 2\nhead_dim: 64\n"
        "ffn_hidden_size: 512\nvocab_size: 1000\n"
    )
    m = load_model(str(mf))
    assert m.name == "tiny" and m.num_layers == 4
    cf = tmp_path / "c.json"
    cf.write_text(json.dumps({"gpu": "H100-80GB", "num_nodes": 2, "gpus_per_node": 4}))
    assert load_cluster(str(cf)).num_gpus == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_layers: 4\nwings: 2\n")
    with pytest.raises(SpecError, match="unknown field.*wings"):
        load_model(str(bad))
    with pytest.raises(SpecError, match="cannot read"):
        load_model(str(tmp_path / "missing.yaml"))


def test_a_value_out_of_range_in_a_file_names_the_file_and_the_field(tmp_path) -> None:
    mf = tmp_path / "m.yaml"
    mf.write_text(
        "num_layers: 0\nhidden_size: 256\nnum_heads: 4\nnum_kv_heads: 2\nhead_dim: 64\n"
        "ffn_hidden_size: 512\nvocab_size: 1000\n"
    )
    with pytest.raises(SpecError) as err:
        load_model(str(mf))
    assert str(err.value).startswith(f"{mf}: ModelSpec.num_layers must be an integer in [1, 10,000], got 0")
    cf = tmp_path / "c.yaml"
    cf.write_text("gpu: H100-80GB\nnum_nodes: 0\ngpus_per_node: 8\n")
    with pytest.raises(SpecError, match=r"^" + str(cf).replace(".", r"\.") + r": .*num_nodes") as err:
        load_cluster(str(cf))
    assert str(err.value).count(str(cf)) == 1  # named once, not once per layer it passed through
    gf = tmp_path / "g.yaml"
    gf.write_text(
        "gpu: {name: X, memory_gb: -1, bf16_tflops: 900, hbm_bandwidth_gbs: 3000, nvlink_bandwidth_gbs: 400,"
        " network_bandwidth_gbs: 50}\nnum_nodes: 1\ngpus_per_node: 8\n"
    )
    with pytest.raises(SpecError) as err:
        load_cluster(str(gf))
    assert str(err.value).startswith(f"{gf}: GPUSpec.memory_gb") and str(err.value).count(str(gf)) == 1


def test_jsonable_makes_plain_json() -> None:
    import numpy as np

    from libra.spec.jsonable import jsonable

    out = jsonable(
        {
            "a": np.float64(1.5),
            "b": (1, np.int64(2)),
            "c": [math.inf, float("nan")],
            "d": np.arange(3),
            "e": {"f": np.float32(2.0)},
        }
    )
    assert out == {"a": 1.5, "b": [1, 2], "c": [None, None], "d": [0, 1, 2], "e": {"f": 2.0}}
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize(
    "shapes, kw, message",
    [
        ([(float("nan"), 1.0, 1.0)], {}, "total_lengths must be finite token counts >= 0"),
        ([(-5000.0, 1.0, 1.0), (10.0, 1.0, 1.0)], {}, "total_lengths must be finite token counts >= 0"),
        ([(10.0, 1.0, 1.0), (float("inf"), 1.0, 1.0)], {}, "total_lengths must be finite token counts >= 0"),
        ([(100.0, -10.0, 1.0)], {}, "gen_tokens must be finite token counts >= 0"),
        ([(100.0, float("nan"), 1.0)], {}, "gen_tokens must be finite token counts >= 0"),
        ([(100.0, 1.0, 1.0)], {"mean_tool_time_s": -1.0}, "mean_tool_time_s must be finite seconds >= 0"),
    ],
)
def test_a_profile_of_negative_or_non_finite_lengths_is_refused(shapes, kw, message) -> None:
    """Trajectories built in code are not validated (`load_trace` validates what it reads): a profile of negative
    token counts planned a negative makespan."""
    with pytest.raises(SpecError, match=message):
        WorkloadProfile.build(name="x", shapes=shapes, **kw)


def test_a_profile_keeps_its_lengths_as_tuples() -> None:
    """Lists given are copied into tuples: a caller changing its list afterwards changes nothing (the planner's
    tables are memoised per profile)."""
    lengths, gen = [1000.0, 2000.0], [500.0, 900.0]
    p = WorkloadProfile(name="x", total_lengths=lengths, gen_tokens=gen, requests_per_step=2)
    lengths[1], gen[1] = 35000.0, 20000.0
    assert p.total_lengths == (1000.0, 2000.0) and p.gen_tokens == (500.0, 900.0)


def test_placements_name_each_worker_once_and_give_each_its_gpus() -> None:
    from libra.spec.placement import Placement, Pool, Role, WorkerPlacement

    def rollout(name: str, tp: int, ids, **kw) -> WorkerPlacement:
        return WorkerPlacement(name=name, role=Role.ROLLOUT_INSTANCE, tp=tp, gpu_ids=ids, **kw)

    ok = rollout("r0", 2, (0, 1))
    for bad, message in (
        (lambda: rollout("r0", 4, (0,)), "1 GPU ids for a rollout_instance of TP 4"),
        (lambda: rollout("r0", 2, [0, 1]), "gpu_ids must be a tuple, got list"),
        (lambda: rollout("r0", 2, (0, 0)), "gpu_ids must be distinct GPU ids in"),
        (lambda: rollout("r0", 0, ()), r"WorkerPlacement\.tp must be an integer in \[1, 65,536\], got 0"),
        (lambda: rollout("", 1, (0,)), "name must be a non-empty string"),
        (lambda: rollout("r0", 1, (0,), pool="hybrid"), "pool must be one of Pool.CORE_TRAIN"),
        (lambda: WorkerPlacement(name="t", role="train", tp=2, gpu_ids=(0, 1)), "role must be one of Role."),
        (lambda: WorkerPlacement(name="t", role=Role.TRAIN_REPLICA, tp=2, gpu_ids=(0, 1, 2)), "3 GPU ids for a"),
        (lambda: Placement(workers=(ok, ok)), r"worker names must be unique; \['r0'\] repeat"),
        (lambda: Placement(workers=[ok]), "workers must be a tuple of WorkerPlacement"),
    ):
        with pytest.raises(SpecError, match=message):
            bad()
    replica = WorkerPlacement(name="t", role=Role.TRAIN_REPLICA, tp=2, gpu_ids=(2, 3, 4, 5), pool=Pool.CORE_TRAIN)
    both = Placement(workers=(ok, replica, rollout("r1", 1, (1,))))
    assert both.shared_gpus() == {1: ("r0", "r1")}  # allowed in the value (a solver's input), refused by its users
    assert Placement(workers=(ok, replica)).shared_gpus() == {}


def test_a_profile_of_zero_requests_a_step_is_refused_not_defaulted() -> None:
    with pytest.raises(SpecError, match=r"requests_per_step must be >= 1 .*, got 0$"):
        WorkloadProfile.build(name="x", shapes=[(100.0, 10.0, 1.0)], requests_per_step=0)
    assert WorkloadProfile.build(name="x", shapes=[(100.0, 10.0, 1.0)] * 3).requests_per_step == 3


@pytest.mark.parametrize(
    "bad", [{"num_gpus": "8"}, {"num_gpus": True}, {"gpus_per_node": 2.0}, {"gpus_per_node": None}]
)
def test_a_cluster_from_a_total_needs_whole_numbers(bad) -> None:
    """`from_total(num_gpus="8")` raised a TypeError comparing a string, `num_gpus=True` made a one-GPU cluster."""
    import numpy as np

    kw = {"gpu": get_gpu("A800-80GB"), "num_gpus": 8, "gpus_per_node": 8, **bad}
    with pytest.raises(SpecError, match=r"from_total: \w+ must be an integer, got"):
        ClusterSpec.from_total(**kw)
    assert ClusterSpec.from_total(gpu=kw["gpu"], num_gpus=np.int64(16), gpus_per_node=np.int32(8)).num_gpus == 16
