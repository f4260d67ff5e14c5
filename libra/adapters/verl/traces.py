"""verl rollouts as Libra traces (docs/trace-schema.md, one trajectory per JSON line). Pure Python: no verl import.

`LibraToolAgentLoop` puts one trace record per trajectory into `extra_fields["libra_trace"]`; verl copies extra
fields into the batch's `non_tensor_batch` (one object array per key), and its v1 trainers keep each row's
`extra_fields` in TransferQueue, so after a step `export_batch(batch, step=k)` returns the step's records and
`write_batches(path, batches)` writes plain Libra trace JSONL that `libra plan --trace` and `libra route-eval
--trace` read (and that `libra trace import --format verl` turns into the same records).
"""

from __future__ import annotations

import json
import math
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


_BATCH = Path("<verl batch>")


def _column(non_tensor: Any, key: str, rows: int | None = None) -> list[Any] | None:
    """Column `key` as a list of Python values: a numpy array (DataProto), a list, or a tensordict `NonTensorStack`
    (verl's v1 trainers, rows read back from TransferQueue), whose `tolist()` gives the values themselves."""
    values = non_tensor.get(key)
    if values is None:
        return None
    try:
        out = values.tolist() if hasattr(values, "tolist") else list(values)
    except TypeError:
        out = None
    if not isinstance(out, list):
        raise TraceError(_BATCH, None, key, f"must be a column (one value per trajectory), got {values!r}")
    if rows is not None and len(out) != rows:
        raise TraceError(_BATCH, None, key, f"has {len(out)} rows, {TRACE_KEY} has {rows}")
    return out


def _number(value: Any, key: str, row: int | None, kind: type) -> Any:
    """`value` (a numpy or Python scalar of column `key`) as `kind`; a value that is not one raises TraceError."""
    try:
        number = float(value)
        if not math.isfinite(number) or (kind is int and not number.is_integer()):
            raise ValueError
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a finite number"
        raise TraceError(_BATCH, None if row is None else row + 1, key, f"must be {what}, got {value!r}") from None
    return kind(number)


def _records(columns: Any) -> tuple[list[Any], list[Any] | None]:
    """The trace records and the reward extras of each row: a `libra_trace` column (verl copies extra fields into
    `non_tensor_batch`), else each row's `extra_fields` dict (the rows verl's v1 trainers keep in TransferQueue)."""
    records = _column(columns, TRACE_KEY)
    if records is not None:
        return records, None
    extra = _column(columns, "extra_fields")
    if extra is None:
        raise TraceError(_BATCH, None, TRACE_KEY, "missing: run rollouts with LibraToolAgentLoop")
    for i, fields in enumerate(extra):
        if fields is not None and not isinstance(fields, Mapping):
            raise TraceError(_BATCH, i + 1, "extra_fields", f"must be a dict, got {type(fields).__name__}")
    records = [fields.get(TRACE_KEY) if fields else None for fields in extra]
    if extra and all(r is None for r in records):
        raise TraceError(_BATCH, None, f"extra_fields.{TRACE_KEY}", "missing: run rollouts with LibraToolAgentLoop")
    return records, [(fields or {}).get("reward_extra_info") or {} for fields in extra]


def export_batch(batch: Any, *, step: int | None = None, sample_key: str | None = None) -> list[dict[str, Any]]:
    """The Libra trace records of a verl batch: one per trajectory that `LibraToolAgentLoop` produced, with `step`,
    the prompt id (`uid` when verl grouped samples by prompt), the sample index (column `sample_key`; by default
    `rollout_n`, else the v1 trainers' `session_id`) and the reward (`score` / `acc` in reward extras) where the
    batch has them. `batch` is a `DataProto` or its `non_tensor_batch`, or, in verl's v1 trainers
    (`separate_async`, `libra_separate_async`), the rows read back from TransferQueue
    (`tq.kv_batch_get(..., select_fields=["uid", "session_id", "extra_fields"])`). Records are validated against
    the trace schema; a batch without Libra's records, a column of another length than they, or a value that is
    not a number where one is needed raises TraceError (one line, naming the column)."""
    columns = getattr(batch, "non_tensor_batch", batch)
    records, reward_extras = _records(columns)
    rows = len(records)
    uids = _column(columns, "uid", rows)
    if sample_key is None:
        sample_key = "rollout_n" if columns.get("rollout_n") is not None else "session_id"
    samples = _column(columns, sample_key, rows)
    score_key = "score" if columns.get("score") is not None else "acc"
    scores = _column(columns, score_key, rows)
    if scores is None and reward_extras is not None:
        score_key = "score" if any("score" in r for r in reward_extras) else "acc"
        scores = [r.get(score_key) for r in reward_extras]
    if step is not None:
        step = _number(step, "step", None, int)
    out = []
    for i, record in enumerate(records):
        if record is None:
            continue
        if not isinstance(record, Mapping):
            raise TraceError(_BATCH, i + 1, TRACE_KEY, f"must be a trace record (a dict), got {type(record).__name__}")
        rec = dict(record)
        if uids is not None and uids[i] is not None:
            rec["prompt_id"] = str(uids[i])
        if step is not None:
            rec["step"] = step
        if samples is not None and samples[i] is not None:
            rec["sample"] = _number(samples[i], sample_key, i, int)
        if scores is not None and scores[i] is not None and "reward" not in rec:
            rec["reward"] = _number(scores[i], score_key, i, float)
        parse_line(json.dumps(rec), _BATCH, i + 1)  # schema check: names the field that is wrong
        out.append(rec)
    return out


def write_trace(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as trace JSONL atomically; returns the number written. Each record is checked against the
    trace schema first: one that is not valid (a NaN reward, a missing field) raises TraceError naming it, and the
    file is then left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_open(path) as f:
        for rec in records:
            try:
                line = json.dumps(rec)
            except (TypeError, ValueError) as exc:
                raise TraceError(path, n + 1, None, f"not JSON: {exc}") from None
            parse_line(line, path, n + 1)
            f.write(line + "\n")
            n += 1
    return n


def write_batches(path: str | Path, batches: Iterable[tuple[int, Any]]) -> int:
    """Write the trace of several steps, `(step, batch)` pairs in order, as one JSONL file."""
    return write_trace(path, (rec for step, batch in batches for rec in export_batch(batch, step=step)))
