"""verl rollouts as Libra traces (docs/trace-schema.md, one trajectory per JSON line). Pure Python: no verl import.

`LibraToolAgentLoop` puts one trace record per trajectory into `extra_fields["libra_trace"]`; verl copies extra
fields into the batch's `non_tensor_batch` (one object array per key), so after a step
`export_batch(batch, step=k)` returns the step's records and `write_batches(path, batches)` writes plain Libra
trace JSONL that `libra plan --trace` and `libra route-eval --trace` read (and that `libra trace import
--format verl` turns into the same records).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from libra.spec.files import atomic_open
from libra.workloads.trace import TOOL_STATUSES, TraceError, parse_line

TRACE_KEY = "libra_trace"
# the worst status of a turn's parallel tool calls is the turn's status
STATUS_RANK = {status: rank for rank, status in enumerate(TOOL_STATUSES)}


def trace_record(
    *,
    prompt_id: str,
    prompt_tokens: int,
    turns: list[dict[str, Any]],
    step: int | None = None,
    sample: int | None = None,
    reward: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One trajectory in the trace schema (unknown keys are kept by Libra's loader)."""
    record: dict[str, Any] = {"prompt_id": str(prompt_id), "prompt_tokens": int(prompt_tokens)}
    if step is not None:
        record["step"] = int(step)
    if sample is not None:
        record["sample"] = int(sample)
    record["turns"] = [
        {
            "gen_tokens": int(t["gen_tokens"]),
            "tool": t.get("tool"),
            "tool_status": t.get("tool_status"),
            "tool_tokens": int(t.get("tool_tokens", 0)),
        }
        for t in turns
    ]
    if reward is not None:
        record["reward"] = float(reward)
    record.update(extra or {})
    return record


def _column(non_tensor: Mapping[str, Any], key: str) -> list[Any] | None:
    values = non_tensor.get(key)
    return None if values is None else list(values)


def export_batch(batch: Any, *, step: int | None = None, sample_key: str = "rollout_n") -> list[dict[str, Any]]:
    """The Libra trace records of a verl batch (a `DataProto`, or its `non_tensor_batch` mapping): one per
    trajectory that `LibraToolAgentLoop` produced, with `step`, the prompt id (`uid` when verl grouped samples by
    prompt), the sample index and the reward (`score` / `acc` in reward extras) where the batch has them. Records
    are validated against the trace schema; a batch without `libra_trace` raises TraceError."""
    non_tensor = getattr(batch, "non_tensor_batch", batch)
    records = _column(non_tensor, TRACE_KEY)
    if records is None:
        raise TraceError("<verl batch>", None, TRACE_KEY, "missing: run rollouts with LibraToolAgentLoop")
    uids = _column(non_tensor, "uid")
    samples = _column(non_tensor, sample_key)
    scores = _column(non_tensor, "score") or _column(non_tensor, "acc")
    out = []
    for i, record in enumerate(records):
        if record is None:
            continue
        rec = dict(record)
        if uids is not None:
            rec["prompt_id"] = str(uids[i])
        if step is not None:
            rec["step"] = int(step)
        if samples is not None and samples[i] is not None:
            rec["sample"] = int(samples[i])
        if scores is not None and scores[i] is not None and "reward" not in rec:
            rec["reward"] = float(scores[i])
        parse_line(json.dumps(rec), Path("<verl batch>"), i + 1)  # schema check: names the field that is wrong
        out.append(rec)
    return out


def write_trace(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as trace JSONL atomically; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_open(path) as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
            n += 1
    return n


def write_batches(path: str | Path, batches: Iterable[tuple[int, Any]]) -> int:
    """Write the trace of several steps, `(step, batch)` pairs in order, as one JSONL file."""
    return write_trace(path, (rec for step, batch in batches for rec in export_batch(batch, step=step)))
