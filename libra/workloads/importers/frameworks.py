"""Logs of agent frameworks, rewritten into OpenAI chat form for `convert_messages` (through dialects.py).

- **OpenHands** event streams (`event_to_dict` of openhands/events/serialization/event.py): each event has either
  `action` or `observation`. An agent's action is a generation: its `args.thought` (the model's text, on the first
  action of a response), the action's name (the tool) and its arguments, read from `tool_call_metadata`
  (the model response) when the event carries it, else from `args` without OpenHands' own bookkeeping keys
  (`is_input`, `blocking`, `hidden`, `confirmation_state`, ...). `message` actions are text (the agent's or the
  user's), `system` the system prompt. An observation is a tool return, answering the action its `cause` names:
  its text is the `content` (with a command's `metadata.prefix` / `suffix`, which the model sees too); an
  `error` or `user_rejected` observation, or `extras.error: true`, is an error; an exit code (`extras.exit_code`,
  `extras.metadata.exit_code`) sets the status, except -1, which OpenHands uses for "no exit code": with a
  "timed out" or "no new output" notice (its hard and no-change timeouts) it is a timeout, else the text decides.
  State changes, `null`, `recall`, condensation and loop-recovery events are skipped, as are hidden commands.
- **LangChain** messages, as `messages_to_dict` writes them (`{"type": "human" | "ai" | "system" | "tool" |
  "function" | "chat", "data": {...}}`, chunk types too) or as `dumpd` does (`{"lc": 1, "type": "constructor",
  "id": [..., "AIMessage"], "kwargs": {...}}`, under `langchain` or `langchain_core`). An AI message's content
  (text, thinking and reasoning blocks), `tool_calls` and `invalid_tool_calls` (else the provider's
  `additional_kwargs.tool_calls` / `function_call`) are generated. A ToolMessage with `status: "error"` is an error;
  `success`, the default, leaves the status to the text.
- **smolagents**: chat messages with roles `tool-call` (the calls, written as `Calling tools:\\n[...]`: read back
  into names and arguments) and `tool-response` (a tool's return; `Error:` after the optional `Call id:` line is an
  error), and memory steps as `ActionStep.dict()` writes them (`model_output`, `tool_calls`, `observations`,
  `error`), with the task, system prompt and planning steps. A CodeAgent's `python_interpreter` call repeats the
  code of the model output it follows: only its name is counted.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from libra.spec import checks
from libra.workloads.importers.common import CALL_NAMES, RESPONSE, STATUS, json_text, text_of

_OH_SKIP_ACTIONS = {
    "change_agent_state",
    "null",
    "recall",
    "condensation",
    "condensation_request",
    "loop_recovery",
    "pause",
    "resume",
    "stop",
}
_OH_SKIP_OBSERVATIONS = {"agent_state_changed", "null", "recall", "condense", "loop_detection"}
_OH_ERROR_OBSERVATIONS = {"error", "user_rejected"}
# args OpenHands adds to an action that the model did not write
_OH_BOOKKEEPING = {
    "thought",
    "is_input",
    "blocking",
    "is_static",
    "cwd",
    "hidden",
    "confirmation_state",
    "security_risk",
    "impl_source",
    "translated_ipython_code",
    "include_extra",
    "kernel_init_code",
    "wait_for_response",
    "image_urls",
    "file_urls",
}
_OH_TIMEOUT = re.compile(r"timed out after|no new output after", re.I)

_LC_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "chat": "chat",
    "remove": "",
}
_LC_ROLES.update({f"{k.capitalize()}MessageChunk": v for k, v in _LC_ROLES.items()})
_LC_ROLES["AIMessageChunk"] = "assistant"
_LC_CLASSES = {"HumanMessage": "human", "AIMessage": "ai", "SystemMessage": "system", "ToolMessage": "tool"}
_LC_CLASSES.update({"FunctionMessage": "function", "ChatMessage": "chat", "RemoveMessage": "remove"})
_LC_CLASSES.update({f"{k}Chunk": v for k, v in list(_LC_CLASSES.items())})

_SMOL_ROLES = {"tool-call", "tool-response"}
_SMOL_CALL_ID = re.compile(r"\ACall id: *(\S*)\n")


def is_framework_item(m: dict) -> bool:
    """Whether `m` is one item of the frameworks above (not a plain chat message)."""
    return _is_openhands(m) or _langchain_kind(m) is not None or _smol_step(m) is not None


def is_smolagents_message(m: dict) -> bool:
    return m.get("role") in _SMOL_ROLES


def rewrite(m: dict) -> list[dict] | None:
    """The OpenAI chat messages one framework item stands for ([] for a skipped event), or None when it is not
    one."""
    if _is_openhands(m):
        return _openhands(m)
    if _langchain_kind(m) is not None:
        return _langchain(m)
    if is_smolagents_message(m):
        return _smol_message(m)
    step = _smol_step(m)
    return _smol_memory_step(m, step) if step is not None else None


def _obj(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


# OpenHands


def _is_openhands(m: dict) -> bool:
    """An event has `action` or `observation` (a string), never both (SWE-agent's steps have both), and the
    fields every serialized event has."""
    action, observation = isinstance(m.get("action"), str), isinstance(m.get("observation"), str)
    return action != observation and "role" not in m and any(k in m for k in ("source", "args", "extras", "cause"))


def _openhands(m: dict) -> list[dict]:
    return _oh_action(m) if "action" in m else _oh_observation(m)


def _oh_action(m: dict) -> list[dict]:
    kind = m["action"]
    args = _obj(m.get("args"))
    if kind in _OH_SKIP_ACTIONS or args.get("hidden") is True:
        return []
    if kind == "system":
        return [{"role": "system", "content": text_of(args.get("content", m.get("message")))}]
    if kind == "message":
        role = "assistant" if m.get("source") == "agent" else "user"
        return [{"role": role, "content": text_of(args.get("content", m.get("message")))}]
    if m.get("source") not in ("agent", None):
        return []  # a command the user ran: no generation (its observation still enters the context)
    thought = args.get("thought") if isinstance(args.get("thought"), str) else ""
    arguments: Any = None if kind == "think" else _oh_called_arguments(m.get("tool_call_metadata"))
    if arguments is None and kind != "think":
        arguments = {k: v for k, v in args.items() if k not in _OH_BOOKKEEPING and v not in (None, False, "", [], {})}
    call = {"id": str(m.get("id", "")), "function": {"name": kind, "arguments": json_text(arguments or "")}}
    msg: dict[str, Any] = {"role": "assistant", "content": thought, "tool_calls": [call]}
    response = _oh_response_id(m.get("tool_call_metadata"))
    if response:  # the actions of one model response (run one at a time, each observed) are one generation
        msg[RESPONSE] = response
    return [msg]


def _oh_response_id(meta: Any) -> str | None:
    """The id of the model response an action's tool call came from (`tool_call_metadata.model_response.id`)."""
    response = meta.get("model_response") if isinstance(meta, dict) else None
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _oh_called_arguments(meta: Any) -> str | None:
    """The arguments the model wrote for this action: its tool call in the model response of
    `tool_call_metadata`."""
    if not isinstance(meta, dict):
        return None
    response = meta.get("model_response")
    choices = response.get("choices") if isinstance(response, dict) else None
    message = (
        choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    )
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and call.get("id") == meta.get("tool_call_id"):
            args = fn.get("arguments")
            return args if isinstance(args, str) else json_text(args)
    return None


def _oh_observation(m: dict) -> list[dict]:
    kind = m["observation"]
    extras = _obj(m.get("extras"))
    if kind in _OH_SKIP_OBSERVATIONS or extras.get("hidden") is True:
        return []
    meta = _obj(extras.get("metadata"))
    text = "".join(
        text_of(v) for v in (meta.get("prefix"), m.get("content", m.get("message")), meta.get("suffix")) if v
    )
    result: dict[str, Any] = {"role": "tool", "content": text}
    if m.get("cause") is not None:
        result["tool_call_id"] = str(m["cause"])
    code = extras.get("exit_code", meta.get("exit_code"))
    code = code if checks.is_whole(code) else None
    if kind in _OH_ERROR_OBSERVATIONS or extras.get("error") is True:
        result["is_error"] = True
    elif code == -1 or code is None:
        if code == -1 and _OH_TIMEOUT.search(text):
            result[STATUS] = "timeout"
    else:
        result["exit_code"] = code
    return [result]


# LangChain


def _langchain_kind(m: dict) -> str | None:
    """The message type (`human`, `ai`, ...) of a LangChain message dict, or None."""
    if "role" in m:
        return None
    if m.get("lc") == 1 and m.get("type") == "constructor" and isinstance(m.get("id"), list) and m["id"]:
        name = m["id"][-1]
        return _LC_CLASSES.get(name) if isinstance(name, str) and isinstance(m.get("kwargs"), dict) else None
    kind = m.get("type")
    if isinstance(kind, str) and kind in _LC_ROLES and isinstance(m.get("data"), dict):
        return kind
    return None


def _langchain(m: dict) -> list[dict]:
    kind = _langchain_kind(m)
    data: dict = m["kwargs"] if "lc" in m else m["data"]
    role = _LC_ROLES.get(kind, "") if kind is not None else ""
    if not role:
        return []  # RemoveMessage: an instruction to a LangGraph state, not a message
    text = _lc_text(data.get("content"))
    if role == "chat":
        who = data.get("role")
        role = who if isinstance(who, str) else "user"
    if role == "tool":
        result: dict[str, Any] = {"role": "tool", "content": text, "tool_call_id": str(data.get("tool_call_id", ""))}
        if isinstance(data.get("name"), str):
            result["name"] = data["name"]
        if data.get("status") == "error":
            result["is_error"] = True
        return [result]
    if role != "assistant":
        return [{"role": role, "content": text}]
    calls = []
    for call in (data.get("tool_calls") or []) + (data.get("invalid_tool_calls") or []):
        if isinstance(call, dict):
            fn = {"name": str(call.get("name") or "tool"), "arguments": json_text(call.get("args") or "")}
            calls.append({"id": str(call.get("id") or ""), "function": fn})
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    extra = _obj(data.get("additional_kwargs"))
    if calls:
        msg["tool_calls"] = calls
    elif isinstance(extra.get("tool_calls"), list):  # older messages: the provider's calls only
        msg["tool_calls"] = extra["tool_calls"]
    elif isinstance(extra.get("function_call"), dict):
        msg["function_call"] = extra["function_call"]
    return [msg]


def _lc_text(content: Any) -> str:
    """Text, thinking and reasoning blocks of a LangChain content; tool-use blocks repeat `tool_calls`."""
    if not isinstance(content, list):
        return text_of(content)
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict):
            value = next((block[k] for k in ("text", "thinking", "reasoning") if isinstance(block.get(k), str)), None)
            if value is not None:
                parts.append(value)
    return "\n".join(parts)


# smolagents


def _smol_message(m: dict) -> list[dict]:
    text = text_of(m.get("content"))
    if m["role"] == "tool-response":
        result: dict[str, Any] = {"role": "tool"}
        found = _SMOL_CALL_ID.match(text)
        if found:
            result["tool_call_id"] = found.group(1)
            text = text[found.end() :]
        result["content"] = text
        if text.startswith("Error:"):
            result["is_error"] = True
        return [result]
    calls = m.get("tool_calls") if isinstance(m.get("tool_calls"), list) else _smol_parse_calls(text)
    if calls is None:
        return [{"role": "assistant", "content": text, CALL_NAMES: ["tool"]}]
    return [{"role": "assistant", "content": "", "tool_calls": _smol_calls(calls)}]


def _smol_parse_calls(text: str) -> list | None:
    """The calls of a `tool-call` message: a Python literal after `Calling tools:`."""
    _, sep, rest = text.partition("Calling tools:")
    if not sep:
        return None
    try:
        value = ast.literal_eval(rest.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) else None


def _smol_calls(calls: list) -> list[dict]:
    out = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        fn = _obj(call.get("function")) or call
        name = str(fn.get("name") or "tool")
        # a CodeAgent's code is its model output, already counted: the call adds only its name
        args = "" if name == "python_interpreter" else json_text(fn.get("arguments", ""))
        out.append({"id": str(call.get("id") or ""), "function": {"name": name, "arguments": args}})
    return out


def _smol_step(m: dict) -> str | None:
    """The kind of a smolagents memory step dict (`MemoryStep.dict()`), or None."""
    if "role" in m:
        return None
    if "step_number" in m and "model_output" in m and "observations" in m:
        return "action"
    if "task" in m and "task_images" in m:
        return "task"
    if set(m) == {"system_prompt"}:
        return "system"
    if "plan" in m and "model_output_message" in m:
        return "planning"
    if set(m) == {"output"}:
        return "final"
    return None


def _smol_memory_step(m: dict, step: str) -> list[dict]:
    if step == "task":
        return [{"role": "user", "content": text_of(m.get("task"))}]
    if step == "system":
        return [{"role": "system", "content": text_of(m.get("system_prompt"))}]
    if step == "planning":
        return [{"role": "assistant", "content": text_of(m.get("plan"))}]
    if step == "final":
        return []  # the answer of the last action step, already counted there
    out: list[dict] = []
    calls = _smol_calls(m["tool_calls"]) if isinstance(m.get("tool_calls"), list) else []
    gen: dict[str, Any] = {"role": "assistant", "content": text_of(m.get("model_output"))}
    if calls:
        gen["tool_calls"] = calls
    out.append(gen)
    call_id = calls[0]["id"] if calls else ""
    if m.get("observations") is not None:
        out.append({"role": "tool", "tool_call_id": call_id, "content": f"Observation:\n{text_of(m['observations'])}"})
    error = m.get("error")
    if error is not None:
        detail = error.get("message") if isinstance(error, dict) else error
        out.append({"role": "tool", "tool_call_id": call_id, "content": f"Error:\n{text_of(detail)}", "is_error": True})
    return out
