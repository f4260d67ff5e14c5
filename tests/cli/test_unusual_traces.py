"""Valid but unusual traces (tests/cli/unusual_traces.py) through `route-eval`, `plan` and `simulate`.

The CLI contract (README, docs/design.md): a valid input gives a result, or, where the command truly cannot answer,
one error line and a non-zero exit; never a traceback, NaN or inf in the JSON, or a number over nothing. A JSON
null stands only where the contract says so: the top bucket's unbounded `max_tokens`, a profile's `max_tool_s` with
no timed call, and `steady_throughput_tok_s` of a one-step run.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from libra.cli import main
from libra.workloads import load_trace
from tests.cli.unusual_traces import CASES, SLOW_CASES, write_case

QUICK = sorted(set(CASES) - SLOW_CASES)
FIXED_BUCKETS = "1:8000,2:16000,4:32000,8:inf"
# cases whose trajectories no instance's KV cache holds (near the schema's 10,000,000 tokens): refused in one line
NO_KV = frozenset({"huge_tool_returns", "max_prompts"})
_NULL_OK = ("max_tokens", "max_tool_s", "steady_throughput_tok_s")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unusual")
    for name in QUICK:
        write_case(name, folder)
    return folder


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in the JSON output")


def _parse(out: str) -> dict[str, Any]:
    return json.loads(out, parse_constant=_no_constant)


def _nulls(value: Any, where: str = "") -> list[str]:
    """The paths of the nulls in `value` that the contract does not allow."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nulls(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{where}[{i}]")]
    if value is None and not where.endswith(_NULL_OK):
        return [where]
    return []


def _run(argv: list[str], capsys) -> tuple[int, dict[str, Any] | None, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err, captured.err
    if rc != 0:
        errors = [line for line in captured.err.splitlines() if line.startswith("libra:")]
        assert rc == 2 and len(errors) == 1 and captured.out == "", captured.err
        return rc, None, errors[0]
    out = _parse(captured.out)
    assert not _nulls(out), _nulls(out)
    return rc, out, captured.err


def _check_route_result(result: dict[str, Any], trajectories: int) -> None:
    assert result["trajectories"] == trajectories
    assert sum(map(sum, result["confusion"])) == trajectories
    for key in ("routing_accuracy", "final_bucket_accuracy"):
        assert 0 <= result[key] <= 1
    assert result["routing_accuracy"] <= result["final_bucket_accuracy"]
    assert result["migrated_token_fraction"] >= 0 and result["migrations_per_trajectory"] >= 0
    assert result["total_tokens"] > 0


@pytest.mark.parametrize("name", QUICK)  # (the long case is read back in test_twenty_thousand_trajectories)
def test_every_case_is_valid_and_reads_back_equal(name, tmp_path) -> None:
    trajectories = CASES[name]()
    assert trajectories, name
    assert load_trace(write_case(name, tmp_path)) == trajectories


@pytest.mark.parametrize("name", QUICK)
def test_route_eval_quantiles_every_policy(name, traces, capsys) -> None:
    path = traces / f"{name}.jsonl"
    argv = ["route-eval", "--trace", str(path), "--buckets", "quantiles", "--policy", "all", "--json"]
    rc, out, _ = _run(argv, capsys)
    assert rc == 0 and out is not None
    assert len(out["policies"]) == 6  # the five routers and the most-common baseline
    for result in out["policies"].values():
        _check_route_result(result, len(load_trace(path)))
    assert out["policies"]["oracle"]["routing_accuracy"] == 1.0  # it knows every final length


@pytest.mark.parametrize("name", QUICK)
def test_route_eval_fixed_buckets(name, traces, capsys) -> None:
    path = traces / f"{name}.jsonl"
    rc, out, _ = _run(["route-eval", "--trace", str(path), "--buckets", FIXED_BUCKETS, "--json"], capsys)
    assert rc == 0 and out is not None
    _check_route_result(out, len(load_trace(path)))
    assert main(["route-eval", "--trace", str(path), "--buckets", FIXED_BUCKETS]) == 0  # the table too
    assert "accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("name", QUICK)
def test_plan(name, traces, capsys) -> None:
    rc, out, err = _run(["plan", "--trace", str(traces / f"{name}.jsonl"), "--json"], capsys)
    if name in NO_KV:
        assert rc == 2 and "KV cache" in err
        return
    assert rc == 0 and out is not None
    assert math.isfinite(out["makespan_s"]) and out["makespan_s"] >= out["lower_bound_s"] > 0
    assert out["train"]["gpus"] + out["rollout"]["gpus"] == 48


@pytest.mark.parametrize("resample", [False, True], ids=["as-recorded", "resampled"])
@pytest.mark.parametrize("name", QUICK)
def test_simulate(name, resample, traces, tmp_path, capsys) -> None:
    argv = ["simulate", "--trace", str(traces / f"{name}.jsonl"), "--policy", "colocated,libra", "--workers", "1"]
    argv += ["--resample", "--steps", "3"] if resample else []
    rc, out, err = _run([*argv, "--no-plots", "--out", str(tmp_path), "--json"], capsys)
    if name in NO_KV:
        assert rc == 2 and "KV cache" in err
        return
    assert rc == 0 and out is not None
    for summary in out["policies"].values():
        assert summary["throughput_tok_s"] > 0 and summary["mean_step_s"] > 0
        assert 0 <= summary["gpu_idle_fraction"] <= 1
        assert (summary["steady_throughput_tok_s"] is None) == (out["steps"] == 1)


def test_a_byte_order_mark_opening_the_file_is_read_past(traces, tmp_path, capsys) -> None:
    """Windows tools open a UTF-8 file with a byte order mark: the trace is still valid UTF-8 JSON Lines, plain or
    gzipped (it was refused as "not valid JSON" at line 1)."""
    body = (traces / "distinct_prompts.jsonl").read_bytes().replace(b"\n", b"\r\n")
    plain, packed = tmp_path / "bom.jsonl", tmp_path / "bom.jsonl.gz"
    plain.write_bytes(b"\xef\xbb\xbf" + body)
    packed.write_bytes(gzip.compress(b"\xef\xbb\xbf" + body))
    expected = load_trace(traces / "distinct_prompts.jsonl")
    assert load_trace(plain) == expected and load_trace(packed) == expected
    rc, out, _ = _run(["route-eval", "--trace", str(plain), "--json"], capsys)
    assert rc == 0 and out is not None and out["trajectories"] == len(expected)


def test_quantile_buckets_left_empty_are_noted(traces, capsys) -> None:
    """Every trajectory of one length: the quartile edges coincide, are pushed a token apart, and three buckets hold
    nothing; the scores are over one bucket, which a note on stderr says (it went unsaid)."""
    for name, noted in (("one_quartile", True), ("all_identical", True), ("distinct_prompts", False)):
        rc, out, err = _run(
            ["route-eval", "--trace", str(traces / f"{name}.jsonl"), "--buckets", "quantiles", "--json"], capsys
        )
        assert rc == 0 and out is not None
        assert ("leave 3 of 4 with no trajectory" in err) == noted, (name, err)
        assert sum(1 for row in out["confusion"] if sum(row)) == (1 if noted else 4)


def test_trajectories_longer_than_max_len_are_noted(traces, tmp_path, capsys) -> None:
    """A trace of a longer-context model: rollout runs its trajectories whole while training prices them cut at
    --max-len, which a note on stderr says (the plan's training was priced 40 % lower, unsaid)."""
    path = traces / "over_context.jsonl"
    longest = max(t.total_tokens for t in load_trace(path))
    for argv in (
        ["plan", "--trace", str(path)],
        ["simulate", "--trace", str(path), "--policy", "libra", "--no-plots", "--out", str(tmp_path)],
    ):
        rc, _, err = _run([*argv, "--json"], capsys)
        assert rc == 0 and f"32 of 32 trajectories are longer than --max-len 40,960 (up to {longest:,} tokens)" in err
        rc, _, err = _run([*argv, "--max-len", str(longest), "--json"], capsys)
        assert rc == 0 and "longer than --max-len" not in err
    rc, _, err = _run(["plan", "--trace", str(traces / "distinct_prompts.jsonl"), "--json"], capsys)
    assert rc == 0 and "longer than --max-len" not in err


@pytest.mark.slow
def test_twenty_thousand_trajectories(tmp_path, capsys) -> None:
    """The long case through every command (benchmarks time it; here only the contract)."""
    path = write_case("twenty_thousand", tmp_path)
    assert len(load_trace(path)) == 20_000
    rc, out, _ = _run(
        ["route-eval", "--trace", str(path), "--buckets", "quantiles", "--policy", "all", "--json"], capsys
    )
    assert rc == 0 and out is not None
    for result in out["policies"].values():
        _check_route_result(result, 20_000)
    rc, out, _ = _run(["plan", "--trace", str(path), "--json"], capsys)
    assert rc == 0 and out is not None and out["workload"]["requests_per_step"] == 2_000
    for extra in ([], ["--resample", "--steps", "3"]):
        argv = ["simulate", "--trace", str(path), *extra, "--workers", "1", "--no-plots", "--out", str(tmp_path)]
        rc, out, _ = _run([*argv, "--json"], capsys)
        assert rc == 0 and out is not None and out["steps"] == (3 if extra else 10)
