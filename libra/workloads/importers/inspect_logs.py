"""Inspect AI evaluation logs (UK AI Security Institute's `inspect_ai`), read by `libra trace import --format openai`.

Logs: a JSON log (`--log-format json`: one object with `version`, `eval` and `samples`) or an `.eval` log (a zip
archive: `header.json`, or only `_journal/start.json` while a run is unfinished, and one `samples/{id}_epoch_{N}.json`
per sample). An `.eval` file is recognised by its zip signature, not its name; its samples are read one at a time,
in the order inspect_ai's own reader gives them (epoch, then sample id: numeric ids in numeric order), which is
also the order of a JSON log converted from it. A truncated or corrupt archive, a member that is not JSON and an
archive without samples are errors naming the file (and the member).

Each sample is one trajectory: prompt id `{task}/{id}` (the task from `eval.task`), so that the epochs of one sample
share a prompt; its epoch is the trajectory's `sample`; its reward is the first scorer's value as inspect_ai's
`value_to_float` reads it (numbers, booleans, `C` / `I` / `P` / `N`, yes / no, true / false, numeric text; else
none); `meta` keeps the task, the model, the sample id and epoch, and the limit or error that halted it. The
sample's `messages` are the whole conversation (system and input messages first: the prompt).

Messages (inspect_ai `model/_chat_message.py`, `tool/_tool_call.py`, `_util/content.py`) are rewritten into OpenAI
chat form by `rewrite_message`:
- an assistant's `tool_calls` are `{"id", "function": name, "arguments": {...}}`: the name and the arguments (as
  JSON) are generated text, as in OpenAI form;
- content is a string or a list of parts: `text`, `reasoning` (counted unless `redacted`: then it is encrypted),
  `tool_use` (a server-side tool such as web search: its name and arguments are generated, its result comes back
  as a return named after it, an `error` in it making that return an error); images, audio, video, documents and
  data parts have no text to count;
- a `tool` message names its tool in `function`; its `error` (`{"type", "message"}`) replaces its content in what
  the model sees, as inspect_ai's providers send it (OpenAI chat: `Error: {message}`), and sets its status: type
  `timeout` is a timeout, any other type an error. A long text in a message may be stored once in the sample's
  `attachments` (`attachment://{hash}`): it is resolved before counting.

A sample that inspect_ai recorded as failed (its `error` set) before the model generated anything holds no
trajectory (a sandbox that did not start, say): it is skipped, and one warning per file on stderr (the
`libra.workloads.importers` logger) names the skipped samples, so that one failed sample does not stop the import
of a large log. A sample without an error and without a generation is still an error.
"""

from __future__ import annotations

import json
import re
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libra.workloads.importers.common import STATUS, json_text, text_of, warn_skipped
from libra.workloads.trace import TraceError

_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; the end record of an empty archive
_SAMPLE_MEMBER = re.compile(r"\Asamples/(.+)_epoch_(\d+)\.json\Z")
_HEADERS = ("header.json", "_journal/start.json")
_ATTACHMENT = "attachment://"
_SCORE_WORDS = {"c": 1.0, "i": 0.0, "p": 0.5, "n": 0.0, "yes": 1.0, "true": 1.0, "no": 0.0, "false": 0.0}


def is_archive(path: Path) -> bool:
    """Whether a file starts with a zip signature (an `.eval` log; no other accepted input does)."""
    try:
        with path.open("rb") as f:
            return f.read(4) in _ZIP_SIGNATURES
    except OSError:
        return False  # the ordinary reader reports it


def is_log(value: Any) -> bool:
    """Whether a JSON value is an Inspect JSON log: an object with `eval` (an object) and a `samples` list."""
    return isinstance(value, dict) and isinstance(value.get("eval"), dict) and isinstance(value.get("samples"), list)


def records(log: dict, path: Path) -> Iterator[tuple[str, dict]]:
    """`(where, record)` for each sample of a JSON log, the record in the form `import_openai` reads (samples that
    failed before any generation skipped: module docstring)."""
    skipped = []
    for i, sample in enumerate(log["samples"]):
        if failed_before_generation(sample):
            skipped.append(f"samples[{i}] (id {sample.get('id')}, epoch {sample.get('epoch')})")
            continue
        yield f"samples[{i}]", sample_record(sample, log["eval"])
    _warn_skipped(path, skipped)


def failed_before_generation(sample: Any) -> bool:
    """Whether inspect_ai recorded the sample as failed (`error` set) before any assistant message."""
    if not isinstance(sample, dict) or not isinstance(sample.get("error"), dict):
        return False
    messages = sample.get("messages")
    return not any(isinstance(m, dict) and m.get("role") == "assistant" for m in (messages or ()))


def _warn_skipped(path: Path, skipped: list[str]) -> None:
    warn_skipped(path, skipped, "Inspect sample(s) that failed before any model generation")


def archive_records(path: Path) -> Iterator[tuple[str, dict]]:
    """`(member, record)` for each sample of an `.eval` archive (module docstring: order and errors)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise TraceError(
            path, None, None, f"not a readable .eval (zip) archive, truncated or corrupt? ({exc})"
        ) from None
    with archive:
        names = archive.namelist()
        members = sorted((n for n in names if _SAMPLE_MEMBER.match(n)), key=_order)
        if not members:
            raise TraceError(path, None, None, "an Inspect .eval archive without samples (no samples/*.json member)")
        header: Any = next((_member(archive, path, n) for n in _HEADERS if n in names), {})
        spec = header.get("eval") if isinstance(header, dict) else None
        skipped = []
        for name in members:
            sample = _member(archive, path, name)
            if failed_before_generation(sample):
                skipped.append(name)
                continue
            yield name, sample_record(sample, spec if isinstance(spec, dict) else {})
    _warn_skipped(path, skipped)


def _order(name: str) -> tuple[int, str]:
    """inspect_ai's `sort_samples`: epoch, then the id (a numeric id zero-filled so that it sorts as a number)."""
    m = _SAMPLE_MEMBER.match(name)
    assert m is not None
    sid = m.group(1)
    return int(m.group(2)), sid.zfill(20) if sid.isdigit() else sid


def _member(archive: zipfile.ZipFile, path: Path, name: str) -> Any:
    try:
        data = archive.read(name)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError) as exc:
        raise TraceError(path, None, None, f"member {name}: cannot be read, truncated or corrupt? ({exc})") from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, None, f"member {name}: not UTF-8 (at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(path, None, None, f"member {name}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise TraceError(path, None, None, f"member {name}: not valid JSON (nested too deeply)") from None


def sample_record(sample: Any, spec: dict) -> dict:
    """One sample as a record of `import_openai`: its messages (attachments resolved), prompt id, epoch, reward
    and meta (module docstring)."""
    if not isinstance(sample, dict):
        return {"messages": []}  # `import_openai` reports an empty record
    attachments = sample.get("attachments") if isinstance(sample.get("attachments"), dict) else {}
    messages = sample.get("messages") if isinstance(sample.get("messages"), list) else []
    task = spec.get("task") if isinstance(spec.get("task"), str) else ""
    record: dict[str, Any] = {"messages": _resolve(messages, attachments) if attachments else messages}
    sid = sample.get("id")
    record["prompt_id"] = f"{task}/{sid}" if task else str(sid)
    if isinstance(sample.get("epoch"), int):
        record["sample"] = sample["epoch"]
    reward = _reward(sample.get("scores"))
    if reward is not None:
        record["reward"] = reward
    meta = {"task": task, "model": spec.get("model"), "sample_id": sid, "epoch": sample.get("epoch")}
    limit = sample.get("limit")
    if isinstance(limit, dict) and isinstance(limit.get("type"), str):
        meta["limit"] = limit["type"]
    error = sample.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        meta["error"] = error["message"].strip().splitlines()[0] if error["message"].strip() else "error"
    record.update({k: v for k, v in meta.items() if isinstance(v, str | int) and v != ""})
    return record


def _resolve(value: Any, attachments: dict) -> Any:
    if isinstance(value, str):
        if value.startswith(_ATTACHMENT):
            found = attachments.get(value[len(_ATTACHMENT) :])
            return found if isinstance(found, str) else value
        return value
    if isinstance(value, list):
        return [_resolve(v, attachments) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, attachments) for k, v in value.items()}
    return value


def _reward(scores: Any) -> float | None:
    """The first scorer's value as a float (inspect_ai's `value_to_float` with its default values), else None."""
    if not isinstance(scores, dict) or not scores:
        return None
    first = next(iter(scores.values()))
    value = first.get("value") if isinstance(first, dict) else None
    if isinstance(value, int | float):  # bool included, as inspect_ai reads it
        return float(value) if isinstance(value, bool) else value  # (an integer past a float: build_trajectory)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _SCORE_WORDS:
            return _SCORE_WORDS[word]
        try:
            number = float(word)
        except ValueError:
            return None
        return number if number == number and abs(number) != float("inf") else None
    return None


# messages


def is_inspect_message(m: dict) -> bool:
    """Whether a role-keyed message is in Inspect's form (a field OpenAI's form does not have): a tool call whose
    `function` is a name, a tool message with `function` or an `{"type", "message"}` error, or a content part that
    only Inspect writes (`reasoning` with its text under `reasoning`, `tool_use` with `tool_type`)."""
    role = m.get("role")
    if role == "assistant":
        calls = m.get("tool_calls")
        if isinstance(calls, list) and any(isinstance(c, dict) and isinstance(c.get("function"), str) for c in calls):
            return True
    elif role == "tool":
        err = m.get("error")
        if isinstance(m.get("function"), str) or (isinstance(err, dict) and "type" in err and "message" in err):
            return True
    content = m.get("content")
    return isinstance(content, list) and any(_inspect_part(p) for p in content)


def _inspect_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return (kind == "reasoning" and "reasoning" in part) or (kind == "tool_use" and "tool_type" in part)


def rewrite_message(m: dict) -> list[dict]:
    """An Inspect message in OpenAI chat form (module docstring): one message, or an assistant message followed by
    the results of the server-side tools it used."""
    role = m["role"]
    text, used = _content(m.get("content"))
    if role == "tool":
        result: dict[str, Any] = {"role": "tool", "content": text}
        if isinstance(m.get("tool_call_id"), str):
            result["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("function"), str):
            result["name"] = m["function"]
        err = m.get("error")
        if isinstance(err, dict):
            message = err.get("message")
            if isinstance(message, str) and message:
                result["content"] = f"Error: {message}"
            if err.get("type") == "timeout":
                result[STATUS] = "timeout"
            else:
                result["is_error"] = True
        return [result]
    calls = [
        {"id": str(c.get("id", "")), "function": {"name": str(c["function"]), "arguments": _dump(c.get("arguments"))}}
        for c in m.get("tool_calls") or ()
        if isinstance(c, dict) and isinstance(c.get("function"), str)
    ]
    calls += [{"id": "", "function": {"name": name, "arguments": args}} for name, args, _ in used]
    msg: dict[str, Any] = {"role": role, "content": text}
    if calls:
        msg["tool_calls"] = calls
    returns = [r for _, _, r in used]
    return [msg, *returns]


def _content(content: Any) -> tuple[str, list[tuple[str, str, dict]]]:
    """The text of a content (string or parts) and its server-side tool uses `(name, arguments, return)`."""
    if not isinstance(content, list):
        return text_of(content), []
    texts: list[str] = []
    used: list[tuple[str, str, dict]] = []
    for part in content:
        if not isinstance(part, dict):
            texts.append(text_of(part))
            continue
        kind = part.get("type")
        if kind == "reasoning":
            if part.get("redacted") is not True and isinstance(part.get("reasoning"), str):
                texts.append(part["reasoning"])
        elif kind == "tool_use" and "tool_type" in part:
            name = str(part.get("name") or part.get("tool_type") or "tool")
            back: dict[str, Any] = {"role": "tool", "name": name, "content": _dump(part.get("result", ""))}
            if part.get("error"):
                back["content"] = f"{back['content']}\n{part['error']}" if back["content"] else str(part["error"])
                back["is_error"] = True
            used.append((name, _dump(part.get("arguments", "")), back))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts), used


def _dump(value: Any) -> str:
    return "" if value is None else json_text(value)
