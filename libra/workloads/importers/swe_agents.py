"""SWE-agent (`.traj`) and mini-swe-agent (`.traj.json`) trajectory files to Libra trajectories.

SWE-agent: the file's `history` is the model's context in order. Messages before the first assistant message
(system prompt, demonstrations, the issue) are the prompt; each assistant message is a generation (content and
tool calls); the messages after it (the environment's observation, as `user` or `tool`) are its tool return (a
command cancelled for its time, 1.x's "was cancelled because it took more than N seconds", a timeout). The
tool is the first word of the step's `action` in `trajectory` (`edit`, `python`, `str_replace_editor`, ...). A file
without `history` is read from `trajectory` alone (`response` as the generation, `observation` as the return, the
prompt unknown: 0). A run whose `info.exit_status` starts with "submitted" ends on its `submit` step, whose
output (the patch) goes back to no model: that step is the final turn, with no tool.

mini-swe-agent: `messages` (or a bare message list) in the OpenAI layout; the environment answers as the user with
`<returncode>N</returncode>` (tool `bash`, status from the exit code). The message after the final submission
(`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, or `info.exit_status` "Submitted") is the patch, not context: dropped.

Both: the task (prompt id) is `instance_id`, else the file's name. A run that ended before any model generation
with an `info.exit_status` other than a submission (an environment that did not start, say) holds no trajectory:
it is skipped, with one warning per file on stderr (the `libra.workloads.importers` logger), so that one of them
does not stop the import of a directory of runs; a run without a generation and without such a status is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from libra.workloads.importers.chat_messages import (
    convert_messages,
    decoded_messages,
    exit_code_in,
    gen_text,
    meta_of,
    reward_of,
)
from libra.workloads.importers.common import (
    Return,
    Segment,
    StatusRules,
    build_trajectory,
    iter_records,
    one_record,
    text_of,
    warn_skipped,
)
from libra.workloads.trace import TraceError, Trajectory

_SUBMIT_MARK = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MINI_FORMAT_ERRORS = (r"EXACTLY ONE action", r"format error")
# SWE-agent 1.x's `command_cancelled_timeout_template` (0.x wrote "EXECUTION TIMED OUT", a default pattern)
SWE_AGENT_TIMEOUTS = (r"was cancelled because it took more than \S+ seconds",)


def _tool_of(action: Any) -> str:
    words = str(action or "").split()
    return words[0][:64] if words else "shell"


def _failed(info: dict) -> bool:
    """Whether the run says it ended without a submission (`exit_status` set: an error, a limit, a cost cap)."""
    status = info.get("exit_status")
    return isinstance(status, str) and bool(status) and not _submitted(info)


def _warn_skipped(path: Path, skipped: list[str]) -> None:
    """One warning per file for the runs that ended before any model generation (a sandbox that did not start,
    say): skipped, so that one of them does not stop the import of a directory of runs."""
    warn_skipped(path, skipped, "run(s) that ended before any model generation")


def _submitted(info: dict) -> bool:
    return str(info.get("exit_status", "")).lower().startswith("submitted")


def _swe_segments(
    record: dict, *, count: Callable[[str], int], rules: StatusRules, path: Path, line: int
) -> tuple[int, list[Segment]]:
    steps = record.get("trajectory")
    if not isinstance(steps, list):
        raise TraceError(path, line, "trajectory", "must be a list of steps")
    actions = [_tool_of(s.get("action")) if isinstance(s, dict) else "shell" for s in steps]
    history = record.get("history")
    prompt = 0
    segments: list[Segment] = []
    if isinstance(history, list) and any(isinstance(m, dict) and m.get("role") == "assistant" for m in history):
        gen: int | None = None
        returns: list[Return] = []
        k = -1
        for i, msg in enumerate(history):
            if not isinstance(msg, dict):
                raise TraceError(path, line, f"history[{i}]", f"must be an object, got {type(msg).__name__}")
            demo = msg.get("message_type") == "demonstration" or msg.get("is_demo")
            if msg.get("role") == "assistant" and not demo:
                if gen is not None:
                    segments.append(Segment(gen, tuple(returns)))
                gen, returns, k = count(gen_text(msg)[0]), [], k + 1
                continue
            text = text_of(msg.get("content"))
            if gen is None or demo:
                prompt += count(text)
                continue
            tool = actions[k] if 0 <= k < len(actions) else "shell"
            returns.append(Return(tool, count(text), rules.classify(text, exit_code=exit_code_in(text))))
        if gen is not None:
            segments.append(Segment(gen, tuple(returns)))
    else:
        for i, s in enumerate(steps):
            if not isinstance(s, dict):
                raise TraceError(path, line, f"trajectory[{i}]", f"must be an object, got {type(s).__name__}")
            generated = s.get("response") or f"{s.get('thought', '')}\n{s.get('action', '')}"
            obs = text_of(s.get("observation"))
            status = rules.classify(obs, exit_code=exit_code_in(obs))
            segments.append(Segment(count(str(generated)), (Return(actions[i], count(obs), status),)))
    info: dict = record["info"] if isinstance(record.get("info"), dict) else {}
    if segments and _submitted(info) and actions and actions[-1] == "submit":
        segments[-1] = Segment(segments[-1].gen_tokens, ())
    return prompt, segments


def _flat_info(record: dict) -> dict[str, Any]:
    """A run's `info` where an exported row holds its fields beside the messages instead of under `info`."""
    return {k: record[k] for k in ("exit_status", "submission", "model_stats") if k in record}


def _counts_only(meta: dict[str, Any]) -> dict[str, Any]:
    """A run's `info` less what holds the task's content (a trace holds counts, not text): the submitted patch and
    SWE-agent's `edited_files30/50/70` (the edited files' lines around each edit)."""
    return {k: v for k, v in meta.items() if k != "submission" and not k.startswith("edited_files")}


def import_swe_agent(path: Path, *, count: Callable[[str], int], rules: StatusRules) -> Iterator[Trajectory]:
    """Trajectories of one SWE-agent `.traj` file (or a JSON Lines file of them); module docstring."""
    rules = StatusRules(rules.error_patterns, rules.timeout_patterns + SWE_AGENT_TIMEOUTS)
    skipped: list[str] = []
    for line, record in iter_records(path):
        with one_record():  # a bad line is left out alone where bad records are
            if not isinstance(record, dict) or "trajectory" not in record:
                raise TraceError(path, line, "trajectory", "missing: not a SWE-agent trajectory")
            prompt, segments = _swe_segments(record, count=count, rules=rules, path=path, line=line)
            info: dict = record["info"] if isinstance(record.get("info"), dict) else {}
            if not segments and _failed(info):
                skipped.append(f"line {line} ({info['exit_status']})")
                continue
            # the task: `instance_id`, else the file's name (a `.traj` file is one task's run, named after it); not
            # `environment`, the environment's name ("main", "swe_main"), which every task of a run shares
            pid = record.get("instance_id") or (path.stem if line == 1 else f"{path.stem}-{line}")
            meta = _counts_only(meta_of(info))
            yield build_trajectory(
                prompt_id=str(pid).removesuffix(".traj"),
                prompt_tokens=prompt,
                segments=segments,
                path=path,
                line=line,
                reward=reward_of(record),
                extra={"meta": meta} if meta else None,
            )
    _warn_skipped(path, skipped)


def import_mini_swe_agent(path: Path, *, count: Callable[[str], int], rules: StatusRules) -> Iterator[Trajectory]:
    """Trajectories of one mini-swe-agent `.traj.json` file (or a JSON Lines file of them); module docstring."""
    rules = StatusRules(rules.error_patterns + MINI_FORMAT_ERRORS, rules.timeout_patterns)
    skipped: list[str] = []
    for line, raw in iter_records(path):
        with one_record():  # a bad line is left out alone where bad records are
            info: dict
            record = decoded_messages(raw) if isinstance(raw, dict) else raw
            if isinstance(record, list):
                messages, info, rec = record, {}, {}
            elif isinstance(record, dict) and isinstance(record.get("messages"), list):
                messages, rec = record["messages"], record
                # a dataset's row keeps the run's `info` fields as columns of its own (`exit_status`, `submission`)
                info = record["info"] if isinstance(record.get("info"), dict) else _flat_info(record)
            else:
                raise TraceError(path, line, "messages", "missing: not a mini-swe-agent trajectory")
            if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages) and _failed(info):
                skipped.append(f"line {line} ({info['exit_status']})")
                continue
            if not messages:
                raise TraceError(path, line, "messages", "is empty")
            last = max(
                (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"), default=-1
            )
            if last >= 0 and (
                _submitted(info)
                or _SUBMIT_MARK in text_of(messages[last].get("content"))
                or messages[-1].get("role") == "exit"
            ):
                messages = messages[: last + 1]
            exit_as_user = [
                m if not (isinstance(m, dict) and m.get("role") == "exit") else {**m, "role": "user"} for m in messages
            ]
            prompt, segments = convert_messages(
                exit_as_user,
                count=count,
                rules=rules,
                path=path,
                line=line,
                user_tool="bash",
                user_exit_codes=True,
            )
            pid = rec.get("instance_id") or path.name.removesuffix(".json").removesuffix(".traj")
            meta = _counts_only(meta_of(info))
            if isinstance(rec.get("trajectory_format"), str):
                meta["trajectory_format"] = rec["trajectory_format"]
            yield build_trajectory(
                prompt_id=str(pid),
                prompt_tokens=prompt,
                segments=segments,
                path=path,
                line=line,
                extra={"meta": meta} if meta else None,
            )
    _warn_skipped(path, skipped)
