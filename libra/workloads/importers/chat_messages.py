"""One chat message list (OpenAI chat-completions messages, and the dialects rewritten into them) to a prompt and
the generations and returns after it, the part of `--format openai` that the SWE-agent readers share
(openai_chat.py finds the records and message lists in a file; swe_agents.py reads its own files' messages here).

Messages before the first assistant message (system, developer, user) are the prompt. Each assistant message is
one generation: its content, reasoning (`reasoning_content`, `reasoning`, `thinking`; one text under two keys
counted once), refusal and tool calls (name and arguments). Every later non-assistant message is a return that
goes back into the context: `tool` / `function` messages are tool results (the tool's name from the matching
call, `name`, or "tool"), `user` messages the user's (or a user simulator's) reply, tool "user"; a tool result's
`status` (`error`, `timeout`), `is_error` / `error` (a flag, or the message of what failed), a JSON text's
non-empty `error` (ToolBench's results) and an exit code (at either end of the text) set its status before its text
does. An assistant message without structured calls that writes a ReAct step (`Action: NAME`, then `Action
Input:`) names the tool of the result after it. The parts of one model response written as several assistant
messages with results between them (OpenHands actions, Claude Code lines: the response id they share) are one
generation. Message contents may be strings or lists of text parts. Counts are of the text only (a chat template
adds a few tokens per message).

Dataset rows that store the message list as JSON text are decoded first (`decoded_messages`); a record's `reward`
and its other scalar fields (`meta_of`) travel with its trajectory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libra.spec import checks
from libra.workloads.importers.common import CALL_NAMES, RESPONSE, STATUS, Return, Segment, StatusRules, text_of
from libra.workloads.importers.dialects import expand, is_message
from libra.workloads.trace import TOOL_STATUSES, TraceError

# `history`: OpenHands trajectories and evaluation outputs; `steps`: smolagents memory steps; `contents`: a Gemini
# request; `trajectory`: only a message list (a SWE-agent `.traj`'s steps are read by swe_agents.py)
MESSAGE_KEYS = ("messages", "traj", "conversation", "conversations", "history", "steps", "contents", "trajectory")
SAMPLE_KEYS = ("sample", "trial")

# a tool message's `status` (LangChain's ToolMessage and other loggers): these two set it; `success` and the like
# leave it to the other fields and the text
_ERROR_STATUSES = ("error", "failed", "failure")
_TIMEOUT_STATUSES = ("timeout", "timed_out")
# an assistant message's reasoning: vLLM / DeepSeek `reasoning_content`, OpenRouter and later vLLM `reasoning`,
# Ollama `thinking`
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
# a ReAct step written as text (ToolBench, AgentTuning and other ShareGPT-style agent sets): `Action: NAME` then
# `Action Input: ...` on a later line; NAME names the tool whose result follows
_REACT_RE = re.compile(r"^Action:[ \t]*([A-Za-z_][\w.\-]*)[ \t]*\r?\n(?:.*\n)*?Action Input:", re.M)
_EXIT_RE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>|\bexit(?:_| )code:?\s*(-?\d+)", re.I)


def exit_code_in(text: str) -> int | None:
    """An exit code stated at either end of a return's text (`<returncode>N</returncode>` before the output, as
    mini-swe-agent writes it; `exit code N` after it, as OpenHands' `[Command finished with exit code N]` closes a
    command's output, however long), else None."""
    m = _EXIT_RE.search(text[:400]) or _EXIT_RE.search(text[-400:])
    if m is None:
        return None
    return int(m.group(1) if m.group(1) is not None else m.group(2))


def decoded_messages(record: dict) -> dict:
    """The record with its message list in place of the JSON text that holds it, where a dataset stores the list as
    a string (tables keep nested lists of varying shape as text: exported rows of SWE-smith's trajectories); else
    the record itself. Text that is not a JSON list of messages is left as it is (it is then not a message list)."""
    for key in MESSAGE_KEYS:
        text = record.get(key)
        if isinstance(text, str) and text.lstrip().startswith("["):
            try:
                value = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                return record
            if isinstance(value, list) and value and all(is_message(m) for m in value):
                return {**record, key: value}
            return record
    return record


def gen_text(msg: dict) -> tuple[str, list[tuple[str, str]]]:
    """The generated text of an assistant message and its tool calls `(id, name)`."""
    parts = [text_of(msg.get("content"))]
    reasoning: list[str] = []
    for key in _REASONING_KEYS:
        value = msg.get(key)
        if isinstance(value, str) and value not in reasoning:  # vLLM states one text under two keys: counted once
            reasoning.append(value)
    parts += reasoning
    if isinstance(msg.get("refusal"), str):  # what the model wrote instead of an answer (content is then null)
        parts.append(msg["refusal"])
    calls = []
    for call in msg.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn: dict = call["function"] if isinstance(call.get("function"), dict) else call
        name: str = fn["name"] if isinstance(fn.get("name"), str) else "tool"
        args = fn.get("arguments", "")
        parts.append(name)
        parts.append(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
        calls.append((str(call.get("id", "")), name))
    calls += [("", name) for name in msg.get(CALL_NAMES) or ()]  # a ShareGPT call: its text is the content
    fc = msg.get("function_call")
    if isinstance(fc, dict):
        parts += [str(fc.get("name", "")), str(fc.get("arguments", ""))]
        calls.append(("", str(fc.get("name") or "tool")))
    if not calls:  # a call written as text in the ReAct layout: its name (the text is already counted)
        calls += [("", m.group(1)) for m in _REACT_RE.finditer(parts[0])]
    return "\n".join(p for p in parts if p), calls


def convert_messages(
    messages: list,
    *,
    count: Callable[[str], int],
    rules: StatusRules,
    path: Path,
    line: int | None,
    where: str = "",
    user_tool: str = "user",
    user_exit_codes: bool = False,
) -> tuple[int, list[Segment]]:
    """`(prompt_tokens, segments)` of one message list (module docstring; other dialects are read through
    dialects.py). `user_tool` names the returns of user messages; with `user_exit_codes`, an exit code in a user
    message's text sets its status (agents whose environment answers as the user, e.g. mini-swe-agent)."""
    prompt = 0
    segments: list[Segment] = []
    gen: int | None = None
    returns: list[Return] = []
    names: dict[str, str] = {}
    last_calls: list[str] = []
    response: Any = None  # the model response the open generation is part of (`RESPONSE`), if stated
    for i, raw in enumerate(messages):
        for msg in expand(raw):
            if not isinstance(msg, dict):
                raise TraceError(path, line, f"{where}messages[{i}]", f"must be an object, got {type(msg).__name__}")
            role = msg.get("role")
            if not isinstance(role, str):
                raise TraceError(path, line, f"{where}messages[{i}].role", f"must be a string, got {role!r}")
            if role == "assistant":
                text, calls = gen_text(msg)
                names.update((cid, name) for cid, name in calls if cid)
                part_of = msg.get(RESPONSE)
                if gen is not None and isinstance(part_of, str) and part_of and part_of == response:
                    gen += count(text)  # another part of the open generation's response: the same generation
                    last_calls += [name for _, name in calls]
                    continue
                if gen is not None:
                    segments.append(Segment(gen, tuple(returns)))
                gen, returns, response = count(text), [], part_of
                last_calls = [name for _, name in calls]
                continue
            text = text_of(msg.get("content"))
            if gen is None:  # before the first generation: the prompt
                prompt += count(text)
                continue
            if role in ("tool", "function", "ipython"):
                returns.append(
                    Return(_tool_name(msg, names, last_calls, len(returns)), count(text), _status(msg, text, rules))
                )
            elif role == "user" or role == "system" or role == "developer":
                code = exit_code_in(text) if user_exit_codes else None
                status = rules.classify(text, exit_code=code) if user_exit_codes else "ok"
                returns.append(Return(user_tool if role == "user" else role, count(text), status))
            else:  # another role (environment, observation, ...): a return named after it
                returns.append(Return(role, count(text), rules.classify(text)))
    if gen is not None:
        segments.append(Segment(gen, tuple(returns)))
    return prompt, segments


def _tool_name(msg: dict, names: dict[str, str], last_calls: list[str], position: int) -> str:
    """A tool result's tool: the call it answers (by id), its own `name`, else the open generation's calls in
    order, else "tool"."""
    tool = names.get(str(msg.get("tool_call_id", ""))) or msg.get("name")
    if not isinstance(tool, str) or not tool:
        tool = last_calls[position] if position < len(last_calls) else "tool"
    return tool


def _status(msg: dict, text: str, rules: StatusRules) -> str:
    """A tool result's status: one a rewritten dialect states, else its `status` (`error`, `timeout`), error flag
    (`is_error`, else `error`: a flag, or a message or object that says what failed) and exit code, then its
    text (`StatusRules`)."""
    stated = msg.get(STATUS)
    if stated in TOOL_STATUSES:
        return stated
    if msg.get("status") in _TIMEOUT_STATUSES:
        return "timeout"
    err = next((f for f in (_flag(msg.get("is_error")), _flag(msg.get("error"))) if f is not None), None)
    if err is None and msg.get("status") in _ERROR_STATUSES:
        err = True
    if err is None:
        err = _stated_error(text)
    code = msg.get("exit_code", msg.get("returncode"))
    code = code if checks.is_whole(code) else exit_code_in(text)
    return rules.classify(text, error=err, exit_code=code)


def _stated_error(text: str) -> bool | None:
    """True where a result's text is a JSON object whose `error` says what failed (ToolBench's function results,
    `{"error": "...", "response": "..."}`), else None: an empty `error` leaves the status to the text."""
    if not text.startswith("{") or '"error"' not in text:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or _flag(value.get("error")) is not True:
        return None
    return True


def _flag(value: Any) -> bool | None:
    """An error field read as a flag: a boolean as it is, a non-empty message or object (what failed) True,
    anything else (null, empty) None: not stated."""
    if isinstance(value, bool):
        return value
    return True if isinstance(value, str | dict) and value else None


def reward_of(record: dict) -> float | None:
    value = record.get("reward")
    if value is None and isinstance(record.get("reward_info"), dict):
        value = record["reward_info"].get("reward")
    if not checks.is_real(value):
        return None
    return value  # (not float(): an integer past a float's range is kept by build_trajectory, not an OverflowError)


def meta_of(record: dict, used: tuple[str, ...] = ()) -> dict[str, Any]:
    skip = set(MESSAGE_KEYS) | set(SAMPLE_KEYS) | {"reward", "__shared_prompt__", *used}
    return {k: v for k, v in record.items() if k not in skip and (v is None or isinstance(v, str | int | float | bool))}
