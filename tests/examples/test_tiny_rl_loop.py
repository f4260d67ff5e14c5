"""The README's end-to-end example runs to completion on CPU and does what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.limits import scaled

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_rl_loop.py"


@pytest.mark.slow
@pytest.mark.timeout(scaled(900))
def test_tiny_rl_loop_runs_end_to_end() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=scaled(840),
        env=env,
        cwd=EXAMPLE.parent,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.count("started vLLM instance") >= 2
    assert re.search(r"C-MLFQ: [1-9]\d* migrations", out)  # routed and migrated
    assert re.search(r"train step \d+: 2 replica\(s\) with real gradients", out)  # the hybrid contributed
    sums = re.findall(r"lm_head sum trainer (-?[\d.]+), rollout-tp1-0 (-?[\d.]+)", out)
    assert sums and all(a == b for a, b in sums)  # new weights reached vLLM
    assert "hybrid-0 instance awake again" in out and "done in" in out
