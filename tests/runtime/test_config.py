"""Run configurations: defaults, the commented example file, and one-line errors (no engine starts here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.cli import main
from libra.runtime import RunConfig, RunConfigError, config_from_dict, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "run_config.yaml"


def test_the_example_file_is_the_default() -> None:
    assert load_config(EXAMPLE) == RunConfig()


def test_sections_and_overrides() -> None:
    c = config_from_dict({"max_staleness": 2, "virtual": {"gpus": 8, "gpus_per_node": 8}, "shift": None})
    assert c.max_staleness == 2 and c.virtual.gpus == 8 and c.shift is None and c.engine == RunConfig().engine


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"max_stalenes": 1}, "unknown setting(s) ['max_stalenes']"),
        ({"virtual": {"gpu_count": 4}}, "virtual.gpu_count"),
        ({"max_staleness": -1}, "max_staleness must be an integer >= 0"),
        ({"samples_per_prompt": 0}, "samples_per_prompt must be a whole number >= 1"),
        ({"steps": float("nan")}, "steps must be a whole number >= 1, got nan"),
        ({"steps": 2.0}, "steps must be a whole number >= 1, got 2.0"),
        ({"lr": float("inf")}, "lr must be a positive number, got inf"),
        ({"temperature": float("nan")}, "temperature must be a number >= 0, got nan"),
        ({"model": {}}, "model must be a model directory (a path) or null, got {}"),
        ({"prompts": []}, "at least one prompt"),
        ({"engine": 3}, "engine must be a mapping"),
        ({"hybrid": {"min_idle_fraction": 2}}, "min_idle_fraction must be in [0, 1]"),
        ({"waits": {"engine_missed_checks": 0}}, "engine_missed_checks must be a whole number >= 1"),
        ({"waits": {"engine_check_s": float("nan")}}, "engine_check_s must be a positive number, got nan"),
        # refused when read, not when the orchestrator builds the router after the engines started
        ({"router": "round-robin"}, "router must be one of fcfs, mlfq, predictor, oracle, cmlfq, got 'round-robin'"),
    ],
)
def test_bad_settings_name_the_setting(raw, needle) -> None:
    with pytest.raises(RunConfigError, match=None) as err:
        config_from_dict(raw)
    assert needle in str(err.value)


def test_cli_errors_are_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_staleness: [1\n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("libra: error:") and "not valid YAML" in err[0]
    bad.write_text("virtual: {gpus: 0}\n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "gpus must be a whole number >= 1" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to resume" in err[0]
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["run", "--config", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    bad.write_bytes(b"steps: 2\n\xff\n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8 (byte 0xff at offset 9)" in err[0]


def test_the_run_table_writes_staleness_as_pairs_least_stale_first() -> None:
    from libra.cli.run import staleness_cell

    assert staleness_cell({"10": 1, "1": 3, "0": 13}) == "0:13 1:3 10:1"
    assert staleness_cell({}) == "-"
