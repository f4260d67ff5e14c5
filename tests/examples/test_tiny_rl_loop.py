"""`examples/tiny_rl_loop.py` (a short use of the runtime API) runs on CPU and leaves consistent run records.

The example is imported and its `main` called in this process (no second interpreter importing torch and vLLM
again) on a small configuration of the same runtime: one engine, 2 prompts x 2 samples, 2 steps. The whole
default run, engine kills, replans and resume are checked once, in tests/runtime/test_run_engines.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from libra.runtime.records import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_rl_loop.py"
SMALL = (
    "max_staleness: 1\nprompts: [what is the answer, the fox and the dog]\nsamples_per_prompt: 2\n"
    "virtual: {gpus: 2, gpus_per_node: 2, model: Qwen3-4B}\n"
)


@pytest.mark.slow
def test_tiny_rl_loop_leaves_run_records(tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("tiny_rl_loop", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = tmp_path / "small.yaml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    assert example.main([str(out), "--steps", "2", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "step 0: loss" in printed and "step 1: loss" in printed and str(out) in printed
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["weight_version"] == r["step"] + 1 and r["loss"] == r["loss"]  # not NaN
        assert r["trajectories"]["finished"] == r["trajectories"]["expected"] == 4
        assert r["trajectories"]["lost"] == 0 and r["trajectories"]["duplicated"] == 0
        assert all(0 <= int(s) <= 1 for s in r["staleness"])
        assert set(r["weights"]["instances"].values()) == {r["weight_version"]}  # the engines serve the new weights
    first = records[0]["decisions"]
    assert any(d["source"] == "planner" and d["kind"] == "plan" for d in first)
    started = [d["worker"] for d in first if d["source"] == "planner" and d["kind"] == "StartInstance"]
    assert started and set(started) == set(records[0]["workers"]) - {"train-0"}  # the planner's placement runs
    assert any(d["source"] == "router" for d in first)
    assert len(read_jsonl(out / "trace.jsonl")) == 8 and (out / "timeline.png").is_file()
