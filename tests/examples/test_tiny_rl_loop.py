"""`examples/tiny_rl_loop.py` (a short use of the runtime API) runs on CPU and leaves consistent run records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libra.runtime.records import read_jsonl
from tests.limits import scaled

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_rl_loop.py"


@pytest.mark.slow
def test_tiny_rl_loop_leaves_run_records(tmp_path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(out), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=scaled(900),
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["weight_version"] == r["step"] + 1 and r["loss"] == r["loss"]  # not NaN
        assert r["trajectories"]["finished"] == r["trajectories"]["expected"] == 16
        assert r["trajectories"]["lost"] == 0 and r["trajectories"]["duplicated"] == 0
        assert all(0 <= int(s) <= 1 for s in r["staleness"])
        assert set(r["weights"]["instances"].values()) == {r["weight_version"]}  # the engines serve the new weights
    first = records[0]["decisions"]
    assert any(d["source"] == "planner" and d["kind"] == "plan" for d in first)
    started = [d["worker"] for d in first if d["source"] == "planner" and d["kind"] == "StartInstance"]
    assert started and set(started) == set(records[0]["workers"]) - {"train-0"}  # the planner's placement runs
    assert any(d["source"] == "router" for d in first)
    assert len(read_jsonl(out / "trace.jsonl")) == 32 and (out / "timeline.png").is_file()
