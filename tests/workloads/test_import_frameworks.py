"""`libra trace import --format openai` on the logs of agent frameworks (frameworks.py): OpenHands event streams,
LangChain serialized messages and smolagents messages and memory steps each import to the same trajectory as the
same conversation written as OpenAI chat messages.

The fixtures are built from the frameworks' serialization code (OpenHands `openhands/events/serialization/event.py`
and the action / observation classes; langchain_core `messages/utils.py` `messages_to_dict`, `load/dump.py`
`dumpd`, `messages/tool.py`; smolagents `memory.py` `ActionStep.dict` / `to_messages`), with the field names and
defaults those write. tests/data/openhands/ holds one real OpenHands trajectory (its README says where from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.workloads.importers import StatusRules
from libra.workloads.importers.openai_chat import import_openai

S, U = "You are a booking agent with tools.", "Find my booking please."
A1, A2, A3 = "Let me look it up.", "That failed, trying another way.", "Your booking is B-9."
R1 = "booking B-9 found for the user"
BENIGN = "db.txt is locked by another process"  # says nothing of failure: the status must come from the log
DATA = Path(__file__).parent.parent / "data"


def words(text: str) -> int:
    return len(text.split())


def _import(tmp_path, record, name="log.json") -> list:
    path = tmp_path / name
    path.write_text(json.dumps(record))
    return list(import_openai(path, count=words, rules=StatusRules()))


def openai_twin(tools, args, results, second_status) -> list[dict]:
    """The conversation in OpenAI form: two calls (`tools`, `args`), their `results`, the second one failing as
    `second_status` says (a dict of fields for its tool message), then a final answer."""
    messages: list[dict] = [{"role": "system", "content": S}, {"role": "user", "content": U}]
    for i, (tool, arg, result, gen) in enumerate(zip(tools, args, results, (A1, A2), strict=True)):
        call = {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(arg)}}
        messages.append({"role": "assistant", "content": gen, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": result, **(second_status if i else {})})
    messages.append({"role": "assistant", "content": A3})
    return messages


def assert_same(got, ref, tools, second="error") -> None:
    assert got.prompt_tokens == ref.prompt_tokens == words(S) + words(U)
    assert got.turns == ref.turns
    assert [(t.tool, t.tool_status) for t in ref.turns] == [(tools[0], "ok"), (tools[1], second), (None, None)]


# OpenHands

PATH, CMD = {"path": "/w/bookings.txt"}, {"command": "grep B-9 db.txt"}


def oh_events(exit_code=2) -> list[dict]:
    """One OpenHands event stream (`event_to_dict`): a system prompt, the user's task, state changes, a read whose
    call is in `tool_call_metadata`, a command without it (args with OpenHands' defaults) exiting `exit_code`, a
    condensation and a hidden command (skipped), and the agent's final message."""
    meta = {
        "function_name": "str_replace_editor",
        "tool_call_id": "toolu_1",
        "model_response": {
            "id": "chatcmpl-1",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": A1,
                        "tool_calls": [
                            {
                                "id": "toolu_1",
                                "type": "function",
                                "function": {"name": "read", "arguments": json.dumps(PATH)},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940},
        },
        "total_calls_in_response": 1,
    }
    run_args = {
        "command": CMD["command"],
        "is_input": False,
        "thought": A2,
        "blocking": False,
        "is_static": False,
        "cwd": None,
        "hidden": False,
        "confirmation_state": "confirmed",
        "security_risk": -1,
    }
    state = {"source": "environment", "message": "", "observation": "agent_state_changed", "content": ""}
    return [
        {"id": 0, "source": "agent", "message": S, "action": "system", "args": {"content": S, "tools": None}},
        {
            "id": 1,
            "source": "environment",
            "message": "",
            "action": "change_agent_state",
            "args": {"agent_state": "running"},
        },
        {**state, "id": 2, "extras": {"agent_state": "running", "reason": ""}},
        {"id": 3, "source": "user", "message": U, "action": "message", "args": {"content": U, "image_urls": None}},
        {
            "id": 4,
            "source": "user",
            "message": "",
            "action": "recall",
            "args": {"recall_type": "workspace_context", "query": U},
        },
        {
            "id": 5,
            "source": "environment",
            "observation": "recall",
            "content": "workspace notes",
            "extras": {},
            "cause": 4,
        },
        {
            "id": 6,
            "source": "agent",
            "message": "Reading",
            "action": "read",
            "tool_call_metadata": meta,
            "args": {"path": PATH["path"], "start": 0, "end": -1, "thought": A1, "impl_source": "oh_aci"},
        },
        {
            "id": 7,
            "source": "agent",
            "observation": "read",
            "cause": 6,
            "content": R1,
            "extras": {"path": PATH["path"]},
        },
        {
            "id": 8,
            "source": "agent",
            "message": "",
            "action": "condensation",
            "args": {"summary": "what happened so far"},
        },
        {"id": 9, "source": "agent", "message": "Running", "action": "run", "args": run_args},
        {
            "id": 10,
            "source": "agent",
            "observation": "run",
            "cause": 9,
            "content": BENIGN,
            "success": exit_code == 0,
            "extras": {
                "command": CMD["command"],
                "metadata": {"exit_code": exit_code, "pid": -1, "prefix": "", "suffix": ""},
            },
        },
        {"id": 11, "source": "agent", "action": "run", "args": {**run_args, "command": "git status", "hidden": True}},
        {
            "id": 12,
            "source": "agent",
            "observation": "run",
            "cause": 11,
            "content": "clean",
            "extras": {"hidden": True},
        },
        {
            "id": 13,
            "source": "agent",
            "message": A3,
            "action": "message",
            "args": {"content": A3, "wait_for_response": True},
        },
        {**state, "id": 14, "extras": {"agent_state": "awaiting_user_input"}},
        {"id": 15, "source": "environment", "observation": "null", "content": "ignored", "extras": {}},
    ]


def test_openhands_events_import_as_their_openai_twin(tmp_path) -> None:
    (ref,) = _import(tmp_path, openai_twin(["read", "run"], [PATH, CMD], [R1, BENIGN], {"exit_code": 2}), "ref.json")
    for record in (oh_events(), {"history": oh_events()}):
        (got,) = _import(tmp_path, record)
        assert_same(got, ref, ["read", "run"])
    # the read's generation is its thought and the call the model wrote (from the model response)
    assert ref.turns[0].gen_tokens == words(A1) + words("read") + words(json.dumps(PATH))


def test_openhands_statuses(tmp_path) -> None:
    def status(kind="run", content=BENIGN, **extras) -> str:
        events = oh_events()[:7] + [{"id": 7, "source": "agent", "observation": kind, "cause": 6, "content": content}]
        events[-1]["extras"] = extras
        (t,) = _import(tmp_path, events + [{"id": 8, "source": "agent", "action": "finish", "args": {}}])
        return t.turns[0].tool_status

    assert status(metadata={"exit_code": 0}) == "ok"
    assert status(metadata={"exit_code": 1}) == "error"
    assert status(exit_code=127) == "error"  # older outputs: the exit code in extras itself
    assert status("error", "File not changed: same content") == "error"
    assert status("user_rejected", "Action has been rejected by the user!") == "error"
    assert status("browse", "page text", error=True) == "error"
    # -1 is OpenHands' "no exit code": a timeout notice in the suffix makes it a timeout, else the text decides
    for notice in (
        "[The command timed out after 120.0 seconds. ...]",
        "[The command has no new output after 30 seconds.]",
    ):
        assert status(metadata={"exit_code": -1, "suffix": "\n" + notice}) == "timeout"
    assert status(metadata={"exit_code": -1}) == "ok"
    assert status(content="Traceback (most recent call last):\nKeyError: 'x'", metadata={"exit_code": -1}) == "error"


def test_openhands_evaluation_outputs(tmp_path) -> None:
    """SWE-bench outputs: `instance_id` names the prompt; `instruction` is the prompt when the history does not
    state it; older outputs hold [action, observation] pairs."""
    events = oh_events()
    no_user = [e for e in events if not (e.get("action") == "message" and e["source"] == "user")]
    lines = [
        {"instance_id": "django__django-1", "instruction": U, "history": events, "metrics": {"accumulated_cost": 0.1}},
        {"instance_id": "django__django-2", "instruction": U, "history": no_user, "test_result": {"git_patch": ""}},
        {"instance_id": "django__django-3", "instruction": U, "history": [events[:6], events[6:8], events[8:]]},
    ]
    path = tmp_path / "output.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    trajectories = list(import_openai(path, count=words, rules=StatusRules()))
    assert [t.prompt_id for t in trajectories] == ["django__django-1", "django__django-2", "django__django-3"]
    assert {t.prompt_tokens for t in trajectories} == {words(S) + words(U)}
    assert trajectories[0].turns == trajectories[1].turns == trajectories[2].turns
    assert "instruction" not in trajectories[0].extra.get("meta", {})


def test_a_real_openhands_trajectory() -> None:
    (t,) = import_openai(DATA / "openhands" / "wrong_initial_state.json", count=words, rules=StatusRules())
    events = json.loads((DATA / "openhands" / "wrong_initial_state.json").read_text())
    assert t.prompt_tokens == words(events[0]["args"]["content"])
    assert [(x.tool, x.tool_status) for x in t.turns] == [("read", "ok"), ("run", "ok"), ("read", "ok"), (None, None)]
    read, called = events[1], '{"command": "view", "path": "/workspace"}'
    assert t.turns[0].gen_tokens == words(read["args"]["thought"]) + words("read") + words(called)
    assert t.turns[0].tool_tokens == words(events[2]["content"])


# LangChain


def lc_dicts(status_field=True) -> list[dict]:
    """`messages_to_dict` of the conversation: `type` and `data` (the message's fields, defaults included)."""

    def msg(kind, content, **fields):
        data = {"content": content, "additional_kwargs": {}, "response_metadata": {}, "type": kind, "name": None}
        return {"type": kind, "data": {**data, "id": None, **fields}}

    def ai(content, name, args, cid):
        raw = [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]
        call = {"name": name, "args": args, "id": cid, "type": "tool_call"}
        usage = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
        out = msg("ai", content, tool_calls=[call], invalid_tool_calls=[], usage_metadata=usage)
        out["data"]["additional_kwargs"] = {"tool_calls": raw}  # the provider's copy: not counted twice
        return out

    failed = {"status": "error"} if status_field else {}
    return [
        msg("system", S),
        msg("human", U, example=False),
        ai(A1, "lookup", {"q": "booking"}, "c1"),
        msg("tool", R1, tool_call_id="c1", artifact=None, status="success"),
        {"type": "remove", "data": {"content": "", "type": "remove", "id": "m-old"}},
        ai([{"type": "text", "text": A2}], "shell", CMD, "c2"),
        msg("tool", BENIGN, tool_call_id="c2", name="shell", artifact=None, **failed),
        msg("ai", A3, tool_calls=[], invalid_tool_calls=[]),
    ]


def to_dumpd(item: dict) -> dict:
    """The same message as `dumpd` writes it: a constructor, its class id and its non-default fields."""
    cls = {"human": "HumanMessage", "ai": "AIMessage", "system": "SystemMessage", "tool": "ToolMessage"}
    cls["remove"] = "RemoveMessage"
    kwargs = {k: v for k, v in item["data"].items() if v not in (None, {}, [])}
    kind = item["type"]
    path = ["langchain", "schema", "messages"] if kind != "ai" else ["langchain_core", "messages", "ai"]
    return {"lc": 1, "type": "constructor", "id": [*path, cls[kind]], "kwargs": kwargs}


def test_langchain_messages_import_as_their_openai_twin(tmp_path) -> None:
    tools, args = ["lookup", "shell"], [{"q": "booking"}, CMD]
    (ref,) = _import(tmp_path, openai_twin(tools, args, [R1, BENIGN], {"is_error": True}), "ref.json")
    for record in (lc_dicts(), {"messages": [to_dumpd(m) for m in lc_dicts()]}):
        (got,) = _import(tmp_path, record)
        assert_same(got, ref, tools)
    # without `status: "error"` the text decides: ok
    (got,) = _import(tmp_path, lc_dicts(status_field=False))
    assert got.turns[1].tool_status == "ok"


# smolagents

RETRY = "\nNow let's retry: take care not to repeat previous errors!\n"


def smol_messages() -> list[dict]:
    """`ActionStep.to_messages` of the run: content as text parts, calls as a `tool-call` message, returns as
    `tool-response` messages."""

    def m(role, text):
        return {"role": role, "content": [{"type": "text", "text": text}]}

    def calling(cid, name, args):
        return m(
            "tool-call",
            "Calling tools:\n" + str([{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]),
        )

    return [
        m("system", S),
        m("user", U),
        m("assistant", A1),
        calling("c1", "lookup", {"q": "booking"}),
        m("tool-response", "Observation:\n" + R1),
        m("assistant", A2),
        calling("c2", "shell", CMD),
        m("tool-response", "Call id: c2\nError:\n" + BENIGN + RETRY),
        m("assistant", A3),
    ]


def smol_steps() -> list[dict]:
    """`AgentMemory` as `[system_prompt.dict()] + get_full_steps()`: task, three action steps, final answer."""

    def action(n, output, calls, observations=None, error=None):
        tool_calls = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": a}} for cid, name, a in calls
        ]
        return {
            "step_number": n,
            "timing": {"start_time": 0.0, "end_time": 1.0},
            "model_input_messages": None,
            "tool_calls": tool_calls,
            "error": error,
            "model_output_message": None,
            "model_output": output,
            "code_action": None,
            "observations": observations,
            "observations_images": None,
            "action_output": None,
            "token_usage": {"input_tokens": 10, "output_tokens": 5},
            "is_final_answer": n == 3,
        }

    return [
        {"system_prompt": S},
        {"task": U, "task_images": None},
        action(1, A1, [("c1", "lookup", {"q": "booking"})], observations=R1),
        action(2, A2, [("c2", "shell", CMD)], error={"type": "AgentExecutionError", "message": BENIGN}),
        action(3, A3, []),
        {"output": "B-9"},
    ]


def test_smolagents_messages_and_steps_import_as_their_openai_twin(tmp_path) -> None:
    tools, args = ["lookup", "shell"], [{"q": "booking"}, CMD]
    # the model sees the returns as smolagents words them; a step's error is counted without the retry advice
    twin = openai_twin(tools, args, ["Observation:\n" + R1, "Error:\n" + BENIGN + RETRY], {})
    (ref,) = _import(tmp_path, twin, "ref.json")
    (got,) = _import(tmp_path, smol_messages())
    assert_same(got, ref, tools)
    twin = openai_twin(tools, args, ["Observation:\n" + R1, "Error:\n" + BENIGN], {"is_error": True})
    (ref,) = _import(tmp_path, twin, "ref.json")
    (got,) = _import(tmp_path, {"steps": smol_steps()})
    assert_same(got, ref, tools)
    (bare,) = _import(tmp_path, smol_steps())
    assert bare.turns == got.turns


def test_smolagents_code_agent_counts_its_code_once(tmp_path) -> None:
    code = "result = lookup(q='booking')\nprint(result)"
    call = [{"id": "c1", "type": "function", "function": {"name": "python_interpreter", "arguments": code}}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": U}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"Thought: look\n<code>\n{code}\n</code>"}]},
        {"role": "tool-call", "content": [{"type": "text", "text": f"Calling tools:\n{call}"}]},
        {"role": "tool-response", "content": [{"type": "text", "text": "Observation:\n" + R1}]},
        {"role": "assistant", "content": [{"type": "text", "text": A3}]},
    ]
    (t,) = _import(tmp_path, messages)
    first, _ = t.turns
    assert first.tool == "python_interpreter" and first.tool_status == "ok"
    assert first.gen_tokens == words(f"Thought: look\n<code>\n{code}\n</code>") + words("python_interpreter")


@pytest.mark.parametrize(
    "item",
    [
        {"action": "run", "observation": "run", "source": "agent"},  # SWE-agent steps have both: no OpenHands event
        {"type": "mystery", "data": {"content": U}},
        {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "Document"], "kwargs": {}},
    ],
)
def test_items_of_no_dialect_are_still_errors(tmp_path, item) -> None:
    from libra.workloads import TraceError

    with pytest.raises(TraceError, match=r"log\.json"):
        _import(tmp_path, {"messages": [{"role": "user", "content": U}, item]})
