"""`libra trace generate`."""

from __future__ import annotations

import json

from libra.cli import main
from libra.workloads import load_trace
from libra.workloads.generators import WorkloadGenerator


def one_error_line(err: str) -> bool:
    """Logs may precede it, but the error itself is one line and there is no traceback."""
    return "Traceback" not in err and sum(line.startswith("libra:") for line in err.splitlines()) == 1


def test_generate_writes_a_loadable_trace(tmp_path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    assert (
        main(
            [
                "trace",
                "generate",
                "--workload",
                "r2e-gym",
                "--steps",
                "2",
                "--seed",
                "3",
                "--prompts",
                "4",
                "--samples",
                "2",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["trajectories"] == 16 and summary["out"] == str(out) and summary["workload"] == "r2e-gym"
    trajectories = load_trace(out)
    gen = WorkloadGenerator("r2e-gym", seed=3, num_prompts=4, samples_per_prompt=2)
    assert trajectories == gen.step(0) + gen.step(1)


def test_defaults_and_table(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "generate"]) == 0
    text = capsys.readouterr().out
    assert "wrote 1024 synthetic trajectories" in text and "mean_tokens" in text
    assert len(load_trace(tmp_path / "search-r1-trace.jsonl")) == 1024
    assert main(["trace"]) == 0  # the bare command generates with the defaults too


def test_errors_are_one_line(tmp_path, capsys) -> None:
    assert main(["trace", "generate", "--workload", "swe", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert one_error_line(err) and "unknown workload 'swe'" in err
    assert main(["trace", "generate", "--steps", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--steps must be between 1" in capsys.readouterr().err
    assert main(["trace", "generate", "--out", str(tmp_path / "missing-dir" / "x.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_bad_status_pattern_names_itself_only(tmp_path, capsys) -> None:
    log = tmp_path / "chat.jsonl"
    log.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})
    )
    argv = ["trace", "import", str(log), "--out", str(tmp_path / "t.jsonl"), "--error-pattern", "("]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "libra: error: --error-pattern '(' is not a regular expression: missing ), unterminated subpattern "
        "at position 0"
    )
    assert not (tmp_path / "t.jsonl").exists()
