"""The run's records: `run.jsonl` (one record per completed step), `trace.jsonl` (every trained trajectory in
Libra's trace schema: `libra plan --trace` and `libra simulate --trace` read it) and `timeline.png`.

Each file is rewritten whole (`write_whole`: a temporary file, flushed to disk and renamed over it) after every
step, so whatever stops the run (Ctrl-C, SIGKILL, a power loss), the files on disk hold exactly the completed
steps."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from libra.runtime.config import RunConfigError
from libra.spec.files import write_whole
from libra.spec.jsonable import jsonable
from libra.workloads.trace import Trajectory

RUN_FILE, TRACE_FILE, TIMELINE_FILE = "run.jsonl", "trace.jsonl", "timeline.png"
# wall time of the orchestrator's thread spent outside Libra: the rest is orchestration overhead
OUTSIDE = ("engine", "tools", "train_wait", "weights", "switching")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_whole(path, "".join(json.dumps(jsonable(r), sort_keys=True) + "\n" for r in rows).encode())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a run being resumed: each line one JSON object with an integer `step` (one-line error)."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise RunConfigError(f"cannot resume: {path} line {n} is not JSON ({exc}); nothing was changed") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise RunConfigError(f"cannot resume: {path} line {n} is not a record with a step; nothing was changed")
        rows.append(row)
    return rows


def staleness_histogram(trained_version: int, trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """How many trajectories were trained `s` versions after their oldest turn's weights (key: s)."""
    counts = Counter(
        trained_version - min(t.extra.get("weight_version", trained_version) for t in tr.turns)
        for tr in trajectories
        if tr.turns
    )
    return {str(k): v for k, v in sorted(counts.items())}


class RunRecords:
    """In-memory copy of the records of completed steps, flushed atomically after each step."""

    def __init__(self, out_dir: Path, *, resume: bool = False, keep_steps: int | None = None) -> None:
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.steps: list[dict[str, Any]] = []
        self.trace: list[dict[str, Any]] = []
        if resume:
            self.steps = [r for r in _read_records(self.dir / RUN_FILE) if keep_steps is None or r["step"] < keep_steps]
            self.trace = [
                t for t in _read_records(self.dir / TRACE_FILE) if keep_steps is None or t["step"] < keep_steps
            ]
            kept = [r["step"] for r in self.steps]
            if keep_steps is not None and kept != list(range(keep_steps)):
                raise RunConfigError(
                    f"cannot resume {str(self.dir)!r}: its checkpoint is after step {keep_steps - 1} but {RUN_FILE} "
                    f"holds steps {kept}; nothing was changed"
                )

    def add_step(self, record: dict[str, Any], trajectories: Sequence[Trajectory]) -> None:
        self.steps.append(record)
        self.trace.extend(t.to_json() for t in trajectories)
        write_jsonl(self.dir / TRACE_FILE, self.trace)
        write_jsonl(self.dir / RUN_FILE, self.steps)


def step_record(
    config: Any,
    result: Any,
    info: dict[str, Any],
    records: dict[str, Any],
    trajectories: Sequence[Trajectory],
    duplicated: int,
    push: dict[str, Any],
    *,
    main: dict[str, float],
    wall: float,
) -> dict[str, Any]:
    """The `run.jsonl` record of one completed step: `result` is the trainer's (`TrainResult`), `info` what the
    rollout collected, `records` its trajectory records by request id, `main` the orchestrator thread's time per
    category since the last record and `wall` the wall time since then."""
    accounted = sum(v for c, v in main.items() if c in OUTSIDE)
    return {
        "step": result.step,
        "policy_version": result.version - 1,
        "weight_version": result.version,
        "loss": result.loss,
        "max_staleness": config.max_staleness,
        "staleness": staleness_histogram(result.version - 1, trajectories),
        "plan": info["plan"],
        "decisions": info["decisions"],
        "trajectories": {
            "expected": info["expected"],
            "finished": len(records),
            "lost": info["expected"] - len(records),
            "duplicated": duplicated,
            "retried": info["retried"],
            "requeued": info["requeued"],
            # ended when their context filled the engine's max_model_len (each says so in trace.jsonl)
            "truncated": sum(1 for t in trajectories if "truncated" in t.extra),
        },
        "rollout_window_s": info["rollout_window_s"],
        "train_window_s": [round(result.start, 4), round(result.end, 4)],
        "phases_s": {
            "rollout": info["rollout_window_s"][1] - info["rollout_window_s"][0],
            "train": result.end - result.start,
            **{k: round(v, 4) for k, v in main.items()},
        },
        "workers": {
            **info["workers"],
            "train-0": {"train_s": round(result.end - result.start, 4)},
            **{h: {"train_s": round(result.end - result.start, 4), "hybrid": True} for h in info.get("hybrids", ())},
        },
        "orchestration": {
            "wall_s": round(wall, 4),
            "overhead_s": round(max(0.0, wall - accounted), 4),
            **{f"{c}_s": round(main.get(c, 0.0), 4) for c in ("planning", "routing", "records", "checkpoint")},
        },
        "weights": push,
        "mean_reward": sum(r.reward for r in records.values()) / max(1, len(records)),
    }
