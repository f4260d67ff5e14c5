"""`libra trace import`'s readers worked out by hand (scripts/mutation.sh importers): where a tool return's verdict
is looked for, the text of a message's parts, SWE-agent files without a history, mini-swe-agent's exit message,
which verl fields are kept, and the words of the errors. Token counts are `bytes4` (ceil(utf-8 bytes / 4))."""

from __future__ import annotations

import json

import pytest

from libra.workloads import TraceError
from libra.workloads.importers import IMPORT_FORMATS, StatusRules, import_files
from libra.workloads.importers.common import text_of

B4 = "bytes4"


def _b4(text: str) -> int:
    return -(-len(text.encode()) // 4)


def _file(tmp_path, name: str, record) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def test_a_verdict_is_read_at_the_edges_of_a_return_not_in_its_middle():
    rules = StatusRules()
    listing = ["file_1.py", "file_2.py", "file_3.py", "Error: a file named this way", "file_5.py", "file_6.py", "ok"]
    assert rules.classify("\n".join(listing)) == "ok"  # 7 lines: the 4th is neither among the first nor the last 3
    assert rules.classify("\n".join([*listing, "Traceback (most recent call last)"])) == "error"  # the last line
    assert rules.classify("\n".join(["Traceback (most recent call last)", *listing])) == "error"  # the first line
    assert rules.classify("\n".join(listing[:6])) == "error"  # 6 lines: all of them are edges


def test_the_text_of_a_message_from_its_parts():
    assert text_of([{"type": "text", "text": "a"}, "b", {"content": "c"}, {"content": [{"text": "d"}]}]) == "a\nb\nc\nd"
    assert text_of({"content": "e"}) == "e" and text_of({"text": "f", "content": "g"}) == "f"
    assert text_of(None) == "" and text_of(7) == "7"


def test_a_swe_agent_file_without_a_history_is_read_from_its_steps(tmp_path):
    record = {
        "trajectory": [
            {"response": "I will look.", "action": "find_file x.py", "observation": "found x.py"},
            {"thought": "Edit it", "action": "edit 1:2", "observation": "Traceback (most recent call last)\nboom"},
        ],
        "info": {"exit_status": "early_exit"},
    }
    (t,) = import_files("swe-agent", [_file(tmp_path, "a.traj", record)], tokenizer=B4)
    assert t.prompt_tokens == 0 and t.prompt_id == "a"
    assert [(u.gen_tokens, u.tool, u.tool_tokens, u.tool_status) for u in t.turns] == [
        (_b4("I will look."), "find_file", _b4("found x.py"), "ok"),
        (_b4("Edit it\nedit 1:2"), "edit", _b4("Traceback (most recent call last)\nboom"), "error"),  # no response
    ]


def test_a_swe_agent_history_that_is_not_a_list_of_objects_is_named(tmp_path):
    record = {"trajectory": [], "history": [{"role": "assistant", "content": "x"}, "not an object"]}
    path = _file(tmp_path, "b.traj", record)
    with pytest.raises(TraceError) as e:
        import_files("swe-agent", [path], tokenizer=B4)
    assert str(e.value) == f"{path}:1: field 'history[1]': must be an object, got str"
    path = _file(tmp_path, "c.traj", {"history": []})
    with pytest.raises(TraceError) as e:
        import_files("swe-agent", [path], tokenizer=B4)
    assert str(e.value) == f"{path}:1: field 'trajectory': missing: not a SWE-agent trajectory"


def test_mini_swe_agents_exit_message_is_not_context(tmp_path):
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "```bash\nls\n```"},
        {"role": "user", "content": "<returncode>0</returncode>\nx.py"},
        {"role": "assistant", "content": "```bash\necho done\n```"},
        {"role": "exit", "content": "the patch: diff --git a/x.py b/x.py ..."},
    ]
    (t,) = import_files("mini-swe-agent", [_file(tmp_path, "m.traj.json", {"messages": messages})], tokenizer=B4)
    assert [(u.tool, u.tool_tokens) for u in t.turns] == [
        ("bash", _b4("<returncode>0</returncode>\nx.py")),
        (None, 0),  # the exit message (the patch) went back to no model
    ]


def test_verl_keeps_scalar_and_null_fields_under_meta_and_names_bad_ones(tmp_path):
    record = {
        "prompt_length": 3,
        "response_mask": [1, 1, 0, 1],
        "note": "kept",
        "nothing": None,
        "nested": {"not": "kept"},
        "listed": [1, 2],
    }
    (t,) = import_files("verl", [_file(tmp_path, "v.jsonl", record)])
    assert t.extra["meta"] == {"note": "kept", "nothing": None}
    for name, rec, words in (
        (
            "w.jsonl",
            {**record, "tool_statuses": ["fine"]},
            "field 'tool_statuses[0]': must be one of ('ok', 'error', 'timeout')",
        ),  # noqa: E501
        (
            "x.jsonl",
            {"prompt_length": -1, "response_mask": [1]},
            "field 'prompt_length': must be a non-negative integer, got -1",
        ),  # noqa: E501
        ("y.jsonl", {"prompt_length": 1}, "field 'response_mask': missing: not a verl rollout record"),
        (
            "z.jsonl",
            {"prompt_length": 1, "response_mask": [1], "attention_mask": "x"},
            "field 'attention_mask': must be a list of integers",
        ),  # noqa: E501
    ):
        path = _file(tmp_path, name, rec)
        with pytest.raises(TraceError) as e:
            import_files("verl", [path])
        assert str(e.value).startswith(f"{path}:1: {words}"), str(e.value)


def test_an_unknown_format_lists_the_known_ones():
    with pytest.raises(ValueError) as e:
        import_files("parquet", ["x"])
    assert str(e.value) == f"unknown import format 'parquet'; expected one of {', '.join(IMPORT_FORMATS)}"


def test_content_blocks_split_into_messages_as_worked_out():
    from libra.workloads.importers.dialects import _blocks, _rewrite

    # a block that is neither text nor an object is skipped, not the end of the message; nor is a text block
    assert _blocks("assistant", ["a", 5, "b"]) == [{"role": "assistant", "content": "a\nb"}]
    # a tool call without a name is the tool "tool"
    (call,) = _blocks("assistant", [{"type": "tool_use", "id": "u1", "input": {"q": 1}}])
    assert call["tool_calls"] == [{"id": "u1", "function": {"name": "tool", "arguments": '{"q": 1}'}}]
    # Gemini's code execution: the code is generated text and a call; its result a tool message of that name
    code, result = _blocks(
        "model",
        [
            {"executableCode": {"code": "print(1)", "language": "PYTHON"}},
            {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1\n"}},
        ],
    )
    assert code == {
        "role": "model",
        "content": "print(1)",
        "tool_calls": [{"id": "", "function": {"name": "code_execution", "arguments": ""}}],
    }
    assert result == {"role": "tool", "name": "code_execution", "content": "1\n"}
    # a role no alias covers is kept as it is
    assert _rewrite({"role": "critic", "content": [{"type": "text", "text": "hm"}]}) == [
        {"role": "critic", "content": "hm"}
    ]


def test_openhands_and_smolagents_events_as_worked_out():
    from libra.workloads.importers.frameworks import _oh_action, _oh_observation, _smol_memory_step, _smol_message

    # OpenHands: a system action without args keeps its message; a command the user ran is no generation
    assert _oh_action({"action": "system", "message": "S", "args": {}}) == [{"role": "system", "content": "S"}]
    assert _oh_action({"action": "run", "source": "user", "args": {"command": "ls"}}) == []
    assert _oh_observation({"observation": "run", "message": "done", "cause": 4, "extras": {"exit_code": 0}}) == [
        {"role": "tool", "content": "done", "tool_call_id": "4", "exit_code": 0}
    ]
    # smolagents: a message with no parsable call is a generation; an error of a step is a failed return
    assert _smol_message({"role": "assistant", "content": "thinking"}) == [
        {"role": "assistant", "content": "thinking", "_libra_call_names": ["tool"]}
    ]
    step = _smol_memory_step({"model_output": "x", "error": {"message": "boom"}}, "action")
    assert step[-1] == {"role": "tool", "tool_call_id": "", "content": "Error:\nboom", "is_error": True}


def test_inspect_parts_rewards_and_failed_samples_as_worked_out():
    from libra.workloads.importers.inspect_logs import _content, _reward, failed_before_generation

    text, used = _content(
        [
            {"type": "text", "text": "t"},
            {"type": "tool_use", "tool_type": "web_search", "name": "search", "result": "r"},
        ]
    )
    assert text == "t" and used == [("search", "", {"role": "tool", "name": "search", "content": "r"})]
    _, used = _content([{"type": "tool_use", "tool_type": "web_search", "result": {"hits": 2}}])
    assert used == [("web_search", "", {"role": "tool", "name": "web_search", "content": '{"hits": 2}'})]
    assert _reward({"s": {"value": "inf"}}) is None and _reward({"s": {"value": "0.5"}}) == 0.5
    assert failed_before_generation({"error": {"message": "x"}, "messages": [{"role": "user"}]})
    assert not failed_before_generation({"error": {"message": "x"}, "messages": [{"role": "assistant"}]})


def test_a_gemini_cli_conversation_becomes_a_record_without_its_session_key():
    from libra.workloads.importers.gemini_cli import record

    out = record({"sessionId": "s-1", "projectHash": "p", "messages": [{"type": "user", "content": "hi"}]})
    assert out["prompt_id"] == "s-1" and out["projectHash"] == "p" and "sessionId" not in out


def test_a_gemini_call_without_an_id_has_an_empty_one():
    from libra.workloads.importers.gemini_cli import _generation

    msg = _generation({"content": [{"functionCall": {"name": "ls", "args": {"path": "."}}}]})
    assert msg["tool_calls"] == [
        {"id": "", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    ]


def test_an_inspect_archive_without_samples_says_so(tmp_path):
    import zipfile

    from libra.workloads.importers.inspect_logs import archive_records

    path = tmp_path / "run.eval"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("header.json", "{}")
    with pytest.raises(TraceError) as e:
        list(archive_records(path))
    assert str(e.value) == f"{path}: an Inspect .eval archive without samples (no samples/*.json member)"
