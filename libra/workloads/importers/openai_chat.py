"""OpenAI chat-completions message lists (with `tool_calls` and `tool` messages) to Libra trajectories.

Accepted files (JSON or JSON Lines): a message list; an object with `messages` (or `traj`, `conversation`,
`conversations`, a Gemini request's `contents`, a message list under `trajectory`; the list itself or JSON text of
it, as dataset rows store it); a list of such objects; an
object whose `simulations`, `results` or `data` is such a list (the result files of tau-bench-style harnesses).
Per record, `id` / `task_id` / `instance_id` / `prompt_id` names the prompt, `trial` / `sample` the sample, and
`reward` (or `reward_info.reward`) the reward; other scalar fields are kept under `meta`.

How a message list becomes the prompt, generations and returns is chat_messages.py's (its docstring). A `system`
field beside the messages (Gemini's `systemInstruction`; when no message is a system message) is part of the
prompt.

A JSON Lines file of one event per line (a session log: Claude Code transcripts, Codex CLI rollouts) is one
conversation per session, its messages in file order (dialects.py, `message_of`). Other dialects are read too
(dialects.py): ShareGPT `from` / `value` conversations, Anthropic content blocks
(`tool_use`, `tool_result`, `thinking`), Gemini `parts` (`functionCall`, `functionResponse`, code execution) and
OpenAI Responses items (`function_call`, `function_call_output`, `reasoning`); so are the logs of OpenHands
(a `history` of events; an evaluation output's `instruction` is its prompt when the history states none),
LangChain and smolagents (`steps`) (frameworks.py), and Inspect AI evaluation logs, JSON or `.eval` archives (one
trajectory per sample, inspect_logs.py). A file whose first record is a SWE-agent `.traj` (steps of `action` and
`observation`, an `info` object) or a mini-swe-agent `.traj.json` (its `trajectory_format`, or a task's row whose
user replies are mostly `<returncode>N</returncode>`) is read as
`--format swe-agent` / `mini-swe-agent` read it (swe_agents.py), so the default format gives their trajectories.
A Gemini CLI session file (a JSON conversation record with `sessionId`, `projectHash` and `messages` of typed
message records, or the JSON Lines file of its later releases, whose first line is that metadata alone) is one
trajectory, rewritten by gemini_cli.py; Qwen Code's sessions are session logs as above. A Moatless Tools
`trajectory.json` (`nodes` whose `completions.build_action` record each model call) is one trajectory, rewritten
by moatless.py.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from libra.workloads.importers import gemini_cli, inline_tools, inspect_logs, moatless, swe_agents
from libra.workloads.importers.chat_messages import (
    MESSAGE_KEYS,
    SAMPLE_KEYS,
    convert_messages,
    decoded_messages,
    meta_of,
    reward_of,
)
from libra.workloads.importers.common import (
    Places,
    StatusRules,
    bad_records_noted,
    build_trajectory,
    forget_bad_records,
    iter_records,
    one_record,
    text_of,
    whole_lines,
)
from libra.workloads.importers.dialects import expand, is_message, message_of
from libra.workloads.trace import TraceError, Trajectory

# a system prompt stated beside the messages: Anthropic's and ShareGPT's `system`, Gemini's `systemInstruction`
_SYSTEM_KEYS = ("system", "systemInstruction", "system_instruction")
_CONTAINER_KEYS = ("simulations", "results", "data", "trajectories")
_ID_KEYS = ("prompt_id", "task_id", "instance_id", "id", "uid")
_MINI_REPLY = re.compile(r"\s*<returncode>\s*-?\d+\s*</returncode>")  # how mini-swe-agent answers a command


def _own_format(value: Any) -> str | None:
    """`swe-agent` or `mini-swe-agent` when a file's first record is a trajectory of that agent (a `.traj`: steps of
    `action` and `observation` with an `info` object; a `.traj.json`: its `trajectory_format`; a dataset row of a
    task's run whose replies are mini-swe-agent's, `_mini_replies`), else None."""
    if not isinstance(value, dict):
        return None
    fmt = value.get("trajectory_format")
    if isinstance(fmt, str) and fmt.startswith("mini-swe-agent"):
        return "mini-swe-agent"
    messages = decoded_messages(value).get("messages")
    if isinstance(value.get("instance_id"), str) and isinstance(messages, list) and _mini_replies(messages):
        return "mini-swe-agent"
    steps = value.get("trajectory")
    if (
        isinstance(steps, list)
        and steps
        and isinstance(value.get("info"), dict)
        and all(isinstance(x, dict) and "action" in x and "observation" in x for x in steps)
    ):
        return "swe-agent"
    return None


def _mini_replies(messages: list) -> bool:
    """Whether the user messages after the first assistant message are mostly mini-swe-agent's replies to a command
    (`<returncode>N</returncode>` first; the others its format-error and timeout notes): at least one, and half."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    first = roles.index("assistant") if "assistant" in roles else len(messages)
    replies = [
        _MINI_REPLY.match(text_of(m.get("content"))) is not None
        for m, role in zip(messages[first:], roles[first:], strict=True)
        if role == "user"
    ]
    return sum(replies) >= max(1, (len(replies) + 1) // 2)


def _records(value: Any, path: Path, line: int, at: str = "") -> Iterator[tuple[str, dict | list]]:
    """`(where, record)` for each trajectory record in one JSON value (`at`: where the value is in its line); an
    item of a list that is no record is left out alone where bad records are (`one_record`)."""
    if isinstance(value, list):
        if value and all(is_message(m) for m in value):
            yield "", value
            return
        for i, item in enumerate(value):
            with one_record():
                yield from ((f"[{i}]{w}", r) for w, r in _records(item, path, line, f"{at}[{i}]"))
        return
    if isinstance(value, dict):
        if gemini_cli.is_conversation(value):  # a Gemini CLI session file (JSON)
            yield "", gemini_cli.record(value)
            return
        if moatless.is_trajectory(value):  # a Moatless Tools trajectory.json
            yield "", _moatless_record(value, path, line)
            return
        value = decoded_messages(value)
        if _message_key(value) is not None:
            yield "", value
            return
        if inspect_logs.is_log(value):  # an Inspect JSON log: one record per sample
            yield from inspect_logs.records(value, path)
            return
        for key in _CONTAINER_KEYS:
            if isinstance(value.get(key), list):
                shared = _shared_prompt(value)
                for w, r in _records(value[key], path, line, f"{at}{key}"):
                    yield f"{key}{w}", (r if not shared else {"__shared_prompt__": shared, **_as_record(r)})
                return
        texts = inline_tools.text_records(value, _ID_KEYS)  # a rollout dump: a prompt and its response(s) as text
        if texts is not None:
            yield from ((f"responses[{i}]" if len(texts) > 1 else "", r) for i, r in enumerate(texts))
            return
    raise TraceError(path, line, at or None, "expected a message list or an object with 'messages'")


def _moatless_record(value: dict, path: Path, line: int) -> dict:
    """A Moatless trajectory's conversation (moatless.py), or a TraceError naming the file and what is wrong."""
    try:
        return moatless.record(value)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise TraceError(path, line, None, f"Moatless trajectory: {what}") from None


def _shared_prompt(container: dict) -> str:
    """Prompt text that a results file states once for all its records: tau2-bench's domain policy
    (`info.environment_info.policy`), which its agent's system prompt carries but its messages do not."""
    info = container.get("info")
    env = info.get("environment_info") if isinstance(info, dict) else None
    policy = env.get("policy") if isinstance(env, dict) else None
    return policy if isinstance(policy, str) else ""


def _as_record(record: dict | list) -> dict:
    return {"messages": record} if isinstance(record, list) else record


def _message_key(record: dict) -> str | None:
    """The key of a record's message list (the first of `MESSAGE_KEYS` holding a list), else None."""
    for key in MESSAGE_KEYS:
        value = record.get(key)
        if isinstance(value, list) and (key != "trajectory" or (value and all(is_message(m) for m in value))):
            return key
    return None


def _messages(record: dict | list) -> tuple[list, dict]:
    if isinstance(record, list):
        return record, {}
    key = _message_key(record)
    if key == "history":  # older OpenHands outputs: [action, observation] pairs
        return [e for item in record[key] for e in (item if isinstance(item, list) else [item])], record
    return (record[key] if key is not None else []), record


def _from_history(record: dict | list) -> bool:
    """Whether a record's messages are an OpenHands `history`."""
    return isinstance(record, dict) and _message_key(record) == "history"


def _user_before_first_generation(messages: list) -> bool:
    """Whether a user message comes before the first assistant message (OpenHands outputs repeat their
    `instruction` as one; older ones do not)."""
    for raw in messages:
        for msg in expand(raw):
            role = msg.get("role") if isinstance(msg, dict) else None
            if role == "assistant":
                return False
            if role == "user":
                return True
    return False


def import_openai(
    path: Path, *, count: Callable[[str], int], rules: StatusRules, user_tool: str = "user"
) -> Iterator[Trajectory]:
    """Trajectories of one file of OpenAI chat message lists, or of a session log (module docstring)."""
    if inspect_logs.is_archive(path):  # an Inspect `.eval` log (a zip archive)
        for member, rec in inspect_logs.archive_records(path):
            with one_record():  # a bad sample is left out alone where bad records are
                yield _trajectory(
                    rec, path=path, line=None, where=f"{member}:", n=0, count=count, rules=rules, user_tool=user_tool
                )
        return
    mark = bad_records_noted()  # a session log's lines are one trajectory: a bad one leaves the file out
    places = Places()  # (made before the file is read)
    stream = iter_records(path)
    head = list(itertools.islice(stream, 2))  # the first two records tell a session log (read lazily after them)
    own = _own_format(head[0][1]) if head else None
    if own is not None:  # a SWE-agent or mini-swe-agent file: read as its own format reads it
        reader = swe_agents.import_swe_agent if own == "swe-agent" else swe_agents.import_mini_swe_agent
        forget_bad_records(mark)  # the reader reads the file again from its start
        yield from reader(path, count=count, rules=rules)
        return
    records: Iterator[tuple[int, Any]] = itertools.chain(head, stream)
    if len(head) == 2 and (gemini_cli.is_session_head(head[0][1]) or _is_event(head[0][1])):
        records = whole_lines(records, path, mark)
    if len(head) == 2 and gemini_cli.is_session_head(head[0][1]):  # a Gemini CLI session file (JSON Lines)
        conversation = gemini_cli.replay(value for _, value in records)
        yield _trajectory(
            gemini_cli.record(conversation),
            path=path,
            line=1,
            where="",
            n=0,
            count=count,
            rules=rules,
            user_tool=user_tool,
        )
        return
    if len(head) == 2 and _is_event(head[0][1]):
        yield from _sessions(records, path, count=count, rules=rules, user_tool=user_tool)
        return
    for line, value in records:
        with one_record():  # a record that is not a trajectory is left out alone where bad records are
            for where, record in _records(value, path, line):
                with one_record():
                    n = places.of(line)
                    yield _trajectory(
                        record, path=path, line=line, where=where, n=n, count=count, rules=rules, user_tool=user_tool
                    )
                    places.kept()


def _trajectory(
    record: dict | list,
    *,
    path: Path,
    line: int | None,
    where: str,
    n: int,
    count: Callable[[str], int],
    rules: StatusRules,
    user_tool: str,
) -> Trajectory:
    """The trajectory of one record (module docstring); `n` numbers the records without an id."""
    messages, rec = _messages(record)
    if not messages:
        raise TraceError(path, line, f"{where}messages" if where else "messages", "is empty")
    prompt, segments = convert_messages(
        messages, count=count, rules=rules, path=path, line=line, where=where, user_tool=user_tool
    )
    shared = rec.get("__shared_prompt__") if isinstance(rec, dict) else None
    if shared:
        prompt += count(shared)
    key = next((k for k in _SYSTEM_KEYS if isinstance(rec, dict) and rec.get(k) is not None), None)
    system = rec[key] if key is not None else None
    if isinstance(system, dict) and isinstance(system.get("parts"), list):
        system = system["parts"]  # Gemini: a content of text parts
    if isinstance(system, str | list) and not any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        prompt += count(text_of(system))  # a system prompt stated beside the messages (Anthropic's, ShareGPT's)
    openhands = _from_history(rec)
    instruction = rec.get("instruction") if openhands else None
    if isinstance(instruction, str) and not _user_before_first_generation(messages):
        prompt += count(instruction)  # an OpenHands output whose history does not state its task
    key = next((k for k in _ID_KEYS if isinstance(rec.get(k), str | int) and rec.get(k) != ""), None)
    pid = rec[key] if key else None
    sample = next((rec[k] for k in SAMPLE_KEYS if isinstance(rec.get(k), int)), None)
    step = rec.get(inline_tools.STEP) if isinstance(rec, dict) else None  # a text rollout's RL step
    used = (*_SYSTEM_KEYS, inline_tools.STEP, *(("instruction",) if openhands else ()))
    meta = meta_of(rec, (key, *used) if key else used)
    return build_trajectory(
        prompt_id=str(pid) if pid is not None else f"{path.stem}-{n}",
        prompt_tokens=prompt,
        segments=segments,
        path=path,
        line=line,
        reward=reward_of(rec),
        sample=sample if isinstance(sample, int) and sample >= 0 else None,
        step=step,
        extra={"meta": meta} if meta else None,
    )


def _is_event(value: Any) -> bool:
    """Whether a record is a line of a session log (an event), not a trajectory: an object holding no message list."""
    return (
        isinstance(value, dict)
        and _message_key(value) is None
        and not any(isinstance(value.get(k), list) for k in _CONTAINER_KEYS)
        and not inline_tools.is_text_record(value)
    )


def _sessions(
    records: Iterable[tuple[int, Any]], path: Path, *, count: Callable[[str], int], rules: StatusRules, user_tool: str
) -> Iterator[Trajectory]:
    """One trajectory per session of a session log (`sessionId` / `session_id`, else the whole file), its messages
    in file order; lines without a message are skipped."""
    sessions: dict[str, list[tuple[int, dict]]] = {}
    for line, event in records:
        if not _is_event(event):
            raise TraceError(path, line, None, "a session log's lines are objects without a message list")
        msg = message_of(event)
        if msg is None:
            continue
        key = next((str(event[k]) for k in ("sessionId", "session_id") if isinstance(event.get(k), str | int)), "")
        sessions.setdefault(key, []).append((line, msg))
    if not sessions:
        raise TraceError(path, 1, None, "expected a message list or an object with 'messages'")
    for key, lines in sessions.items():
        first = lines[0][0]
        prompt, segments = convert_messages(
            [m for _, m in lines], count=count, rules=rules, path=path, line=first, user_tool=user_tool
        )
        yield build_trajectory(
            prompt_id=key or path.stem, prompt_tokens=prompt, segments=segments, path=path, line=first
        )
