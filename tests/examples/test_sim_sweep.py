"""`examples/sim_sweep.py` (the docs/sim.md batch sweep) runs and prints one row per workload and batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "sim_sweep.py"


def _load():
    spec = importlib.util.spec_from_file_location("sim_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_per_workload_and_batch(capsys) -> None:
    sweep = _load()
    args = [
        "--workloads",
        "search-r1,dapo-math",
        "--prompts",
        "4,8",
        "--samples",
        "4",
        "--steps",
        "2",
        "--gpus",
        "16",
        "--workers",
        "1",
    ]
    assert sweep.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 + 4
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[4:] == [p for p in sweep.POLICY_NAMES if p != "colocated"]
    for line, (workload, prompts) in zip(
        lines[2:], [("search-r1", 4), ("search-r1", 8), ("dapo-math", 4), ("dapo-math", 8)], strict=True
    ):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == f"{workload} (2)" and cells[1] == str(prompts)
        ratios = [float(c.strip("*")) for c in cells[4:]]
        assert all(r > 0 for r in ratios) and sum(c.startswith("**") for c in cells[4:]) >= 1
        assert 0.0 <= float(cells[3]) < 1.0


def test_bad_input_is_one_line(tmp_path, capsys) -> None:
    sweep = _load()
    bad = tmp_path / "c.yaml"
    bad.write_text("decode_mfu: 3\n")
    assert sweep.main(["--coeffs", str(bad), "--workloads", "search-r1", "--prompts", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sim_sweep: error:") and "decode_mfu" in err[-1]
    assert sweep.main(["--workloads", "chess", "--prompts", "4", "--steps", "1", "--gpus", "16"]) == 2
    assert "unknown workload" in capsys.readouterr().err
