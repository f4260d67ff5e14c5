"""`libra route-eval`."""

from __future__ import annotations

import json

import pytest

from libra.cli import main
from libra.workloads import write_trace
from libra.workloads.generators import generate

KEYS = {
    "policy",
    "trajectories",
    "routing_accuracy",
    "migrated_token_fraction",
    "migrations_per_trajectory",
    "confusion",
}


def one_error_line(err: str) -> bool:
    """Logs may precede it, but the error itself is one line and there is no traceback."""
    return "Traceback" not in err and sum(line.startswith("libra:") for line in err.splitlines()) == 1


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "search.jsonl"
    write_trace(path, generate("search-r1", num_steps=4, seed=1, num_prompts=16))
    return path


def test_json_contract(trace_file, capsys) -> None:
    assert (
        main(
            [
                "route-eval",
                "--trace",
                str(trace_file),
                "--policy",
                "cmlfq",
                "--buckets",
                "2:5000,4:15000,8:inf",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= KEYS
    assert result["policy"] == "cmlfq" and result["trajectories"] == 1024
    assert len(result["confusion"]) == 3 and sum(map(sum, result["confusion"])) == 1024
    assert 0 <= result["routing_accuracy"] <= 1


def test_all_policies_and_options(trace_file, capsys) -> None:
    assert main(["route-eval", "--trace", str(trace_file), "--policy", "all", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    policies = result["policies"]
    assert set(policies) == {"cmlfq", "mlfq", "predictor", "most-common", "oracle", "fcfs"}
    assert policies["oracle"]["routing_accuracy"] == 1.0
    # the target line: cmlfq against the best of the four baselines (not the oracle), as issue 14 counts it
    target = result["target"]
    best = max(("fcfs", "mlfq", "predictor", "most-common"), key=lambda b: policies[b]["routing_accuracy"])
    assert target["best_baseline"] == best
    assert target["margin"] == pytest.approx(policies["cmlfq"]["routing_accuracy"] - policies[best]["routing_accuracy"])
    assert target["migrated_tokens"] == policies["cmlfq"]["migrated_token_fraction"]
    assert target["met"] == (target["margin"] >= 0.05 - 1e-12 and target["migrated_tokens"] <= 0.12)
    assert policies["most-common"]["migrations_per_trajectory"] == 0  # a constant guess never moves
    assert (
        main(
            [
                "route-eval",
                "--trace",
                str(trace_file),
                "--policy",
                "predictor",
                "--option",
                "mode=most_common",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["migrations_per_trajectory"] == 0
    assert (
        main(
            [
                "route-eval",
                "--trace",
                str(trace_file),
                "--option",
                "rule=median",
                "--option",
                "size_edges=1000,4000",
                "--admit",
                "predicted",
                "--unique-prompts",
            ]
        )
        == 0
    )
    assert "bucket confusion" in capsys.readouterr().out


def test_no_arguments_runs_on_a_default_trace(capsys) -> None:
    assert main(["route-eval", "--steps", "2", "--prompts", "8"]) == 0  # the default, made smaller for speed
    out = capsys.readouterr().out
    assert "cmlfq" in out and "TP8<=inf" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--buckets", ""], "empty bucket spec"),
        (["--buckets", "4:15000,2:5000"], "increase"),
        (["--policy", "sjf"], "unknown policy 'sjf'"),
        (["--option", "rule"], "KEY=VALUE"),
        (["--option", "rule=vote"], "rule must be"),
        (["--workload", "swe"], "unknown workload"),
    ],
)
def test_errors_are_one_line(argv, message, capsys) -> None:
    assert main(["route-eval", "--steps", "1", "--prompts", "2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and one_error_line(err)


def test_bad_trace_files(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt_id": "p", "prompt_tokens": 10, "turns": [{"gen_tokens": 5, "tool": "search", '
        '"tool_status": "exploded", "tool_tokens": 3}]}\n'
    )
    assert main(["route-eval", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "tool_status" in err
    assert main(["route-eval", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot open trace: it does not exist" in capsys.readouterr().err  # as plan and simulate say


def test_unknown_tool_for_a_closed_tool_set(trace_file, capsys) -> None:
    assert main(["route-eval", "--trace", str(trace_file), "--option", "tools=bash,python"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown tool 'search'" in err and one_error_line(err)


def test_a_trace_and_a_workload_are_refused_together(trace_file, capsys) -> None:
    """--workload names the synthetic trace used without --trace: given with one it is refused, as in `plan` and
    `simulate`, not ignored."""
    with pytest.raises(SystemExit) as exc:
        main(["route-eval", "--trace", str(trace_file), "--workload", "r2e-gym"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "not allowed with argument --trace" in err and len(err.splitlines()) == 1


def test_policy_all_says_whether_cmlfq_meets_the_target(capsys) -> None:
    """The text output ends with the target line; on a held-out source the default meets (StarChat's SQL runs:
    +10.3 points over the predictor at 8.0 %, docs/routing.md) and on one it misses (text-davinci-003's Bash runs:
    +1.0 over MLFQ) it says so."""
    from libra.workloads.corpus import DEFAULT_CORPUS

    lines = {}
    for name in ("intercode-sql-starchat", "intercode-bash-davinci003"):
        trace = DEFAULT_CORPUS / "held-out" / f"{name}.jsonl.gz"
        assert main(["route-eval", "--trace", str(trace), "--buckets", "quantiles", "--policy", "all"]) == 0
        lines[name] = capsys.readouterr().out.strip().splitlines()[-1]
    assert lines["intercode-sql-starchat"] == (
        "cmlfq against the best baseline (predictor): +10.3 points of accuracy at 8.0 % migrated tokens; "
        "target (>= +5 points at <= 12 %): met"
    )
    assert lines["intercode-bash-davinci003"].startswith("cmlfq against the best baseline (mlfq): +1.0 points")
    assert lines["intercode-bash-davinci003"].endswith(": not met")
