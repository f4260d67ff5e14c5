"""`libra trace import` on the rows of public agent-trajectory datasets as `datasets`' `to_json` writes them (one
trajectory a line, every feature of the schema on every message, null where a message has none). Each row here is
small and invented, in the layout of the set its test names (the columns and message keys of its dataset card)."""

from __future__ import annotations

import json

from libra.workloads.importers import import_files


def b4(*texts: str) -> int:
    """What `tokenizer="bytes4"` counts for these texts, each on its own."""
    return sum(-(-len(t.encode("utf-8")) // 4) for t in texts)


def _rows(tmp_path, rows: list[dict], fmt: str = "openai") -> list:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return import_files(fmt, [path], tokenizer="bytes4")


def _msg(role: str, content: str | None, **fields) -> dict:
    """One message with every feature of an OpenHands-trajectory schema (nulls where the message has none)."""
    return {"role": role, "content": content, "name": None, "tool_call_id": None, "tool_calls": None, **fields}


def _call(cid: str, name: str, arguments: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


LONG_OUTPUT = "collected 12 items\n" + "tests/test_io.py::test_case PASSED\n" * 30 + "1 failed, 11 passed\n"


def test_openhands_trajectory_rows_with_exit_codes_after_long_outputs(tmp_path) -> None:
    """nebius/SWE-rebench-openhands-trajectories and nvidia/SWE-Zero-openhands-trajectories: `trajectory` of
    OpenAI messages (`tool_calls` with JSON-text arguments, `tool` results with `name` and `tool_call_id`),
    `instance_id` the task and `trajectory_id` one run of it. OpenHands closes a command's output with
    `[Command finished with exit code N]`, after the output however long it is."""
    args = json.dumps({"command": "pytest -q tests/test_io.py"})
    trajectory = [
        _msg("system", "You are a coding agent."),
        _msg("user", "Fix the reader."),
        _msg("assistant", "Run the tests.", tool_calls=[_call("c1", "execute_bash", args)]),
        _msg(
            "tool",
            LONG_OUTPUT + "[Command finished with exit code 1]",
            name="execute_bash",
            tool_call_id="c1",
        ),
        _msg("assistant", "Look at the file.", tool_calls=[_call("c2", "str_replace_editor", '{"path": "a.py"}')]),
        _msg("tool", "Here's the result of running `cat -n` on a.py", name="str_replace_editor", tool_call_id="c2"),
        _msg("assistant", "Done.", tool_calls=[_call("c3", "finish", "{}")]),
    ]
    row = {
        "trajectory_id": "chatcmpl-1",
        "instance_id": "org__pkg-12",
        "repo": "org/pkg",
        "trajectory": trajectory,
        "tools": [{"type": "function", "function": {"name": "execute_bash"}}],
        "model_patch": "diff --git a/a.py b/a.py",
        "exit_status": "submit",
        "resolved": 1,
    }
    first, second = _rows(tmp_path, [row, {**row, "trajectory_id": "chatcmpl-2", "resolved": 0}])
    assert first.prompt_id == second.prompt_id == "org__pkg-12"  # two runs of one task
    assert first.prompt_tokens == b4("You are a coding agent.") + b4("Fix the reader.")
    assert [(t.tool, t.tool_status) for t in first.turns] == [
        ("execute_bash", "error"),
        ("str_replace_editor", "ok"),
        (None, None),
    ]
    assert first.turns[0].gen_tokens == b4("Run the tests.\nexecute_bash\n" + args)
    assert first.turns[0].tool_tokens == b4(LONG_OUTPUT + "[Command finished with exit code 1]")
    assert first.extra["meta"]["trajectory_id"] == "chatcmpl-1"


def test_swe_gym_openhands_rows(tmp_path) -> None:
    """SWE-Gym/OpenHands-Sampled-Trajectories: `messages` (with a null `function_call` on each), `instance_id`,
    `run_id`, `resolved`, `tools`, `test_result`; several runs per task."""
    messages = [
        _msg("system", "You are OpenHands agent.", function_call=None),
        _msg("user", "<uploaded_files>/workspace/pkg</uploaded_files> fix it", function_call=None),
        _msg(
            "assistant",
            "",
            function_call=None,
            tool_calls=[_call("t0", "execute_bash", '{"command": "ls /nope"}')],
        ),
        _msg(
            "tool",
            "ls: cannot access '/nope': No such file or directory\n[Command finished with exit code 2]",
            function_call=None,
            name="execute_bash",
            tool_call_id="t0",
        ),
        _msg("assistant", "Finished.", function_call=None),
    ]
    row = {
        "instance_id": "org__pkg-3",
        "run_id": "run-a",
        "resolved": False,
        "messages": messages,
        "tools": [],
        "test_result": {"apply_patch_output": "ok"},
    }
    (t,) = _rows(tmp_path, [row])
    assert t.prompt_id == "org__pkg-3" and len(t.turns) == 2
    assert (t.turns[0].tool, t.turns[0].tool_status) == ("execute_bash", "error")
    assert t.extra["meta"] == {"run_id": "run-a", "resolved": False}


def test_mini_swe_agent_rows_with_a_trajectory_format_column(tmp_path) -> None:
    """AlienKevin/SWE-ZERO-12M-trajectories (and other mini-swe-agent exports): `instance_id`, `repo`,
    `messages` of `{role, content}`, `trajectory_format` "mini-swe-agent-1", `exit_status`, `duration_sec`; many
    rollouts of one task. The environment answers as the user ("Observation: ..."); the default format reads the
    rows as `--format mini-swe-agent` does, and the submission ends the trajectory."""
    messages = [
        {"role": "system", "content": "Answer with one bash block."},
        {"role": "user", "content": "Please solve this issue."},
        {"role": "assistant", "content": "THOUGHT: look\n\n```bash\nls\n```"},
        {"role": "user", "content": "Observation: a.go b.go"},
        {"role": "assistant", "content": "THOUGHT: run it\n\n```bash\npython x.py\n```"},
        {"role": "user", "content": "Observation: bash: python: command not found"},
        {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
        {"role": "user", "content": "diff --git a/a.go b/a.go"},
    ]
    row = {
        "instance_id": "org__tool-849",
        "repo": "org/tool",
        "messages": messages,
        "trajectory_format": "mini-swe-agent-1",
        "exit_status": "Submitted",
        "duration_sec": 26.9,
    }
    rollouts = _rows(tmp_path, [row, {**row, "duration_sec": 27.1}])
    same = _rows(tmp_path, [row], "mini-swe-agent")
    assert len(rollouts) == 2 and {t.prompt_id for t in rollouts} == {"org__tool-849"}
    t = rollouts[0]
    assert t.prompt_tokens == b4("Answer with one bash block.", "Please solve this issue.")
    assert [(x.tool, x.tool_status) for x in t.turns] == [("bash", "ok"), ("bash", "error"), (None, None)]
    assert [x.tool_tokens for x in t.turns] == [b4("Observation: a.go b.go"), b4(messages[5]["content"]), 0]
    assert [(x.gen_tokens, x.tool_tokens) for x in t.turns] == [(x.gen_tokens, x.tool_tokens) for x in same[0].turns]
    assert t.extra["meta"]["exit_status"] == "Submitted"  # the row's column, as a run's `info` holds it
    # an unfinished rollout (no submission) keeps all its returns and says how it ended
    unfinished = {**row, "messages": messages[:6], "exit_status": "incomplete"}
    (cut,) = _rows(tmp_path, [unfinished], "mini-swe-agent")
    assert len(cut.turns) == 2 and cut.turns[-1].tool_tokens > 0 and cut.extra["meta"]["exit_status"] == "incomplete"


def test_toolbench_react_conversations(tmp_path) -> None:
    """ToolBench-style rows (also Agent-FLAN's and AgentTuning's ReAct data): `conversations` of `{from, value}`,
    the model's call written as text (`Action: NAME` / `Action Input: ...`), the `function` turn its result, a JSON
    object whose non-empty `error` says the call failed."""
    call_1 = 'Thought: look it up\nAction: weather_for_city\nAction Input: {"city": "Oslo"}'
    call_2 = 'Thought: try again\nAction: weather_for_city\nAction Input: {"city": "Oslo, NO"}'
    failed = json.dumps({"error": "Rate limit exceeded", "response": ""})
    answered = json.dumps({"error": "", "response": '{"temp": 3}'})
    row = {
        "id": "Step 2: weather in Oslo",
        "conversations": [
            {"from": "system", "value": "You can call tools."},
            {"from": "user", "value": "What is the weather in Oslo?"},
            {"from": "assistant", "value": call_1},
            {"from": "function", "value": failed},
            {"from": "assistant", "value": call_2},
            {"from": "function", "value": answered},
            {"from": "assistant", "value": 'Action: Finish\nAction Input: {"final_answer": "3 C"}'},
        ],
    }
    (t,) = _rows(tmp_path, [row])
    assert t.prompt_id == "Step 2: weather in Oslo"
    assert t.prompt_tokens == b4("You can call tools.", "What is the weather in Oslo?")
    assert [(x.tool, x.tool_status) for x in t.turns] == [
        ("weather_for_city", "error"),
        ("weather_for_city", "ok"),
        (None, None),
    ]
    assert [(x.gen_tokens, x.tool_tokens) for x in t.turns][:2] == [
        (b4(call_1), b4(failed)),
        (b4(call_2), b4(answered)),
    ]


def test_agentinstruct_sharegpt_rows_with_loss_flags(tmp_path) -> None:
    """THUDM/AgentInstruct: `conversations` of `{from: human | gpt, value, loss}` and `id`; the environment's
    output comes back as the human's turn (tool "user")."""
    row = {
        "id": "os_7",
        "conversations": [
            {"from": "human", "value": "Count the files in /etc.", "loss": False},
            {"from": "gpt", "value": "Act: bash\n```bash\nls /etc | wc -l\n```", "loss": True},
            {"from": "human", "value": "The output of the OS:\n220", "loss": False},
            {"from": "gpt", "value": "Act: answer(220)", "loss": True},
        ],
    }
    (t,) = _rows(tmp_path, [row])
    assert t.prompt_id == "os_7" and t.prompt_tokens == b4("Count the files in /etc.")
    assert [(x.tool, x.tool_tokens) for x in t.turns] == [("user", b4("The output of the OS:\n220")), (None, 0)]


def test_tau_bench_result_rows(tmp_path) -> None:
    """tau-bench's results: `task_id`, `reward`, `info`, `traj` (OpenAI messages) and `trial` (several per task)."""
    traj = [
        {"role": "system", "content": "Follow the airline policy."},
        {"role": "user", "content": "Cancel my booking."},
        {"role": "assistant", "content": None, "tool_calls": [_call("a", "get_reservation", '{"id": "X1"}')]},
        {"role": "tool", "tool_call_id": "a", "name": "get_reservation", "content": "Error: reservation not found"},
        {"role": "assistant", "content": "I could not find it."},
    ]
    rows = [{"task_id": 4, "reward": 0.0, "info": {"source": "user"}, "traj": traj, "trial": k} for k in (0, 1)]
    first, second = _rows(tmp_path, rows)
    assert (first.prompt_id, first.sample, second.sample, first.reward) == ("4", 0, 1, 0.0)
    assert [(x.tool, x.tool_status) for x in first.turns] == [("get_reservation", "error"), (None, None)]


def test_mini_swe_agent_plus_rows_without_a_format_column(tmp_path) -> None:
    """Kwai-Klear/SWE-smith-mini_swe_agent_plus-trajectories-66k: `instance_id`, `id`, `messages` of `{role,
    content}`, no `trajectory_format`: `--format mini-swe-agent` reads the `<returncode>` replies, and so does the
    default format, told by the replies (a task's row whose user replies are mostly mini-swe-agent's); a row
    whose replies are not stays a chat with a user."""
    messages = [
        {"role": "system", "content": "Use bash."},
        {"role": "user", "content": "Fix the parser."},
        {"role": "assistant", "content": "```bash\ngrep -rn parse src\n```"},
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\n</output>"},
        {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
    ]
    row = {"instance_id": "org__parse.1a2b__3", "messages": messages, "id": "traj-0001"}
    (mini,) = _rows(tmp_path, [row], "mini-swe-agent")
    (told,) = _rows(tmp_path, [row])
    assert mini == told and mini.prompt_id == "org__parse.1a2b__3"
    assert [(x.tool, x.tool_status) for x in mini.turns] == [("bash", "error"), (None, None)]
    chat = [*messages[:3], {"role": "user", "content": "exit code 1, nothing found"}, messages[4]]
    (plain,) = _rows(tmp_path, [{**row, "messages": chat}])
    assert [(x.tool, x.tool_status) for x in plain.turns] == [("user", "ok"), (None, None)]
    assert plain.extra["meta"] == {"id": "traj-0001"}
