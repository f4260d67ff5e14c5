"""Build a WorkloadProfile from trajectories, over a sliding window of recent steps so that drift shows."""

from __future__ import annotations

import math
from collections.abc import Sequence

from libra.spec import SpecError, WorkloadProfile
from libra.workloads.trace import Trajectory, group_by_step


def profile_from_trajectories(
    trajectories: Sequence[Trajectory],
    *,
    name: str = "trace",
    window_steps: int | None = None,
    requests_per_step: int | None = None,
    mean_tool_time_s: float = 0.0,
) -> WorkloadProfile:
    """Profile of the last `window_steps` steps (all of them when None). Without step labels the file is one step
    (so is a list in which any trajectory lacks `step`). `requests_per_step` defaults to the mean number of
    trajectories per step in the window; `GlobalPlanner` does not read it (it scales to its `rl.global_batch`).

    Tool seconds come from each tool turn's `extra["tool_latency_s"]`: where any call of the window has none, the
    profile keeps no per-trajectory tool seconds and, with none recorded at all, `mean_tool_time_s` is 0, so the
    planner prices tool calls at 0 s, while `libra.sim` draws untimed calls from `ToolLatency` (median 2 s): record
    latencies, or pass `mean_tool_time_s`, to compare a plan with a simulation. Each trajectory is valid (`Turn` and
    `Trajectory` apply the trace schema when built); the arguments are checked here, one line naming the bad one."""
    _check_arguments(trajectories, name, requests_per_step, mean_tool_time_s)
    steps = steps_in_window(trajectories, window_steps)
    chosen = [t for step in steps for t in step]
    per_step = requests_per_step if requests_per_step is not None else max(1, round(len(chosen) / len(steps)))
    # traces may record each tool call's wall time as `tool_latency_s`: where every tool call of the window does,
    # each trajectory's seconds in tool calls are known (the tail the planner prices), and their mean per call
    recorded = [_recorded_tool_s(t) for t in chosen]
    tool_s = [s for s in recorded if s is not None]
    known = len(tool_s) == len(chosen)
    calls = sum(1 for t in chosen for u in t.turns if u.tool is not None)
    if not mean_tool_time_s:
        latencies = [
            float(u.extra["tool_latency_s"])
            for t in chosen
            for u in t.turns
            if u.tool is not None and isinstance(u.extra.get("tool_latency_s"), int | float)
        ]
        mean_tool_time_s = sum(latencies) / len(latencies) if latencies else 0.0
    shapes: list[tuple[float, ...]] = [
        (float(t.total_tokens), float(t.gen_tokens), float(len(t.turns))) for t in chosen
    ]
    if known and calls:
        shapes = [(*b, s) for b, s in zip(shapes, tool_s, strict=True)]
    return WorkloadProfile.build(
        name=name,
        shapes=shapes,
        requests_per_step=per_step,
        mean_tool_time_s=mean_tool_time_s,
    )


def _check_arguments(
    trajectories: Sequence[Trajectory], name: object, requests_per_step: object, mean_tool_time_s: object
) -> None:
    if isinstance(trajectories, str | bytes | dict) or not isinstance(trajectories, Sequence):
        raise SpecError(f"trajectories must be a list of Trajectory values, got {type(trajectories).__name__}")
    if not trajectories:
        raise SpecError("cannot build a workload profile from zero trajectories")
    odd = next((t for t in trajectories if not isinstance(t, Trajectory)), None)
    if odd is not None:
        raise SpecError(f"trajectories must be Trajectory values, got a {type(odd).__name__}")
    if not isinstance(name, str) or not name:
        raise SpecError(f"name must be a non-empty string, got {name!r}")
    if requests_per_step is not None and (
        isinstance(requests_per_step, bool) or not isinstance(requests_per_step, int) or requests_per_step < 1
    ):
        raise SpecError(f"requests_per_step must be an integer >= 1 or None, got {requests_per_step!r}")
    if (
        isinstance(mean_tool_time_s, bool)
        or not isinstance(mean_tool_time_s, int | float)
        or not 0 <= mean_tool_time_s < math.inf
    ):
        raise SpecError(f"mean_tool_time_s must be finite seconds >= 0, got {mean_tool_time_s!r}")


def _check_window(window_steps: object) -> None:
    if isinstance(window_steps, bool) or not isinstance(window_steps, int) or window_steps < 1:
        raise SpecError(f"window_steps must be an integer >= 1, got {window_steps!r}")


def steps_in_window(trajectories: Sequence[Trajectory], window_steps: int | None) -> list[list[Trajectory]]:
    """The trajectories grouped by step (`group_by_step`), the last `window_steps` of them (all when None)."""
    if window_steps is not None:
        _check_window(window_steps)
    steps = group_by_step(list(trajectories))
    return steps if window_steps is None else steps[-window_steps:]


def _recorded_tool_s(t: Trajectory) -> float | None:
    """Seconds `t` spent in tool calls, where each of its tool calls records `tool_latency_s`; else None. A call on
    the last turn (a run cut off there) returns to nothing and is not counted, as the simulator never runs it."""
    total = 0.0
    for u in t.turns[:-1]:
        if u.tool is None:
            continue
        x = u.extra.get("tool_latency_s")
        if not isinstance(x, int | float) or isinstance(x, bool) or not 0 <= x < float("inf"):
            return None
        total += float(x)
    return total


def profiles_over_steps(
    trajectories: Sequence[Trajectory], *, window_steps: int = 1, name: str = "trace"
) -> list[WorkloadProfile]:
    """One profile per step, each over the `window_steps` steps ending there: the drift of the workload (none for
    no trajectories)."""
    _check_window(window_steps)
    steps = group_by_step(list(trajectories))
    out = []
    for end in range(1, len(steps) + 1):
        window = [t for step in steps[max(0, end - window_steps) : end] for t in step]
        out.append(profile_from_trajectories(window, name=f"{name}@{end - 1}"))
    return out
