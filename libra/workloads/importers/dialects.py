"""Chat-log dialects other than OpenAI chat completions, rewritten into that form for `convert_messages`.

Agent logs come in a few shapes besides OpenAI's `role` / `content` / `tool_calls` / `tool` messages:

- **ShareGPT** (`{"from": ..., "value": ...}`, common in published agent datasets): `human` / `user` is the user,
  `gpt` / `assistant` / `model` the model, `function_call` / `tool_call` a generated tool call (its text is the
  generation; the tool's name is read from its JSON when it has one), `observation` / `function` / `tool` /
  `function_response` / `tool_response` a tool's result.
- **Anthropic messages**: content blocks `text`, `thinking`, `tool_use` (name and input: generated),
  `server_tool_use`; `tool_result` blocks (in user messages; `is_error` sets the status) and server tools'
  `*_tool_result` blocks are tool results, named after the call they answer.
- **Gemini** (`role: "model"`, `parts`): `text` (thoughts included), `functionCall` and `executableCode` are
  generated; `functionResponse` (its `output`, or the whole response; an `error` in it is an error) and
  `codeExecutionResult` (an outcome other than OK is an error, a deadline a timeout) are tool results. camelCase and
  snake_case keys both.
- **Bedrock Converse** (content blocks keyed by their kind): `text`, `reasoningContent` and `toolUse` are
  generated; `toolResult` (its `text` / `json` parts; `status` "error" is an error) is a tool result.
- **OpenAI Responses items** (`{"type": ...}` without a role): `message`, `reasoning`, `function_call` and other
  `*_call` items are generated; `function_call_output` and other `*_call_output` items are tool results.

Session logs, JSON Lines with one event per line (Claude Code transcripts, Codex CLI rollouts, any log that writes
a message per line), are read by `message_of`: a line's message is the line itself or what it carries under
`message` / `payload` / `item`; other lines (summaries, token counts, metadata) carry none. Codex's tool outputs
`{"output": ..., "metadata": {"exit_code": N}}` give their text and exit code. `codex exec --json` writes thread
items (`item.completed`; its `item.started` / `item.updated` lines repeat them unfinished and are skipped): the
agent's messages and reasoning are generated, a command (`aggregated_output`, `exit_code`), a file change, an MCP
tool call or a web search is a call and its result (`status` "failed" an error). It does not log the prompt (0).

The logs of agent frameworks (OpenHands event streams, LangChain serialized messages, smolagents messages and
memory steps) are rewritten by frameworks.py, which says what each reads; `expand` tries them first. Inspect AI's
messages (tool calls naming their function as a string, tool messages with `function` and `error`, `reasoning`
parts) are rewritten by inspect_logs.py.

Role aliases (`human`, `gpt`, `ai`, `bot`, `model`) are read in plain `role` / `content` messages too, and a
message's text under `text` where it has no `content` (nebius's SWE-agent trajectories: `ai` messages). A message
already in OpenAI form passes as it is. Anything unrecognised is left for `convert_messages`, which reports it in
one line.
"""

from __future__ import annotations

import json
from typing import Any

from libra.spec import checks
from libra.workloads.importers import frameworks, inline_tools, inspect_logs
from libra.workloads.importers.common import CALL_NAMES, RESPONSE, STATUS, json_text, text_of

_ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "ai": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "developer": "developer",
}
_ALIASED = frozenset(k for k, v in _ROLE_ALIASES.items() if k != v)  # the roles a message is rewritten from
_SHAREGPT_CALLS = {"function_call", "tool_call", "tool_calls"}
_SHAREGPT_RESULTS = {"observation", "function", "tool", "function_response", "tool_response", "ipython"}
_RESPONSE_ITEMS = {"message", "reasoning"}
# `codex exec --json`'s thread items (`item.completed` events; `reasoning` is one of the Responses items above)
_CODEX_ITEMS = {"agent_message", "command_execution", "file_change", "mcp_tool_call", "web_search"}
_GEMINI_KEYS = (
    ("functionCall", "function_call"),
    ("functionResponse", "function_response"),
    ("executableCode", "executable_code"),
    ("codeExecutionResult", "code_execution_result"),
)
_ANTHROPIC_BLOCKS = {"tool_use", "server_tool_use", "tool_result", "thinking", "redacted_thinking"}
# Bedrock Converse's content blocks are keyed by their kind (no `type`)
_CONVERSE_BLOCKS = ("toolUse", "toolResult", "reasoningContent")


def is_message(m: Any) -> bool:
    """Whether `m` looks like one chat message or log item of any dialect above."""
    if not isinstance(m, dict):
        return False
    if "role" in m or ("from" in m and "value" in m) or frameworks.is_framework_item(m):
        return True
    kind = m.get("type")
    return isinstance(kind, str) and (
        kind in _RESPONSE_ITEMS or kind in _CODEX_ITEMS or kind.endswith(("_call", "_call_output"))
    )


def expand(m: Any) -> tuple[Any, ...] | list[dict]:
    """One message or log item in OpenAI chat form: the message itself when it is in that form (or is not a
    message: `convert_messages` reports it), else the messages it stands for (module docstring); an assistant
    message with tool results inline in its text is split at them (inline_tools.py)."""
    if not _foreign(m):
        return (inline_tools.split(m) or (m,)) if _assistant(m) else (m,)
    return [y for x in _rewrite(m) for y in ((inline_tools.split(x) or (x,)) if _assistant(x) else (x,))]


def _assistant(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "assistant"


def _foreign(m: Any) -> bool:
    if not isinstance(m, dict):
        return False
    role = m.get("role")
    if role is None:
        return ("from" in m and "value" in m) or "type" in m or frameworks.is_framework_item(m)
    if frameworks.is_smolagents_message(m) or inspect_logs.is_inspect_message(m):
        return True
    if role in _ALIASED or "parts" in m:
        return True
    if "content" not in m and "text" in m:  # a message whose text is under `text` (nebius's SWE-agent trajectories)
        return True
    content = m.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict)
        and (
            b.get("type") in _ANTHROPIC_BLOCKS
            or str(b.get("type", "")).endswith("_tool_result")
            or any(k in b for k in _CONVERSE_BLOCKS)
        )
        for b in content
    )


def _rewrite(m: dict) -> list[dict]:
    framework = frameworks.rewrite(m)
    if framework is not None:
        return framework
    if "role" in m and inspect_logs.is_inspect_message(m):
        return inspect_logs.rewrite_message(m)
    if "role" not in m and "from" in m:
        return _sharegpt(m)
    if "role" not in m:
        return _responses_item(m)
    role = _ROLE_ALIASES.get(m["role"], m["role"])
    if "content" not in m and "parts" not in m and "text" in m:
        m = {**{k: v for k, v in m.items() if k != "text"}, "content": m["text"]}
    blocks = m.get("parts") if "parts" in m else m.get("content")
    if not isinstance(blocks, list):
        return [{**m, "role": role}]
    out = _blocks(role, blocks)
    if role == "assistant" and isinstance(m.get("id"), str) and m["id"] and out[0].get("role") == "assistant":
        # an Anthropic response's id (`msg_...`): Claude Code writes one response as several lines, a content
        # block each, its tool results possibly between them; they are one generation. (Only its first part
        # here: a server tool's result inside the message starts a generation of its own.)
        out[0][RESPONSE] = m["id"]
    return out


def _sharegpt(m: dict) -> list[dict]:
    who, value = m.get("from"), m.get("value")
    text = value if isinstance(value, str) else text_of(value)
    if who in _SHAREGPT_CALLS or who in _SHAREGPT_RESULTS:
        # a call or result stored as data (`{"name", "arguments"}`, a list of them, a result object): its JSON text
        text = text if isinstance(value, str) or value is None else json_text(value)
    if who in _SHAREGPT_CALLS:
        return [{"role": "assistant", "content": text, CALL_NAMES: _call_names(value)}]
    if who in _SHAREGPT_RESULTS:
        return [{"role": "tool", "content": text}]
    role = _ROLE_ALIASES.get(who, who) if isinstance(who, str) else who
    return [{"role": role, "content": text}]


def _call_names(value: Any) -> list[str]:
    """The tool names in a ShareGPT function call's value (`{"name": ...}` or a list of them, as JSON text or
    data); "tool" when it names none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # (a model may write anything as a call's text)
            return ["tool"]
    calls = value if isinstance(value, list) else [value]
    names = [c["name"] for c in calls if isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"]]
    return names or ["tool"]


def _codex_item(m: dict) -> list[dict]:
    """A `codex exec --json` thread item: the agent's message; a command, a file change, an MCP tool call or a web
    search as a call (generated) and its result (a tool message: output, exit code, status)."""
    kind, cid = m["type"], str(m.get("id", ""))
    if kind == "agent_message":
        return [{"role": "assistant", "content": text_of(m.get("text"))}]
    if kind == "command_execution":
        name, args, output = "shell", m.get("command", ""), m.get("aggregated_output", "")
    elif kind == "file_change":
        name, args, output = "apply_patch", m.get("changes", []), ""
    elif kind == "mcp_tool_call":
        tool: str = m["tool"] if isinstance(m.get("tool"), str) else "tool"
        name = f"{m['server']}.{tool}" if isinstance(m.get("server"), str) else tool
        args, output = m.get("arguments", ""), m.get("error") or m.get("result") or ""
    else:  # web_search
        name, args, output = "web_search", m.get("query", ""), ""
    call = {"id": cid, "function": {"name": name, "arguments": json_text(args)}}
    result: dict[str, Any] = {"role": "tool", "tool_call_id": cid, "content": json_text(output)}
    code = m.get("exit_code")
    if checks.is_whole(code):
        result["exit_code"] = code
    if m.get("status") in ("failed", "declined") or (kind == "mcp_tool_call" and m.get("error")):
        result["is_error"] = True
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, result]


def _responses_item(m: dict) -> list[dict]:
    kind = m.get("type")
    if kind in _CODEX_ITEMS:
        return _codex_item(m)
    if kind == "message":
        role = m.get("role")
        return [
            {
                "role": _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role,
                "content": text_of(m.get("content")),
            }
        ]
    if kind == "reasoning":
        if "summary" not in m and "content" not in m and "text" in m:  # `codex exec --json`'s reasoning
            return [{"role": "assistant", "content": text_of(m["text"])}]
        return [{"role": "assistant", "content": "\n".join(text_of(m.get(k)) for k in ("summary", "content"))}]
    if isinstance(kind, str) and kind.endswith("_call_output"):
        result: dict[str, Any] = {"role": "tool", "tool_call_id": str(m.get("call_id", ""))}
        result["content"] = json_text(m.get("output", ""))
        inner = _json_output(m.get("output"))
        if inner is not None:  # Codex CLI: {"output": text, "metadata": {"exit_code": N, ...}}
            result["content"], code = inner
            if code is not None:
                result["exit_code"] = code
        return [result]
    if isinstance(kind, str) and kind.endswith("_call"):
        name = m.get("name") if isinstance(m.get("name"), str) else kind[: -len("_call")]
        args = next((m[k] for k in ("arguments", "input", "action") if k in m), "")
        call = {"id": str(m.get("call_id", m.get("id", ""))), "function": {"name": name, "arguments": json_text(args)}}
        return [{"role": "assistant", "content": "", "tool_calls": [call]}]
    return [m]  # not an item of any dialect: `convert_messages` names it


def _json_output(output: Any) -> tuple[str, int | None] | None:
    """`(text, exit code)` of a tool output written as JSON `{"output": text, "metadata": {"exit_code": N}}`."""
    if not isinstance(output, str) or not output.startswith("{"):
        return None
    try:
        value = json.loads(output)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("output"), str):
        return None
    meta = value.get("metadata")
    code = meta.get("exit_code") if isinstance(meta, dict) else None
    return value["output"], code if checks.is_whole(code) else None


# the keys under which a session log's event line carries its message (Claude Code: `message`; Codex CLI:
# `payload` of a `response_item`)
_ENVELOPES = ("message", "payload", "item")


def message_of(event: Any) -> dict | None:
    """The chat message (any dialect above) one line of a session log holds, or None: a line that is itself a
    message, or carries one under `message`, `payload` or `item`. A subagent's line (Claude Code's
    `isSidechain`) is not the session's own conversation: None."""
    if not isinstance(event, dict) or event.get("isSidechain") is True:
        return None
    if event.get("type") in ("item.started", "item.updated"):  # `codex exec --json`: the item again when completed
        return None
    for key in _ENVELOPES:
        inner = event.get(key)
        if is_message(inner):
            return inner
    return event if is_message(event) else None


def _blocks(role: str, blocks: list) -> list[dict]:
    """One message of Anthropic content blocks or Gemini parts, split where a tool result sits among them:
    generated blocks gather into assistant messages (or the message's own role), results become tool messages."""
    out: list[dict] = []
    texts: list[str] = []
    calls: list[dict] = []

    def flush() -> None:
        if texts or calls:
            msg: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = list(calls)
            out.append(msg)
            texts.clear()
            calls.clear()

    for b in blocks:
        if isinstance(b, str):
            texts.append(b)
            continue
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        gemini = next(((k, b.get(k) if k in b else b.get(s)) for k, s in _GEMINI_KEYS if k in b or s in b), None)
        if kind in ("tool_use", "server_tool_use"):
            fn = {"name": str(b.get("name") or "tool"), "arguments": json_text(b.get("input", ""))}
            calls.append({"id": str(b.get("id", "")), "function": fn})
        elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
            flush()
            result: dict[str, Any] = {"role": "tool", "tool_call_id": str(b.get("tool_use_id", ""))}
            result["content"] = (
                text_of(b.get("content")) if not isinstance(b.get("content"), dict) else json_text(b["content"])
            )
            if isinstance(b.get("is_error"), bool):
                result["is_error"] = b["is_error"]
            out.append(result)
        elif isinstance(b.get("toolUse"), dict):  # Bedrock Converse: {"toolUse": {toolUseId, name, input}}
            use = b["toolUse"]
            fn = {"name": str(use.get("name") or "tool"), "arguments": json_text(use.get("input", ""))}
            calls.append({"id": str(use.get("toolUseId", "")), "function": fn})
        elif isinstance(b.get("toolResult"), dict):  # {"toolResult": {toolUseId, content: [{text} | {json}], status}}
            flush()
            res = b["toolResult"]
            parts = res.get("content") if isinstance(res.get("content"), list) else []
            text = "\n".join(
                text_of(p["text"]) if "text" in p else json_text(p.get("json", ""))
                for p in parts
                if isinstance(p, dict)
            )
            result = {"role": "tool", "tool_call_id": str(res.get("toolUseId", "")), "content": text}
            if res.get("status") == "error":
                result["is_error"] = True
            out.append(result)
        elif isinstance(b.get("reasoningContent"), dict):  # Converse's reasoning: {reasoningText: {text}}
            reasoning = b["reasoningContent"].get("reasoningText")
            texts.append(text_of(reasoning.get("text")) if isinstance(reasoning, dict) else "")
        elif kind == "thinking":
            texts.append(str(b.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # encrypted: no text to count
        elif gemini is not None:
            key, value = gemini
            value = value if isinstance(value, dict) else {}
            if key == "functionCall":
                fn = {"name": str(value.get("name") or "tool"), "arguments": json_text(value.get("args", ""))}
                calls.append({"id": str(value.get("id", "")), "function": fn})
            elif key == "executableCode":
                texts.append(str(value.get("code", "")))
                calls.append({"id": "", "function": {"name": "code_execution", "arguments": ""}})
            elif key == "functionResponse":
                # Gemini's convention: the result under "output", a failure under "error"
                flush()
                response = value.get("response", "")
                result = {"role": "tool", "name": str(value.get("name") or "tool")}
                output = response.get("output") if isinstance(response, dict) else None
                result["content"] = output if isinstance(output, str) else json_text(response)
                if isinstance(response, dict) and response.get("error"):
                    result["is_error"] = True
                out.append(result)
            else:  # codeExecutionResult
                flush()
                outcome = str(value.get("outcome", ""))
                result = {"role": "tool", "name": "code_execution", "content": str(value.get("output", ""))}
                if "DEADLINE" in outcome:
                    result[STATUS] = "timeout"
                elif outcome and outcome != "OUTCOME_OK":
                    result["is_error"] = True
                out.append(result)
        else:
            value = b.get("text", b.get("content"))
            if value is not None:
                texts.append(text_of(value))
    flush()
    if not out:  # a message with no content at all keeps its place (an empty generation or return)
        out.append({"role": role, "content": ""})
    return out
