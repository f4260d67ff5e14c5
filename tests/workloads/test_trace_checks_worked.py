"""`Turn` and `Trajectory` validation and the writer's checks (libra/workloads/trace.py), checked where mutation
testing found them unchecked (`scripts/mutation.sh trace_values`, docs/testing.md): a value one step past the
one-expression fast path of `Turn`, every limit itself, the messages (the loader shares them, so comparing with
the loader could not catch a changed one), the common turns taking the fast path, and the writer's line."""

from __future__ import annotations

import re

import pytest

import libra.workloads.trace as trace
from libra.workloads import TraceError, Trajectory, Turn, write_trace
from libra.workloads.trace import MAX_TOKENS, MAX_TOOL_LATENCY_S, MAX_TURNS

COUNT = f"must be an integer in [0, {MAX_TOKENS:,}]"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"tool_tokens": 1}, "tool_tokens", "must be 0 when tool is null"),
        ({"tool_status": "ok"}, "tool_status", "must be null when tool is null"),
        ({"tool": "bash", "tool_tokens": 2.0}, "tool_tokens", f"{COUNT}, got 2.0"),
        ({"tool": "bash", "tool_tokens": True}, "tool_tokens", f"{COUNT}, got True"),
        ({"extra": None}, "extra", "must be a dict of the unknown keys, got NoneType"),
        ({"extra": []}, "extra", "must be a dict of the unknown keys, got list"),
        (
            {"tool": "bash", "extra": {"tool_latency_s": 1.0, "tool": "x"}},
            "extra",
            "key 'tool' is a field of the schema: set the field, not extra",
        ),
    ],
)
def test_a_turn_just_past_the_fast_path_is_refused_with_the_schema_message(fields, field, message) -> None:
    with pytest.raises(TraceError, match=f"^Turn: field '{field}': {re.escape(message)}$"):
        Turn(gen_tokens=5, **fields)


def test_each_limit_itself_is_allowed() -> None:
    """A day of tool latency (an int, which the fast path leaves to the rules), a trajectory of one token, and one
    of `MAX_TURNS` turns."""
    assert Turn(gen_tokens=1, tool="bash", extra={"tool_latency_s": 86_400}).extra == {"tool_latency_s": 86_400}
    assert Trajectory(prompt_id="p", prompt_tokens=1, turns=(Turn(gen_tokens=0),)).total_tokens == 1
    assert Trajectory(prompt_id="p", prompt_tokens=0, turns=(Turn(gen_tokens=1),)).total_tokens == 1
    turns = (Turn(gen_tokens=1, tool="bash"),) * (MAX_TURNS - 1) + (Turn(gen_tokens=1),)
    assert len(Trajectory(prompt_id="p", prompt_tokens=1, turns=turns).turns) == MAX_TURNS


def test_a_trajectory_names_what_it_refuses() -> None:
    with pytest.raises(
        TraceError, match=r"^Trajectory: field 'turns\[0\].tool': only the last turn may have no tool call$"
    ):
        Trajectory(prompt_id="p", prompt_tokens=1, turns=(Turn(gen_tokens=1), Turn(gen_tokens=1)))
    with pytest.raises(TraceError, match=r"^Trajectory: field 'reward': must be a finite number or null, got nan$"):
        Trajectory(prompt_id="p", prompt_tokens=1, turns=(Turn(gen_tokens=1),), reward=float("nan"))


def test_the_common_turns_pass_the_fast_path_without_the_rules(monkeypatch) -> None:
    """The loader builds millions of turns: every turn of the common shapes (no tool; a tool of each status; a float
    latency), at the limits of its counts, passes the one expression, never reaching the rule-by-rule check."""

    def rules(turn: Turn) -> None:
        raise AssertionError(f"{turn!r} left the fast path")

    monkeypatch.setattr(trace, "_turn_error", rules)
    for g in (0, 1, MAX_TOKENS):
        Turn(gen_tokens=g)
        for status in ("ok", "error", "timeout"):
            for n in (0, 1, MAX_TOKENS):
                Turn(gen_tokens=g, tool="bash", tool_status=status, tool_tokens=n)
            for latency in (0.0, 0.5, MAX_TOOL_LATENCY_S):
                Turn(gen_tokens=g, tool="bash", tool_status=status, extra={"tool_latency_s": latency})
    with pytest.raises(AssertionError, match="left the fast path"):
        Turn(gen_tokens=1, tool="bash", extra={"tool_latency_s": 1})  # an int latency: the rules decide


def _traj(**extra) -> Trajectory:
    turns = (Turn(gen_tokens=5, tool="bash", tool_tokens=3), Turn(gen_tokens=7))
    return Trajectory(prompt_id="p", prompt_tokens=10, turns=turns, reward=0.5, extra=extra)


def test_the_writer_writes_each_trajectory_as_one_compact_json_line(tmp_path) -> None:
    """No spaces after the separators: a line within the loader's `MAX_LINE_BYTES` as written stays within it, and
    a trace rewritten keeps its bytes."""
    path = tmp_path / "t.jsonl"
    write_trace(path, [_traj(note={"a": [1, 2]})])
    expected = (
        '{"prompt_id":"p","prompt_tokens":10,"turns":[{"gen_tokens":5,"tool":"bash","tool_status":"ok",'
        '"tool_tokens":3},{"gen_tokens":7,"tool":null,"tool_status":null,"tool_tokens":0}],"reward":0.5,'
        '"note":{"a":[1,2]}}\n'
    )
    assert path.read_text() == expected


def test_the_writer_says_why_json_cannot_hold_a_field(tmp_path) -> None:
    """The reason JSON gives (a NaN), or "nested too deeply" for nesting past the recursion limit, with the path."""
    path = tmp_path / "w.jsonl"
    with pytest.raises(TraceError) as info:
        write_trace(path, [_traj(a=[float("nan")])])
    assert info.value.path == str(path) and str(info.value).startswith(f"{path}:1: field 'a': ")
    assert re.search(r"cannot be written as JSON \(Out of range float values are not JSON compliant", str(info.value))
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TraceError) as info:
        write_trace(path, [_traj(a=deep)])
    assert str(info.value) == f"{path}:1: field 'a': cannot be written as JSON (nested too deeply)"
