"""`libra trace import --format openai` on Gemini CLI and Qwen Code session files (gemini_cli.py): one conversation
written as a Gemini CLI session (JSON and JSON Lines), a Qwen Code session and a `/chat save` checkpoint imports
to the same trajectory as its OpenAI chat twin.

The fixtures are built by hand from the recording code of google-gemini/gemini-cli (commit 5411f113,
`packages/core/src/services/chatRecordingService.ts`, `chatRecordingTypes.ts`, `core/logger.ts`) and
QwenLM/qwen-code (`packages/core/src/services/chatRecordingService.ts`): no real session file with a clear licence
was found to copy."""

from __future__ import annotations

import json

import pytest

from libra.workloads.importers import StatusRules
from libra.workloads.importers.openai_chat import import_openai

U = "Find my booking please."
A1, A2, A3 = "Let me look it up.", "That failed, trying another way.", "Your booking is B-9."
SUBJECT, THOUGHT = "Planning", "I should search the bookings first."
R1 = "booking B-9 found for the user"
R2 = "permission denied reading db.txt"  # no error text rule matches it: only the recorded status says so
ARGS1, ARGS2 = {"q": "booking"}, {"command": "cat db.txt"}
SID = "5f0c2a1e-session"

OPENAI = {
    "id": SID,
    "messages": [
        {"role": "user", "content": U},
        {
            "role": "assistant",
            "content": A1,
            "reasoning_content": f"**{SUBJECT}** {THOUGHT}",
            "tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": json.dumps(ARGS1)}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": R1},
        {
            "role": "assistant",
            "content": A2,
            "tool_calls": [{"id": "c2", "function": {"name": "run_shell_command", "arguments": json.dumps(ARGS2)}}],
        },
        # a response without `output` is sent whole, as JSON (the Gemini dialect of dialects.py reads it so too)
        {"role": "tool", "tool_call_id": "c2", "content": json.dumps({"error": R2}), "is_error": True},
        {"role": "assistant", "content": A3},
    ],
}


def words(text: str) -> int:
    return len(text.split())


def _import(tmp_path, text: str, name: str) -> list:
    path = tmp_path / name
    path.write_text(text)
    return list(import_openai(path, count=words, rules=StatusRules()))


def _same(got: list, want: list) -> None:
    assert len(got) == len(want) == 1
    assert got[0].prompt_id == want[0].prompt_id
    assert got[0].prompt_tokens == want[0].prompt_tokens
    assert got[0].turns == want[0].turns


def _response(cid: str, name: str, **response) -> dict:
    return {"functionResponse": {"id": cid, "name": name, "response": response}}


def _call(cid: str, name: str, args: dict, status: str, **response) -> dict:
    return {
        "id": cid,
        "name": name,
        "args": args,
        "result": [_response(cid, name, **response)],
        "status": status,
        "timestamp": "2026-03-01T10:00:05Z",
        "resultDisplay": "(shown to the user only: not counted)",
        "displayName": name,
    }


def _msg(mid: str, kind: str, content, **more) -> dict:
    return {"id": mid, "timestamp": "2026-03-01T10:00:00Z", "type": kind, "content": content, **more}


NOTICES = [  # the CLI's notices to the user: never sent to the model
    _msg("i1", "info", "Switched to fallback model gemini-2.5-flash"),
    _msg("w1", "warning", "Your context is large; consider /compress"),
    _msg("e1", "error", "[API Error: 429 quota exceeded] please retry"),
]
TOKENS = {"input": 900, "output": 40, "cached": 0, "thoughts": 12, "tool": 0, "total": 952}
GEMINI_MESSAGES = [
    _msg("u1", "user", [{"text": U}]),
    NOTICES[0],
    _msg(
        "g1",
        "gemini",
        A1,
        model="gemini-2.5-pro",
        tokens=TOKENS,
        thoughts=[{"subject": SUBJECT, "description": THOUGHT, "timestamp": "2026-03-01T10:00:01Z"}],
        toolCalls=[_call("c1", "search", ARGS1, "success", output=R1)],
    ),
    NOTICES[1],
    _msg(
        "g2",
        "gemini",
        A2,
        model="gemini-2.5-pro",
        tokens=TOKENS,
        toolCalls=[_call("c2", "run_shell_command", ARGS2, "error", error=R2)],
    ),
    NOTICES[2],
    _msg("g3", "gemini", A3, model="gemini-2.5-pro", tokens=TOKENS),
]
HEAD = {"sessionId": SID, "projectHash": "ab12cd", "startTime": "2026-03-01T10:00:00Z", "lastUpdated": "x"}


@pytest.fixture
def twin(tmp_path) -> list:
    return _import(tmp_path, json.dumps(OPENAI), "openai.json")


def test_a_json_session_imports_as_its_openai_twin(tmp_path, twin) -> None:
    got = _import(tmp_path, json.dumps({**HEAD, "messages": GEMINI_MESSAGES}), "session-2026-03-01.json")
    _same(got, twin)
    assert [t.tool_status for t in got[0].turns] == ["ok", "error", None]
    assert got[0].extra["meta"]["model"] == "gemini-2.5-pro"  # the recorded `tokens` are not used


def test_notices_are_skipped(tmp_path, twin) -> None:
    """Every notice's words would land in a turn's returns if it were read as a message."""
    got = _import(tmp_path, json.dumps({**HEAD, "messages": GEMINI_MESSAGES}), "session.json")
    assert sum(t.tool_tokens for t in got[0].turns) == sum(t.tool_tokens for t in twin[0].turns)


def test_a_jsonl_session_replays_rewrites_rewinds_and_repeated_responses(tmp_path, twin) -> None:
    """JSON Lines: a message written again when its tool calls complete replaces the first write, `$rewindTo`
    drops an abandoned branch, `$set` updates metadata, and the function responses recorded again as a `user`
    message are not counted twice."""
    g1_pending = {**GEMINI_MESSAGES[2], "toolCalls": []}
    abandoned = [_msg("u9", "user", "a question the user rewound"), _msg("g9", "gemini", "an answer rewound too")]
    lines = [
        HEAD,
        GEMINI_MESSAGES[0],
        NOTICES[0],
        g1_pending,
        {"$set": {"lastUpdated": "y"}},
        GEMINI_MESSAGES[2],
        _msg("t1", "user", [_response("c1", "search", output=R1)]),
        *abandoned,
        {"$rewindTo": "u9"},
        *GEMINI_MESSAGES[3:],
        {"$set": {"summary": "booking lookup"}},
    ]
    got = _import(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), "session-2026-03-01.jsonl")
    _same(got, twin)
    assert got[0].extra["meta"]["summary"] == "booking lookup"


def test_modern_content_parts_hold_the_calls_and_thoughts(tmp_path, twin) -> None:
    """Later releases write the thoughts and calls into `content` as parts, beside the same `thoughts` and
    `toolCalls` (which still hold the results): each is counted once."""
    g1 = {
        **GEMINI_MESSAGES[2],
        "content": [
            {"text": f"**{SUBJECT}** {THOUGHT}", "thought": True},
            {"text": A1},
            {"functionCall": {"id": "c1", "name": "search", "args": ARGS1}},
        ],
    }
    messages = [*GEMINI_MESSAGES[:2], g1, *GEMINI_MESSAGES[3:]]
    _same(_import(tmp_path, json.dumps({**HEAD, "messages": messages}), "s.json"), twin)


@pytest.mark.parametrize(
    ("status", "response", "want"),
    [
        ("error", {"output": "it went wrong quietly"}, "error"),  # the recorded status alone
        ("cancelled", {"output": "partial output"}, "error"),  # cancelled: the tool never finished
        ("success", {"error": "Tool not found"}, "error"),  # an error response alone
        ("success", {"output": "listing done"}, "ok"),
        ("success", {"output": "Command timed out after 120s"}, "timeout"),  # the text rules
    ],
)
def test_tool_call_statuses(tmp_path, status, response, want) -> None:
    messages = [
        _msg("u1", "user", U),
        _msg("g1", "gemini", A1, toolCalls=[_call("c1", "run_shell_command", ARGS2, status, **response)]),
        _msg("g2", "gemini", A3),
    ]
    (traj,) = _import(tmp_path, json.dumps({**HEAD, "messages": messages}), "s.json")
    assert traj.turns[0].tool == "run_shell_command"
    assert traj.turns[0].tool_status == want


def test_qwen_code_sessions(tmp_path, twin) -> None:
    """Qwen Code's JSON Lines: each record carries a Gemini `{role, parts}` content under `message`; `system`
    records (telemetry, slash commands) carry none and are skipped."""

    def rec(kind: str, role: str | None, parts: list | None, **more) -> dict:
        line = {"uuid": "u", "parentUuid": None, "sessionId": SID, "timestamp": "t", "type": kind, "cwd": "/w"}
        return {**line, **({"message": {"role": role, "parts": parts}} if role else {}), **more}

    lines = [
        rec("user", "user", [{"text": U}]),
        rec("system", None, None, subtype="ui_telemetry", systemPayload={"uiEvent": {"tokens": 5000}}),
        rec(
            "assistant",
            "model",
            [
                {"text": f"**{SUBJECT}** {THOUGHT}", "thought": True},
                {"text": A1},
                {"functionCall": {"id": "c1", "name": "search", "args": ARGS1}},
            ],
            model="qwen3-coder-plus",
        ),
        rec("tool_result", "user", [_response("c1", "search", output=R1)], toolCallResult={"status": "success"}),
        rec(
            "assistant",
            "model",
            [{"text": A2}, {"functionCall": {"id": "c2", "name": "run_shell_command", "args": ARGS2}}],
        ),
        rec("tool_result", "user", [_response("c2", "run_shell_command", error=R2)]),
        rec(
            "system", None, None, subtype="slash_command", systemPayload={"phase": "invocation", "rawCommand": "/stats"}
        ),
        rec("assistant", "model", [{"text": A3}]),
    ]
    got = _import(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), f"{SID}.jsonl")
    _same(got, twin)


@pytest.mark.parametrize("wrap", [lambda h: h, lambda h: {"history": h, "authType": "oauth-personal"}])
def test_chat_save_checkpoints(tmp_path, twin, wrap) -> None:
    """`/chat save <tag>` writes the model's history, `{role, parts}` contents (bare, or under `history`)."""
    history = [
        {"role": "user", "parts": [{"text": U}]},
        {
            "role": "model",
            "parts": [
                {"text": f"**{SUBJECT}** {THOUGHT}", "thought": True},
                {"text": A1},
                {"functionCall": {"id": "c1", "name": "search", "args": ARGS1}},
            ],
        },
        {"role": "user", "parts": [_response("c1", "search", output=R1)]},
        {"role": "model", "parts": [{"text": A2}, {"functionCall": {"name": "run_shell_command", "args": ARGS2}}]},
        {"role": "user", "parts": [_response("", "run_shell_command", error=R2)]},
        {"role": "model", "parts": [{"text": A3}]},
    ]
    (got,) = _import(tmp_path, json.dumps(wrap(history)), f"checkpoint-{SID}.json")
    assert got.prompt_tokens == twin[0].prompt_tokens
    assert got.turns == twin[0].turns
