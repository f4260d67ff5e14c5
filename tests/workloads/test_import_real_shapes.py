"""`libra trace import` on shapes real agent logs take that the format tests do not write: tool results' status
fields as loggers set them, refusals and duplicated reasoning, a Gemini request, ShareGPT calls stored as data, one
model response written around its tool results (Claude Code, OpenHands), SWE-agent 1.x's timeout notice, texts
beyond the BPE library's limits and lone UTF-16 surrogates."""

from __future__ import annotations

import json

import pytest

from libra.workloads import TraceError
from libra.workloads.importers import StatusRules, get_counter, import_files
from libra.workloads.importers.openai_chat import import_openai


def words(text: str) -> int:
    return len(text.split())


def _import(tmp_path, record, name="log.json", *, lines: bool = False) -> list:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in record) + "\n" if lines else json.dumps(record))
    return list(import_openai(path, count=words, rules=StatusRules()))


def _call(cid: str, name: str = "f") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"status": "error"}, "error"),  # a ToolMessage-like status on an OpenAI-form message
        ({"status": "timeout"}, "timeout"),
        ({"status": "success"}, "ok"),
        ({"error": None, "is_error": True}, "error"),  # a null `error` does not hide `is_error`
        ({"error": "ValueError: bad input"}, "error"),  # an error stated as its message
        ({"error": {"type": "RuntimeError", "message": "x"}}, "error"),
        ({"error": ""}, "ok"),
        ({"error": False}, "ok"),  # tau2-bench: a flag on every tool message
    ],
)
def test_a_tool_results_own_status_fields(tmp_path, fields, status) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [_call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "some output", **fields},
        {"role": "assistant", "content": "done"},
    ]
    (t,) = _import(tmp_path, {"messages": messages})
    assert (t.turns[0].tool, t.turns[0].tool_status) == ("f", status)


def test_refusals_are_generated_and_one_reasoning_under_two_keys_is_counted_once(tmp_path) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot help"}]},
        {"role": "user", "content": "please"},
        {"role": "assistant", "content": None, "refusal": "Still no"},
        {"role": "user", "content": "why"},
        # vLLM states its reasoning under both keys; Ollama under `thinking`
        {"role": "assistant", "content": "because", "reasoning_content": "think hard", "reasoning": "think hard"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "bye", "thinking": "one more thought"},
    ]
    (t,) = _import(tmp_path, {"messages": messages})
    assert [x.gen_tokens for x in t.turns] == [3, 2, 3, 4]


def test_a_gemini_request_with_contents_and_a_system_instruction(tmp_path) -> None:
    record = {
        "systemInstruction": {"parts": [{"text": "You are a weather bot"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "weather in Paris?"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"error": "down"}}}]},
            {"role": "model", "parts": [{"text": "The service is down."}]},
        ],
        "generationConfig": {"temperature": 0},
    }
    (t,) = _import(tmp_path, record)
    assert t.prompt_tokens == words("You are a weather bot") + words("weather in Paris?")
    assert (t.turns[0].tool, t.turns[0].tool_status) == ("get_weather", "error") and len(t.turns) == 2


def test_a_message_list_under_trajectory(tmp_path) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]
    (t,) = _import(tmp_path, {"instance_id": "i-1", "trajectory": messages})
    assert t.prompt_id == "i-1" and t.turns[0].gen_tokens == 2


def test_sharegpt_calls_and_results_stored_as_data_are_counted(tmp_path) -> None:
    calls = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    conv = [
        {"from": "human", "value": "q"},
        {"from": "function_call", "value": calls},
        {"from": "observation", "value": {"temp": 20}},
        {"from": "observation", "value": "r2"},
        {"from": "gpt", "value": "done"},
    ]
    (t,) = _import(tmp_path, {"conversations": conv})
    first = t.turns[0]
    assert first.gen_tokens == words(json.dumps(calls)) and first.extra == {"tools": ["a", "b"]}
    assert first.tool_tokens == words(json.dumps({"temp": 20})) + 1


def _cc(kind: str, message: dict) -> dict:
    return {"type": kind, "sessionId": "s-1", "isSidechain": False, "uuid": "u", "message": message}


def test_a_claude_code_response_written_around_its_tool_results_is_one_generation(tmp_path) -> None:
    def part(block: dict) -> dict:
        return _cc("assistant", {"id": "msg_1", "type": "message", "role": "assistant", "content": [block]})

    def result(tid: str, text: str, error: bool = False) -> dict:
        block = {"type": "tool_result", "tool_use_id": tid, "content": text, "is_error": error}
        return _cc("user", {"role": "user", "content": [block]})

    lines = [
        _cc("user", {"role": "user", "content": "fix it"}),
        part({"type": "text", "text": "two tools"}),
        part({"type": "tool_use", "id": "t1", "name": "Read", "input": {}}),
        result("t1", "file text"),
        part({"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}),
        result("t2", "1 failed", error=True),
        _cc(
            "assistant",
            {"id": "msg_2", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        ),
    ]
    (t,) = _import(tmp_path, lines, "s.jsonl", lines=True)
    first, last = t.turns
    assert first.gen_tokens == words("two tools Read {} Bash {}") and first.extra == {"tools": ["Read", "Bash"]}
    assert (first.tool_status, first.tool_tokens, last.gen_tokens) == ("error", 4, 1)


def test_openhands_actions_of_one_model_response_are_one_generation(tmp_path) -> None:
    def meta(rid: str) -> dict:
        return {"function_name": "execute_bash", "tool_call_id": "x", "model_response": {"id": rid}}

    def action(i: int, cmd: str, thought: str, rid: str) -> dict:
        args = {"command": cmd, "thought": thought, "is_input": False}
        return {"id": i, "source": "agent", "action": "run", "args": args, "tool_call_metadata": meta(rid)}

    def observation(i: int, cause: int, text: str, code: int) -> dict:
        extras = {"command": "c", "metadata": {"exit_code": code}}
        return {"id": i, "source": "agent", "observation": "run", "cause": cause, "content": text, "extras": extras}

    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "do it"}},
        action(1, "ls", "I run two", "chatcmpl-1"),  # OpenHands runs a response's calls one at a time
        observation(2, 1, "a b", 0),
        action(3, "pwd", "", "chatcmpl-1"),
        observation(4, 3, "no such dir", 1),
        {"id": 5, "source": "agent", "action": "finish", "args": {"thought": "done"}},
    ]
    (t,) = _import(tmp_path, events)
    first, last = t.turns
    assert first.extra == {"tools": ["run", "run"]} and first.tool_status == "error" and first.tool_tokens == 5
    assert first.gen_tokens == words('I run two run {"command": "ls"} run {"command": "pwd"}')
    assert last.tool is None


def test_swe_agent_1x_cancelled_command_is_a_timeout(tmp_path) -> None:
    notice = (
        "The command 'sleep 9999' was cancelled because it took more than 1800 seconds. Please try a different "
        "command that completes more quickly."
    )
    record = {
        "environment": "main",
        "history": [
            {"role": "system", "content": "You are a programmer."},
            {"role": "assistant", "content": "wait", "action": "sleep 9999"},
            {"role": "tool", "content": [{"type": "text", "text": notice}], "tool_call_ids": ["c1"]},
            {"role": "assistant", "content": "stop", "action": "exit"},
        ],
        "trajectory": [{"action": "sleep 9999", "observation": notice}, {"action": "exit", "observation": ""}],
        "info": {"exit_status": "exit_cost"},
    }
    path = tmp_path / "i.traj"
    path.write_text(json.dumps(record))
    (t,) = import_files("swe-agent", [path], tokenizer="bytes4")
    assert (t.turns[0].tool, t.turns[0].tool_status) == ("sleep", "timeout")


def test_a_return_beyond_the_bpe_librarys_limits_is_counted(tmp_path) -> None:
    """bpe-openai refuses 200,000 tokens (or 1,000,000 characters) in one call: a long tool output is counted in
    pieces, to the same count."""
    line = "x " * 99 + "x\n"  # 101 tokens in o200k_base, the same in any text of such lines
    output = line * 3000  # 303,000 tokens
    messages = [
        {"role": "user", "content": "cat the log"},
        {"role": "assistant", "content": None, "tool_calls": [_call("a", "bash")]},
        {"role": "tool", "tool_call_id": "a", "content": output},
        {"role": "assistant", "content": "done"},
    ]
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"messages": messages}))
    (t,) = import_files("openai", [path])
    count = get_counter("o200k_base")
    assert t.turns[0].tool_tokens == 3000 * count(line) == 303_000
    assert count("é" * 1_000_001) > 0  # 1,000,001 characters


def test_a_lone_surrogate_is_counted_by_every_tokenizer(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    # JSON allows a lone surrogate: a JavaScript tool cut a string inside an emoji
    path = tmp_path / "s.json"
    path.write_text(
        '{"messages": [{"role": "user", "content": "hello \\ud83d"}, {"role": "assistant", "content": "ok"}]}'
    )
    for name in ("bytes4", "o200k_base", str(tmp_path / "tokenizer.json")):
        (t,) = import_files("openai", [path], tokenizer=name)
        assert t.prompt_tokens >= 2


def test_codex_exec_json_items_are_generations_calls_and_their_results(tmp_path) -> None:
    """`codex exec --json`: thread items in `item.completed` events (the `item.started` copy of a command is not a
    second call); reasoning and the command of one step are one generation; the exit code and a failed status set
    the result's status; the prompt is not logged. Before, only a 1-token generation was left of such a run."""

    def item(kind: str, **fields) -> dict:
        return {"type": "item.completed", "item": {"id": f"item_{kind}", "type": kind, **fields}}

    lines = [
        {"type": "thread.started", "thread_id": "t-1"},
        {"type": "turn.started"},
        item("reasoning", text="look at the repo first"),
        {"type": "item.started", "item": {"id": "c0", "type": "command_execution", "command": "bash -lc ls",
                                          "aggregated_output": "", "exit_code": None, "status": "in_progress"}},
        item("command_execution", command="bash -lc ls", aggregated_output="README.md src\n", exit_code=0,
             status="completed"),
        item("command_execution", command="pytest -q", aggregated_output="1 failed", exit_code=1, status="failed"),
        item("mcp_tool_call", server="docs", tool="search", arguments={"q": "x"}, result={"content": "a b"},
             status="completed"),
        item("file_change", changes=[{"path": "src/a.py", "kind": "update"}], status="completed"),
        item("web_search", query="python sort stable"),
        item("agent_message", text="fixed the failing test"),
        {"type": "turn.completed", "usage": {"input_tokens": 1200, "output_tokens": 85}},
    ]  # fmt: skip
    (t,) = _import(tmp_path, lines, "run.jsonl", lines=True)
    assert t.prompt_tokens == 0
    assert [(u.tool, u.tool_status) for u in t.turns] == [
        ("shell", "ok"),
        ("shell", "error"),
        ("docs.search", "ok"),
        ("apply_patch", "ok"),
        ("web_search", "ok"),
        (None, None),
    ]
    assert t.turns[0].gen_tokens == words("look at the repo first") + words("shell bash -lc ls")
    assert t.turns[0].tool_tokens == 2 and t.turns[-1].gen_tokens == 4


def test_a_bedrock_converse_conversation(tmp_path) -> None:
    """Bedrock Converse blocks are keyed by their kind (no `type`): `toolUse` is a call, `toolResult` a result
    whose `status` "error" sets it, `reasoningContent` generated text; the `system` blocks are the prompt's."""
    record = {
        "system": [{"text": "you are a helpful agent"}],
        "messages": [
            {"role": "user", "content": [{"text": "what is the weather in paris"}]},
            {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "call the weather tool"}}},
                {"text": "let me check"},
                {"toolUse": {"toolUseId": "t1", "name": "weather", "input": {"city": "paris"}}},
            ]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "service down"}],
                                                         "status": "error"}}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t2", "name": "weather", "input": {}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t2", "content": [{"json": {"temp": 21}}]}}]},
            {"role": "assistant", "content": [{"text": "it is 21 degrees"}]},
        ],
    }  # fmt: skip
    (t,) = _import(tmp_path, record)
    assert t.prompt_tokens == words("you are a helpful agent") + words("what is the weather in paris")
    assert [(u.tool, u.tool_status) for u in t.turns] == [("weather", "error"), ("weather", "ok"), (None, None)]
    assert t.turns[0].tool_tokens == 2 and t.turns[-1].gen_tokens == 4
    assert t.turns[0].gen_tokens > words("call the weather tool let me check")  # the call's name and input too


def test_dataset_rows_with_ai_messages_under_text(tmp_path) -> None:
    """nebius/SWE-agent-trajectories' rows: a `trajectory` of `{role, text}` messages, the model's role `ai`."""
    row = {
        "instance_id": "org__repo-7",
        "model_name": "some-model",
        "target": False,
        "exit_status": "submitted",
        "trajectory": [
            {"role": "system", "text": "you fix issues", "mask": False, "system_prompt": "you fix issues"},
            {"role": "user", "text": "the issue says this", "mask": False},
            {"role": "ai", "text": "let me look around", "mask": True},
            {"role": "user", "text": "a.py b.py c.py d.py", "mask": False},
            {"role": "ai", "text": "submit", "mask": True},
        ],
    }
    (t,) = _import(tmp_path, [row, row], "rows.jsonl", lines=True)[:1]
    assert t.prompt_id == "org__repo-7" and t.prompt_tokens == 3 + 4
    assert [(x.gen_tokens, x.tool_tokens) for x in t.turns] == [(4, 4), (1, 0)]
    assert t.extra["meta"] == {"model_name": "some-model", "target": False, "exit_status": "submitted"}


@pytest.mark.parametrize("fmt", ["openai", "mini-swe-agent"])
def test_a_message_list_stored_as_json_text_is_read_as_the_list(tmp_path, fmt) -> None:
    """Dataset rows that keep the messages as a JSON string (SWE-smith's trajectories exported to JSON Lines)."""
    messages = [
        {"role": "system", "content": "you run bash"},
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": "```bash\nls\n```"},
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\nno such file\n</output>"},
        {"role": "assistant", "content": "done now"},
    ]
    row = {"instance_id": "x__y-1", "messages": json.dumps(messages), "resolved": True}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (t,) = import_files(fmt, [path], tokenizer="bytes4")
    as_list = tmp_path / "list.jsonl"
    as_list.write_text(json.dumps({**row, "messages": messages}) + "\n")
    (same,) = import_files(fmt, [as_list], tokenizer="bytes4")
    assert t.prompt_id == "x__y-1" and len(t.turns) == 2
    assert (t.prompt_tokens, [(x.gen_tokens, x.tool_tokens, x.tool_status) for x in t.turns]) == (
        same.prompt_tokens,
        [(x.gen_tokens, x.tool_tokens, x.tool_status) for x in same.turns],
    )
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({**row, "messages": "[not json"}) + "\n")
    with pytest.raises(TraceError, match="broken.jsonl:1"):
        import_files(fmt, [broken], tokenizer="bytes4")
