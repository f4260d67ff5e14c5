"""`libra estimate`: the cost model's predictions as a table and one JSON object; one-line errors."""

from __future__ import annotations

import json

import pytest

from libra.cli import main


def test_estimate_defaults_print_tables(capsys) -> None:
    assert main(["estimate"]) == 0
    out = capsys.readouterr().out
    for word in ("Decode step", "Prefill", "Rollout memory", "Colocated switches", "Training step", "anchored"):
        assert word in out


def test_estimate_json_batch_one_latency_falls_with_tp(capsys) -> None:
    """Issue 13's check: Qwen3-14B on A800 at batch 1 x 8,192 tokens, TP-2 <= 0.7x and TP-8 <= 0.55x of TP-1."""
    argv = ["estimate", "--model", "Qwen3-14B", "--gpu", "A800-80GB", "--tp", "1,2,4,8"]
    assert main([*argv, "--batch", "1", "--context", "8192", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ms = {int(k): v for k, v in data["decode_step_ms"].items()}
    assert sorted(ms) == [1, 2, 4, 8]
    assert ms[2] <= 0.7 * ms[1] and ms[8] <= 0.55 * ms[1]
    assert {"decode", "prefill", "memory", "training"} <= set(data)
    assert data["training"]["time_s"] > 0 and data["training"]["fits"]
    switch = {w["tp"]: w for w in data["colocated_switch"]}
    assert sorted(switch) == [1, 2, 4, 8]
    for w in switch.values():  # two sleeps/wakes and two offloads per step, one reshard
        assert w["per_step_s"] == pytest.approx(2 * w["sleep_wake_s"] + 2 * w["offload_s"] + w["reshard_s"])
    assert switch[8]["offload_s"] == pytest.approx(switch[1]["offload_s"] / 8)  # an engine's shard of the weights


def test_estimate_coeffs_file_changes_the_prediction(tmp_path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("hbm_efficiency: 0.4\n")
    assert main(["estimate", "--tp", "1", "--batch", "1", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)["decode_step_ms"]["1"]
    assert main(["estimate", "--tp", "1", "--batch", "1", "--json", "--coeffs", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["decode_step_ms"]["1"] > 1.5 * base


def test_estimate_given_training_layout(capsys) -> None:
    argv = ["estimate", "--model", "Qwen3-30B-A3B", "--gpu", "H100-80GB", "--train-layout", "1,1,8,8,1,1", "--json"]
    assert main(argv) == 0
    t = json.loads(capsys.readouterr().out)["training"]
    assert (t["tp"], t["dp"], t["ep"], t["recompute"]) == (1, 8, 8, True) and t["time_s"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp", "3"], "--tp 3"),
        (["--tp", "x"], "--tp must be"),
        (["--batch", "0"], "--batch needs"),
        (["--train-layout", "2,2,3"], "--train-layout"),
        (["--model", "nope"], "unknown model"),
        (["--train-seqs", "-5"], "--train-seqs must be between 1"),
        (["--train-seqs", "0"], "--train-seqs must be between 1"),
        (["--train-len", "0"], "--train-len must be between 1"),
        (["--batch", "99999999999999999999"], "--batch needs integers <= 1,048,576"),
        (["--context", "99999999999999"], "--context needs integers <= 10,000,000"),
        (["--train-layout", "1,1,8,1,1,maybe"], "recompute is one of"),
        (["--train-layout", "3,1,8", "--gpus", "24"], "tp 3 does not fit Qwen3-14B"),
        (["--train-layout", "1,3,8", "--gpus", "24"], "pp 3 does not fit Qwen3-14B"),
        (["--train-layout", "1,1,8,8"], "ep 8 does not fit Qwen3-14B"),
        (["--train-layout", "1,1,8,1,100"], "micro-batch 100 exceeds the 64 sequences of a replica"),
    ],
)
def test_estimate_bad_input_is_one_line(argv, message, capsys) -> None:
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_help_states_the_default_gpus_it_uses(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--gpus GPUS total GPUs (default 8)" in text
    assert main(["estimate", "--tp", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["gpus"] == 8
