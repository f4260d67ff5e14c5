"""`libra trace import --format atif`: Harbor's Agent Trajectory Interchange Format (steps of system, user and
agent; tool calls answered by observation results; the model's own completion counts where a step states them)."""

from __future__ import annotations

import json

import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import StatusRules, import_files
from libra.workloads.importers.atif import import_atif


def words(text: str) -> int:
    return len(text.split())


SYSTEM, TASK = "You are a terminal agent.", "Make the tests pass in /app please."
OUT1, OUT2 = "collected 3 items\n3 failed", "bash: pytestt: command not found"


def _atif(**over) -> dict:
    doc = {
        "schema_version": "ATIF-v1.7",
        "session_id": "sess-1",
        "agent": {"name": "terminus-2", "version": "0.20.0", "model_name": "some-model"},
        "extra": {"task_id": "fix-tests"},
        "steps": [
            {"step_id": 1, "source": "system", "message": SYSTEM},
            {"step_id": 2, "source": "user", "message": TASK},
            {
                "step_id": 3,
                "source": "agent",
                "message": "Run the tests first.",
                "reasoning_content": "check state",
                "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "pytest -q"}}],
                "observation": {"results": [{"source_call_id": "c1", "content": OUT1}]},
            },
            {
                "step_id": 4,
                "source": "agent",
                "message": "Again.",
                "tool_calls": [
                    {"tool_call_id": "c2", "function_name": "shell", "arguments": "pytestt"},
                    {"tool_call_id": "c3", "function_name": "read", "arguments": {"path": "a.py"}},
                ],
                "observation": {
                    "results": [
                        {"source_call_id": "c3", "content": [{"type": "text", "text": "x = 1"}]},
                        {"source_call_id": "c2", "content": OUT2},
                    ]
                },
                "metrics": {"prompt_tokens": 900, "completion_tokens": 57},
            },
            {"step_id": 5, "source": "user", "message": "Any luck?"},
            {"step_id": 6, "source": "agent", "message": "Done."},
        ],
    }
    doc.update(over)
    return doc


def _import(tmp_path, value, name="trajectory.json"):
    path = tmp_path / name
    path.write_text(json.dumps(value))
    return list(import_atif(path, count=words, rules=StatusRules()))


def test_atif_steps_become_turns(tmp_path) -> None:
    (t,) = _import(tmp_path, _atif(reward=1.0))
    assert t.prompt_id == "fix-tests" and t.reward == 1.0 and t.prompt_tokens == words(SYSTEM) + words(TASK)
    first, second, last = t.turns
    assert first.gen_tokens == words("Run the tests first.") + words("check state") + words("bash") + words(
        json.dumps({"cmd": "pytest -q"})
    )
    assert (first.tool, first.tool_status, first.tool_tokens) == ("bash", "ok", words(OUT1))
    # the model's own count where the step states it; results named by the call they answer, in any order; the
    # user's later message goes back into the context with them
    assert second.gen_tokens == 57 and second.tool == "read" and second.tool_status == "error"
    assert second.tool_tokens == words("x = 1") + words(OUT2) + words("Any luck?")
    assert second.extra == {"tools": ["read", "shell", "user"]}
    assert last.tool is None and last.gen_tokens == words("Done.")
    assert t.extra["meta"] == {
        "schema_version": "ATIF-v1.7",
        "session_id": "sess-1",
        "agent_name": "terminus-2",
        "agent_version": "0.20.0",
        "agent_model_name": "some-model",
    }


def test_files_of_many_trajectories_and_their_names(tmp_path) -> None:
    lines = tmp_path / "many.jsonl"
    docs = [_atif(extra={}, session_id=f"s{i}") for i in range(3)]
    lines.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    trajs = import_files("atif", [str(lines)], tokenizer="bytes4")
    assert [t.prompt_id for t in trajs] == ["s0", "s1", "s2"]
    listed = _import(tmp_path, [_atif(extra={}, session_id=None, trajectory_id=None)] * 2, "list.json")
    assert [t.prompt_id for t in listed] == ["list-0", "list-1"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"schema_version": "ATIF-v1.7"}, "expected an ATIF trajectory"),
        ({"steps": [{"source": "robot", "message": "hi"}]}, "steps[0].source"),
        ({"steps": ["not a step"]}, "steps[0]"),
        ({"steps": [{"source": "user", "message": "only a prompt"}]}, "no model generation"),
    ],
)
def test_bad_atif_is_a_one_line_error(tmp_path, value, message) -> None:
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _import(tmp_path, value)


def test_atif_round_trips_through_the_cli(tmp_path, capsys) -> None:
    src = tmp_path / "trajectory.json"
    src.write_text(json.dumps(_atif()))
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "import", "--format", "atif", str(src), "--tokenizer", "bytes4", "--out", str(out)]) == 0
    (t,) = load_trace(out)
    assert t.turns[1].gen_tokens == 57 and t.turns[1].tool_status == "error"
    capsys.readouterr()
    for cmd in (["route-eval"], ["simulate", "--steps", "1", "--out", str(tmp_path / "sim"), "--no-plots"]):
        assert main([*cmd, "--trace", str(out), "--json"]) == 0, cmd
