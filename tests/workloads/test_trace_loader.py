"""The trace loader keeps unknown keys, derives lengths, and names file, line and field on bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from libra.workloads import TraceError, group_by_step, load_trace, profile_from_trajectories, write_trace

GOOD = {
    "prompt_id": "p-17",
    "sample": 3,
    "step": 12,
    "prompt_tokens": 512,
    "source": "r2e",
    "turns": [
        {"gen_tokens": 230, "tool": "search", "tool_status": "ok", "tool_tokens": 1800},
        {"gen_tokens": 120, "tool": None, "tool_status": None, "tool_tokens": 0},
    ],
    "reward": 1.0,
}


def _write(tmp_path, lines) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_round_trip_keeps_unknown_keys_and_lengths(tmp_path) -> None:
    trajs = load_trace(_write(tmp_path, [GOOD, {**GOOD, "step": 13, "sample": 4}]))
    t = trajs[0]
    assert t.total_tokens == 512 + 230 + 1800 + 120 and t.gen_tokens == 350 and t.num_tool_calls == 1
    assert t.extra == {"source": "r2e"} and t.context_after(1) == 512 + 230 + 1800
    out = tmp_path / "copy.jsonl"
    write_trace(out, trajs)
    again = load_trace(out)
    assert again == trajs and again[0].extra == {"source": "r2e"}
    assert [len(s) for s in group_by_step(again)] == [1, 1]


@pytest.mark.parametrize(
    "line,field",
    [
        ("{not json", None),
        ({**GOOD, "prompt_tokens": -1}, "prompt_tokens"),
        ({**GOOD, "turns": []}, "turns"),
        (
            {**GOOD, "turns": [{"gen_tokens": 5, "tool": "bash", "tool_status": "crashed", "tool_tokens": 3}]},
            "turns[0].tool_status",
        ),
        (
            {**GOOD, "turns": [{"gen_tokens": 5, "tool": None, "tool_tokens": 0}, {"gen_tokens": 5, "tool": None}]},
            "turns[0].tool",
        ),
        ({k: v for k, v in GOOD.items() if k != "prompt_id"}, "prompt_id"),
        ({**GOOD, "reward": "high"}, "reward"),
        # integers beyond any float: one clear error, not an OverflowError from the finiteness check
        ({**GOOD, "reward": 10**400}, "reward"),
        (
            {**GOOD, "turns": [{"gen_tokens": 5, "tool": "bash", "tool_status": "ok", "tool_latency_s": -(10**400)}]},
            "turns[0].tool_latency_s",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, field) -> None:
    path = _write(tmp_path, [GOOD, line])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 2 and info.value.path == path and info.value.field == field
    assert f"{path}:2:" in str(info.value)


def test_trajectory_cut_off_on_a_tool_turn_is_valid(tmp_path) -> None:
    cut = {**GOOD, "turns": [{"gen_tokens": 10, "tool": "bash", "tool_status": "timeout", "tool_tokens": 50}]}
    assert load_trace(_write(tmp_path, [cut]))[0].total_tokens == 512 + 60


def test_empty_and_missing_files(tmp_path) -> None:
    with pytest.raises(TraceError, match="no trajectories"):
        load_trace(_write(tmp_path, [""]))
    with pytest.raises(TraceError, match="cannot open"):
        load_trace(tmp_path / "nope.jsonl")


def test_profile_window_shows_drift(tmp_path) -> None:
    early = [{**GOOD, "step": 0, "sample": i} for i in range(4)]
    late_turns = [{"gen_tokens": 4000, "tool": None, "tool_status": None, "tool_tokens": 0}]
    late = [{**GOOD, "step": 1, "sample": i, "turns": late_turns} for i in range(4)]
    trajs = load_trace(_write(tmp_path, early + late))
    whole = profile_from_trajectories(trajs)
    recent = profile_from_trajectories(trajs, window_steps=1)
    assert recent.mean_length > whole.mean_length and recent.num_samples == 4


def test_a_gzipped_trace_loads_as_the_plain_one_whatever_its_name(tmp_path) -> None:
    """Told by its first two bytes, not its name: the corpus ships `.jsonl.gz` files; a renamed one loads too."""
    plain = _write(tmp_path, [GOOD, {**GOOD, "step": 13, "sample": 4}])
    data = gzip.compress(Path(plain).read_bytes())
    for name in ("t.jsonl.gz", "renamed.jsonl"):
        (tmp_path / name).write_bytes(data)
        assert load_trace(tmp_path / name) == load_trace(plain)


@pytest.mark.parametrize("cut", [12, 60, -9])  # inside the header, inside the stream, inside the checksum trailer
def test_a_broken_gzipped_trace_is_one_clear_error(tmp_path, cut: int) -> None:
    data = gzip.compress(Path(_write(tmp_path, [GOOD] * 20)).read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[:cut])
    with pytest.raises(TraceError, match="cannot read trace") as info:
        load_trace(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
