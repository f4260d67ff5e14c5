"""Gemini CLI session files, rewritten into OpenAI chat form for `convert_messages`.

Gemini CLI (google-gemini/gemini-cli, `packages/core/src/services/chatRecordingService.ts` and
`chatRecordingTypes.ts`) records each chat session in `~/.gemini/tmp/<project>/chats/` in one of two shapes:

- **JSON** (`session-*.json`, releases before April 2026): one conversation record, `sessionId`, `projectHash`,
  `startTime`, `lastUpdated` and `messages`.
- **JSON Lines** (`session-*.jsonl`, later releases): a first line of the same metadata without `messages`, then one
  line per message record, written again whole each time the message changes (same `id`: the later line
  replaces the earlier one in place), `{"$rewindTo": id}` lines (that message and all after it are dropped) and
  `{"$set": {...}}` metadata updates (a `$set` of `messages` replaces the whole list). `replay` applies them in order,
  as the CLI's loader does, and gives the conversation record of the JSON shape.

Each file is one trajectory, its prompt id the `sessionId`; the other scalar fields (and the model of the first
model message, `model`) are kept under `meta`. Of the message records (`id`, `timestamp`, `type`, `content`):

- `user` messages are the user's text (before the first model message: the prompt). Since May 2026 the CLI also
  records the function responses it sends back as a `user` message; such a message repeats the tool calls'
  recorded `result`s and is skipped when every response in it answers a call that has one (else its responses
  are tool results, read by the Gemini dialect of dialects.py).
- `gemini` messages are generations: the text of `content`, the thoughts (`thoughts`' subject and description, or
  `thought` parts of the content) and the tool calls' names and `args` (from `functionCall` parts of the content
  when it has them, else from `toolCalls`). The recorded `tokens` are not used: counts come from the texts.
- each entry of a message's `toolCalls` with a `result` (function-response parts, as sent to the model) is one tool
  return named after the call: its text is each response's `output` (else the whole response) and any text parts.
  A call with status `error`, or whose response holds an `error`, is an error; so is a `cancelled` call: the tool
  did not finish and the model is sent an error response ("[Operation Cancelled] ..."). Otherwise the usual text
  rules decide (a timeout or a non-zero exit code in the text). A call without a result never reached the model.
- `info`, `warning` and `error` messages (and any other type) are the CLI's own notices to the user: its session
  resume (`convertSessionToClientHistory`) leaves them out of what the model is sent, so they are skipped here.

Qwen Code (QwenLM/qwen-code, a fork) writes a different shape, JSON Lines of `{uuid, parentUuid, sessionId, type,
message}` with `message` a Gemini `{role, parts}` content; that is a session log read by `dialects.message_of`.
Gemini CLI's `/chat save` checkpoints (a list of `{role, parts}`, or `{"history": [...]}`) are read by the Gemini
dialect too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from libra.workloads.importers.common import json_text, text_of

_MESSAGE_TYPES = {"user", "gemini", "info", "error", "warning"}
_ERROR_STATUSES = {"error", "cancelled"}


def is_conversation(value: Any) -> bool:
    """Whether a JSON value is a Gemini CLI conversation record: `sessionId` and `projectHash` strings and
    `messages` of message records (objects with a `type` and no `role`)."""
    return (
        _is_metadata(value)
        and isinstance(value.get("messages"), list)
        and all(isinstance(m, dict) and "type" in m and "role" not in m for m in value["messages"])
    )


def is_session_head(value: Any) -> bool:
    """Whether a JSON Lines file's first line is the metadata line of a Gemini CLI session (no `messages`)."""
    return _is_metadata(value) and "messages" not in value and "type" not in value and "role" not in value


def _is_metadata(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("sessionId"), str)
        and isinstance(value.get("projectHash"), str)
    )


def replay(lines: Iterable[Any]) -> dict:
    """The conversation record a JSON Lines session file stands for (module docstring). Lines that are none of
    the record kinds are ignored, as the CLI ignores them."""
    meta: dict[str, Any] = {}
    messages: dict[str, dict] = {}  # by id, in the order first written (a dict keeps it, as a JS Map does)
    for line in lines:
        if not isinstance(line, dict):
            continue
        if isinstance(line.get("$rewindTo"), str):
            ids = list(messages)
            cut = ids.index(line["$rewindTo"]) if line["$rewindTo"] in ids else 0
            for key in ids[cut:]:
                del messages[key]
        elif isinstance(line.get("id"), str):
            messages[line["id"]] = line
        elif isinstance(line.get("$set"), dict):
            update = line["$set"]
            if isinstance(update.get("messages"), list):
                messages = {
                    m["id"]: m for m in update["messages"] if isinstance(m, dict) and isinstance(m.get("id"), str)
                }
            meta.update((k, v) for k, v in update.items() if k != "messages")
        elif _is_metadata(line):
            meta.update((k, v) for k, v in line.items() if k != "messages")
            if isinstance(line.get("messages"), list):
                messages.update(
                    (m["id"], m) for m in line["messages"] if isinstance(m, dict) and isinstance(m.get("id"), str)
                )
    return {**meta, "messages": list(messages.values())}


def record(conversation: dict) -> dict:
    """A conversation record as a trajectory record of openai_chat: `prompt_id` from `sessionId`, the messages in
    OpenAI chat form, the first model message's `model`, the other fields as they are."""
    out = {k: v for k, v in conversation.items() if k not in ("sessionId", "messages")}
    out["prompt_id"] = conversation["sessionId"]
    records = [m for m in conversation["messages"] if isinstance(m, dict)]
    model = next((m["model"] for m in records if m.get("type") == "gemini" and isinstance(m.get("model"), str)), None)
    if model is not None:
        out["model"] = model
    out["messages"] = messages(records)
    return out


def messages(records: list[dict]) -> list[dict]:
    """The messages of a conversation record in OpenAI chat form (module docstring)."""
    answered = {
        str(call.get("id"))
        for m in records
        if m.get("type") == "gemini"
        for call in _calls(m)
        if call.get("result") is not None
    }
    out: list[dict] = []
    for m in records:
        kind = m.get("type")
        if kind == "gemini":
            out.append(_generation(m))
            out += [_tool_return(call) for call in _calls(m) if call.get("result") is not None]
        elif kind == "user":
            parts = _parts(m.get("content"))
            responses = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
            if responses and all(str(r.get("id")) in answered for r in responses):
                continue  # the function responses again, as recorded in the tool calls' results
            out.append({"role": "user", "parts": parts} if responses else {"role": "user", "content": text_of(parts)})
        # info, warning, error and other types: never sent to the model
    return out


def _calls(m: dict) -> list[dict]:
    calls = m.get("toolCalls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _parts(content: Any) -> list[dict]:
    """A PartListUnion (a string, one part, or a list of parts and strings) as a list of parts."""
    items = content if isinstance(content, list) else [] if content is None else [content]
    return [{"text": p} if isinstance(p, str) else p for p in items if isinstance(p, str | dict)]


def _generation(m: dict) -> dict:
    parts = _parts(m.get("content"))
    texts = [str(p["text"]) for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
    thoughts = [str(p["text"]) for p in parts if isinstance(p.get("text"), str) and p.get("thought")]
    calls = [p["functionCall"] for p in parts if isinstance(p.get("functionCall"), dict)]
    if not calls and not thoughts:  # older records keep thoughts and calls beside the content, not in it
        for t in m.get("thoughts") or ():
            if isinstance(t, dict):
                subject, description = str(t.get("subject") or ""), str(t.get("description") or "")
                thoughts.append(f"**{subject}** {description}" if subject else description)
        calls = _calls(m)
    tool_calls = [
        {
            "id": str(c.get("id", "")),
            "type": "function",
            "function": {"name": str(c.get("name") or "tool"), "arguments": json_text(c.get("args", {}))},
        }
        for c in calls
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def _tool_return(call: dict) -> dict:
    texts: list[str] = []
    failed = call.get("status") in _ERROR_STATUSES
    for part in _parts(call["result"]):
        response = part.get("functionResponse")
        if isinstance(response, dict):
            body = response.get("response", "")
            output = body.get("output") if isinstance(body, dict) else None
            texts.append(output if isinstance(output, str) else json_text(body))
            failed = failed or (isinstance(body, dict) and bool(body.get("error")))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    result: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": str(call.get("id", "")),
        "name": str(call.get("name") or "tool"),
    }
    result["content"] = "\n".join(texts)
    if failed:  # else the text rules decide (an exit code or a timeout in the text)
        result["is_error"] = True
    return result
