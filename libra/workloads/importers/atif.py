"""ATIF (the Agent Trajectory Interchange Format of the Harbor framework, `"schema_version": "ATIF-v1.x"`) to Libra
trajectories.

An ATIF trajectory is an object with `steps`, each with a `source` (`system`, `user` or `agent`) and a `message`.
Steps before the first agent step are the prompt. Each agent step is one generation: its `message`, its
`reasoning_content` and its `tool_calls` (`function_name`, `arguments`), or, when the step states it,
`metrics.completion_tokens`: the model's own count, which also covers reasoning a log leaves out. Its
`observation.results` are its tool returns (the tool named by the call each answers, `source_call_id`); later
user and system steps are returns too (tool `user`, `system`). Statuses come from the texts (`StatusRules`).

A file holds one trajectory (JSON), one per line (JSON Lines), or a list of them. The prompt is named by a
`task_id` / `task_name` (at the top or in `extra`), else the `trajectory_id` or `session_id`; a numeric `reward`
(top level or `extra`) is kept; other scalar top-level fields are kept under `meta`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from libra.spec import checks
from libra.workloads.importers.common import (
    Places,
    Return,
    Segment,
    StatusRules,
    build_trajectory,
    iter_records,
    one_record,
    text_of,
)
from libra.workloads.trace import TraceError, Trajectory

_ID_KEYS = ("task_id", "task_name", "trajectory_id", "session_id")
_SKIP = {"steps", "extra", "agent", "final_metrics", "notes"}


def _trajectories(value: Any, path: Path, line: int) -> Iterator[tuple[str, dict]]:
    if isinstance(value, dict) and isinstance(value.get("steps"), list):
        yield "", value
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from ((f"[{i}]{w}", t) for w, t in _trajectories(item, path, line))
    else:
        raise TraceError(path, line, None, "expected an ATIF trajectory (an object with 'steps') or a list of them")


def _count_of(metrics: Any) -> int | None:
    value: Any = metrics.get("completion_tokens") if isinstance(metrics, dict) else None
    return value if checks.is_whole(value) and value >= 0 else None


def _generation(step: dict, count: Callable[[str], int]) -> tuple[int, dict[str, str]]:
    """The step's generated tokens and its calls `{call id: tool}`."""
    parts = [text_of(step.get("message")), text_of(step.get("reasoning_content"))]
    calls: dict[str, str] = {}
    for call in step.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        name = call.get("function_name")
        name = name if isinstance(name, str) and name else "tool"
        args = call.get("arguments", "")
        parts += [name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)]
        calls[str(call.get("tool_call_id", len(calls)))] = name
    stated = _count_of(step.get("metrics"))
    return (stated if stated is not None else count("\n".join(p for p in parts if p))), calls


def _segments(
    traj: dict, where: str, *, count: Callable[[str], int], rules: StatusRules, path: Path, line: int
) -> tuple[int, list[Segment]]:
    prompt = 0
    segments: list[Segment] = []
    gen: int | None = None
    returns: list[Return] = []
    for i, step in enumerate(traj["steps"]):
        if not isinstance(step, dict):
            raise TraceError(path, line, f"{where}steps[{i}]", f"must be an object, got {type(step).__name__}")
        source = step.get("source")
        if source not in ("system", "user", "agent"):
            raise TraceError(path, line, f"{where}steps[{i}].source", f"must be system, user or agent, got {source!r}")
        if source != "agent":
            text = text_of(step.get("message"))
            if gen is None:
                prompt += count(text)
            else:
                returns.append(Return(source, count(text), "ok"))
            continue
        if gen is not None:
            segments.append(Segment(gen, tuple(returns)))
        gen, calls = _generation(step, count)
        returns = []
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, dict) else None
        names = list(calls.values())
        for k, result in enumerate(results or ()):
            if not isinstance(result, dict):
                continue
            text = text_of(result.get("content"))
            tool = calls.get(str(result.get("source_call_id")), names[k] if k < len(names) else "tool")
            returns.append(Return(tool, count(text), rules.classify(text)))
    if gen is not None:
        segments.append(Segment(gen, tuple(returns)))
    return prompt, segments


def _field(traj: dict, key: str) -> Any:
    extra = traj.get("extra")
    value = traj.get(key)
    return value if value is not None else extra.get(key) if isinstance(extra, dict) else None


def import_atif(path: Path, *, count: Callable[[str], int], rules: StatusRules) -> Iterator[Trajectory]:
    """Trajectories of one file of ATIF trajectories (module docstring)."""
    places = Places()
    for line, value in iter_records(path):
        with one_record():  # a line that holds no trajectory is left out alone where bad records are
            for where, traj in _trajectories(value, path, line):
                with one_record():
                    yield _trajectory(traj, where, path, line, places.of(line), count=count, rules=rules)
                    places.kept()


def _trajectory(
    traj: dict, where: str, path: Path, line: int, n: int, *, count: Callable[[str], int], rules: StatusRules
) -> Trajectory:
    """One ATIF trajectory (module docstring); `n` numbers the trajectories without an id."""
    prompt, segments = _segments(traj, where, count=count, rules=rules, path=path, line=line)
    pid = next((v for v in (_field(traj, k) for k in _ID_KEYS) if isinstance(v, str | int)), None)
    reward = _field(traj, "reward")
    meta = {
        k: v
        for k, v in traj.items()
        if k not in _SKIP and k != "reward" and (v is None or isinstance(v, str | int | float | bool))
    }
    agent = traj.get("agent")
    if isinstance(agent, dict):
        meta.update({f"agent_{k}": v for k, v in agent.items() if isinstance(v, str | int | float)})
    return build_trajectory(
        prompt_id=str(pid) if pid is not None and pid != "" else f"{path.stem}-{n}",
        prompt_tokens=prompt,
        segments=segments,
        path=path,
        line=line,
        reward=reward if checks.is_real(reward) else None,
        extra={"meta": meta} if meta else None,
    )
