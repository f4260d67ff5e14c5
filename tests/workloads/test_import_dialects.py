"""`libra trace import --format openai` on the other chat dialects agent logs come in (dialects.py): the same
conversation written as OpenAI chat messages, Anthropic content blocks, Gemini parts and OpenAI Responses items
imports to the same trajectory; ShareGPT conversations, server-side tool results, code execution and bad items."""

from __future__ import annotations

import json

import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import StatusRules
from libra.workloads.importers.openai_chat import import_openai

S, U = "You are a booking agent with tools.", "Find my booking please."
A1, A2, A3 = "Let me look it up.", "That failed, trying another way.", "Your booking is B-9."
R1 = "booking B-9 found for the user"
R2 = "Traceback (most recent call last):\n  File x\nKeyError: 'id'"
ARGS1, ARGS2 = {"q": "booking"}, {"cmd": "grep B-9 db.txt"}


def words(text: str) -> int:
    """A count that adds up over the newline joins of a message's parts, so every dialect's split of one
    generation counts the same."""
    return len(text.split())


def _import(tmp_path, record, name="log.jsonl") -> list:
    path = tmp_path / name
    path.write_text(json.dumps(record) + "\n")
    return list(import_openai(path, count=words, rules=StatusRules()))


OPENAI = {
    "id": "task-1",
    "messages": [
        {"role": "system", "content": S},
        {"role": "user", "content": U},
        {
            "role": "assistant",
            "content": A1,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps(ARGS1)}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": R1},
        {
            "role": "assistant",
            "content": A2,
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "shell", "arguments": json.dumps(ARGS2)}}
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": R2},
        {"role": "assistant", "content": A3},
    ],
}
ANTHROPIC = {
    "id": "task-1",
    "system": S,
    "messages": [
        {"role": "user", "content": U},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": A1},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": ARGS1},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": R1}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": A2},
                {"type": "tool_use", "id": "t2", "name": "shell", "input": ARGS2},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": R2}],
                    "is_error": True,
                }
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": A3}]},
    ],
}
GEMINI = {
    "id": "task-1",
    "system": S,
    "contents": None,
    "messages": [
        {"role": "user", "parts": [{"text": U}]},
        {"role": "model", "parts": [{"text": A1}, {"functionCall": {"name": "lookup", "args": ARGS1}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"output": R1}}}]},
        {"role": "model", "parts": [{"text": A2}, {"function_call": {"name": "shell", "args": ARGS2}}]},
        {
            "role": "user",
            "parts": [{"function_response": {"name": "shell", "response": {"output": R2, "error": True}}}],
        },
        {"role": "model", "parts": [{"text": A3}]},
    ],
}
RESPONSES = {
    "id": "task-1",
    "messages": [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": S}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": U}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": A1}]},
        {"type": "function_call", "call_id": "r1", "name": "lookup", "arguments": json.dumps(ARGS1)},
        {"type": "function_call_output", "call_id": "r1", "output": R1},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": A2}]},
        {"type": "function_call", "call_id": "r2", "name": "shell", "arguments": json.dumps(ARGS2)},
        {"type": "function_call_output", "call_id": "r2", "output": R2},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": A3}]},
    ],
}


@pytest.mark.parametrize("record", [ANTHROPIC, GEMINI, RESPONSES], ids=["anthropic", "gemini", "responses"])
def test_every_dialect_imports_as_its_openai_twin(tmp_path, record) -> None:
    (ref,) = _import(tmp_path, OPENAI, "openai.jsonl")
    (got,) = _import(tmp_path, record)
    assert got.prompt_tokens == ref.prompt_tokens == words(S) + words(U)
    assert got.turns == ref.turns
    first, second, last = ref.turns
    assert (first.tool, first.tool_status, first.tool_tokens) == ("lookup", "ok", words(R1))
    assert (second.tool, second.tool_status, second.tool_tokens) == ("shell", "error", words(R2))
    assert first.gen_tokens == words(A1) + words("lookup") + words(json.dumps(ARGS1))
    assert last.tool is None and last.gen_tokens == words(A3)


def test_sharegpt_conversations(tmp_path) -> None:
    call1 = json.dumps({"name": "lookup", "arguments": ARGS1})
    record = {
        "id": "sg-1",
        "system": S,
        "tools": "[...]",
        "conversations": [
            {"from": "human", "value": U},
            {"from": "gpt", "value": A1},
            {"from": "function_call", "value": call1},
            {"from": "observation", "value": R1},
            {"from": "function_call", "value": "not json, a call all the same"},
            {"from": "observation", "value": R2},
            {"from": "gpt", "value": A3},
        ],
    }
    (t,) = _import(tmp_path, record)
    assert t.prompt_id == "sg-1" and t.prompt_tokens == words(S) + words(U)
    first, second, last = t.turns
    # the model's text and its call are one generation; the call's name comes from its JSON
    assert (first.gen_tokens, first.tool, first.tool_status) == (words(A1) + words(call1), "lookup", "ok")
    assert (second.tool, second.tool_status, second.tool_tokens) == ("tool", "error", words(R2))
    assert last.tool is None and last.gen_tokens == words(A3)
    assert t.extra == {"meta": {"tools": "[...]"}}  # the system prompt is counted, not kept as metadata


def test_anthropic_server_tool_result_splits_the_generation(tmp_path) -> None:
    """A server tool (web search) answers inside the assistant message: the text after its result is a new
    generation."""
    record = [
        {"role": "user", "content": U},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "search first"},
                {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"query": "B-9"}},
                {"type": "web_search_tool_result", "tool_use_id": "s1", "content": [{"type": "text", "text": R1}]},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": A3},
            ],
        },
    ]
    (t,) = _import(tmp_path, record)
    first, last = t.turns
    assert first.tool == "web_search" and first.tool_tokens == words(R1)
    assert first.gen_tokens == words("search first") + words("web_search") + words(json.dumps({"query": "B-9"}))
    assert last.tool is None and last.gen_tokens == words(A3)


def test_gemini_code_execution_outcomes(tmp_path) -> None:
    def run(outcome: str) -> str:
        record = [
            {"role": "user", "parts": [{"text": U}]},
            {"role": "model", "parts": [{"executableCode": {"language": "PYTHON", "code": "print(1)"}}]},
            {"role": "model", "parts": [{"codeExecutionResult": {"outcome": outcome, "output": "1"}}]},
            {"role": "model", "parts": [{"text": A3}]},
        ]
        (t,) = _import(tmp_path, record)
        assert t.turns[0].tool == "code_execution" and t.turns[0].tool_tokens == 1
        return t.turns[0].tool_status

    assert [run(o) for o in ("OUTCOME_OK", "OUTCOME_FAILED", "OUTCOME_DEADLINE_EXCEEDED")] == [
        "ok",
        "error",
        "timeout",
    ]


def test_role_aliases_in_plain_messages(tmp_path) -> None:
    plain = [
        {"role": "human", "content": U},
        {"role": "model", "content": A1},
        {"role": "user", "content": R1},
        {"role": "gpt", "content": A3},
    ]
    (t,) = _import(tmp_path, plain)
    assert t.prompt_tokens == words(U) and [x.gen_tokens for x in t.turns] == [words(A1), words(A3)]
    assert t.turns[0].tool == "user"


def test_an_item_of_no_dialect_is_a_one_line_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": U}, {"type": "mystery", "x": 1}]}) + "\n")
    with pytest.raises(TraceError, match=r"messages\[1\]\.role"):
        list(import_openai(bad, count=words, rules=StatusRules()))
    out = tmp_path / "out.jsonl"
    assert main(["trace", "import", str(bad), "--tokenizer", "bytes4", "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("libra:")]
    assert len(errors) == 1 and "bad.jsonl:1" in errors[0] and "messages[1].role" in errors[0]
    assert "Traceback" not in stderr and not out.exists()


def test_dialect_logs_round_trip_through_the_cli(tmp_path, capsys) -> None:
    src = tmp_path / "claude.jsonl"
    src.write_text("\n".join(json.dumps({**ANTHROPIC, "id": f"task-{i}"}) for i in range(3)) + "\n")
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "import", str(src), "--tokenizer", "bytes4", "--out", str(out)]) == 0
    trace = load_trace(out)
    assert len(trace) == 3 and all(t.turns[1].tool_status == "error" for t in trace)
    capsys.readouterr()
    assert main(["route-eval", "--trace", str(out), "--json"]) == 0


def test_error_flags_where_the_text_says_nothing(tmp_path) -> None:
    """Anthropic's `is_error` and an `error` in a Gemini function response mark a return whose text alone reads as
    a success."""
    benign = "permission denied for that table"
    anthropic = [
        {"role": "user", "content": U},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "sql", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": benign, "is_error": True}]},
        {"role": "assistant", "content": A3},
    ]
    gemini = [
        {"role": "user", "parts": [{"text": U}]},
        {"role": "model", "parts": [{"functionCall": {"name": "sql", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "sql", "response": {"error": benign}}}]},
        {"role": "model", "parts": [{"text": A3}]},
    ]
    for record in (anthropic, gemini):
        (t,) = _import(tmp_path, record)
        assert (t.turns[0].tool, t.turns[0].tool_status) == ("sql", "error")
    anthropic[2]["content"][0]["is_error"] = False
    (t,) = _import(tmp_path, anthropic)
    assert t.turns[0].tool_status == "ok"


def _lines(tmp_path, events, name="session.jsonl") -> list:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return list(import_openai(path, count=words, rules=StatusRules()))


def test_claude_code_transcripts(tmp_path) -> None:
    """One event per line: the message under `message`, one assistant reply split over lines (one per content
    block), tool results in user lines, summaries and a subagent's (sidechain) lines skipped; one trajectory per
    session."""

    def ev(kind, message, sid="s-1", **more):
        return {"type": kind, "sessionId": sid, "uuid": "u", "message": message, **more}

    events = [
        {"type": "summary", "summary": "Fixing a test", "leafUuid": "x"},
        ev("user", {"role": "user", "content": U}),
        ev("assistant", {"id": "m1", "role": "assistant", "content": [{"type": "thinking", "thinking": "look"}]}),
        ev(
            "assistant",
            {
                "id": "m1",
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}],
            },
        ),
        ev("user", {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": R1}]}),
        ev("assistant", {"role": "assistant", "content": [{"type": "text", "text": "sub"}]}, isSidechain=True),
        ev("assistant", {"id": "m2", "role": "assistant", "content": [{"type": "text", "text": A3}]}),
        ev("user", {"role": "user", "content": "another session"}, sid="s-2"),
        ev("assistant", {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, sid="s-2"),
    ]
    first, second = _lines(tmp_path, events)
    assert first.prompt_id == "s-1" and first.prompt_tokens == words(U)
    call, last = first.turns
    assert call.gen_tokens == words("look") + words("Bash") + words(json.dumps({"command": "ls"}))
    assert (call.tool, call.tool_tokens, call.tool_status) == ("Bash", words(R1), "ok")
    assert last.tool is None and last.gen_tokens == words(A3)
    assert second.prompt_id == "s-2" and [t.gen_tokens for t in second.turns] == [1]


def test_codex_rollouts(tmp_path) -> None:
    """Codex CLI rollouts: `response_item` payloads are the conversation (other lines skipped); a shell output's
    JSON gives its text and exit code."""
    failing = json.dumps({"output": "No such thing", "metadata": {"exit_code": 2, "duration_seconds": 0.1}})
    events = [
        {"type": "session_meta", "payload": {"id": "rollout-1", "cwd": "/w", "instructions": "be brief"}},
        {
            "type": "response_item",
            "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": U}]},
        },
        {"type": "turn_context", "payload": {"model": "gpt-5-codex"}},
        {"type": "response_item", "payload": {"type": "reasoning", "summary": [{"type": "summary_text", "text": A1}]}},
        {
            "type": "response_item",
            "payload": {"type": "function_call", "name": "shell", "arguments": json.dumps(ARGS2), "call_id": "c1"},
        },
        {"type": "event_msg", "payload": {"type": "token_count", "info": None}},
        {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "c1", "output": failing}},
        {
            "type": "response_item",
            "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": A3}]},
        },
    ]
    (t,) = _lines(tmp_path, events, "rollout-2026-01-01.jsonl")
    assert t.prompt_id == "rollout-2026-01-01" and t.prompt_tokens == words(U)
    call, last = t.turns
    assert call.gen_tokens == words(A1) + words("shell") + words(json.dumps(ARGS2))
    assert (call.tool, call.tool_tokens, call.tool_status) == ("shell", words("No such thing"), "error")
    assert last.gen_tokens == words(A3)
