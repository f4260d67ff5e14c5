"""verl rollout exports to Libra trajectories (token counts are exact: verl already has token ids).

One record per trajectory (JSON Lines, or a JSON list), with the fields of verl's `AgentLoopOutput` / the
`DataProto` batch it becomes:
- `response_mask` (required): per response token, 1 if the policy generated it, 0 if it came back from a tool or
  the environment. Runs of 1 are generations, runs of 0 the returns after them.
- the prompt: `prompt_ids` or `prompts` (a token list; pad ids are not stripped) or `prompt_length` /
  `prompt_tokens` (a count).
- valid length (padded batches): `response_length`, or `attention_mask` over prompt + response (the response's
  part is summed); else the whole `response_mask` counts.
- optional: `uid` / `prompt_id` / `index` (prompt id), `sample`, `step` / `global_steps`, `reward_score` /
  `reward` / `score`, `tool_names` and `tool_statuses` (one per return, also read from `extra_fields`); a return
  without a name is tool "tool", without a status "ok". Other scalar fields are kept under `meta`.

Records already in the trace schema (with `turns`: what `libra.adapters.verl` exports from `LibraToolAgentLoop`),
or batch rows carrying such a record under `libra_trace` (with `uid`, `step`, `sample` beside it) or under
`extra_fields.libra_trace` (the rows of verl's v1 trainers, with `uid` and `session_id`), are taken as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libra.spec import checks
from libra.workloads.importers.common import (
    Places,
    Return,
    Segment,
    build_trajectory,
    iter_records,
    one_record,
)
from libra.workloads.trace import TOOL_STATUSES, TraceError, Trajectory, parse_line

_USED = {
    "response_mask",
    "prompt_ids",
    "prompts",
    "prompt_length",
    "prompt_tokens",
    "response_length",
    "attention_mask",
    "uid",
    "prompt_id",
    "index",
    "sample",
    "step",
    "global_steps",
    "reward_score",
    "reward",
    "score",
    "tool_names",
    "tool_statuses",
    "extra_fields",
    "response_ids",
    "responses",
    "input_ids",
    "position_ids",
}


def _ints(value: Any, path: Path, line: int, field: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int or checks.is_whole(v) for v in value):
        raise TraceError(path, line, field, "must be a list of integers")
    return value


def _count(value: Any, path: Path, line: int, field: str) -> int:
    if not (checks.is_whole(value) and value >= 0):
        raise TraceError(path, line, field, f"must be a non-negative integer, got {value!r}")
    return value


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """`(bit, length)` runs of a 0/1 mask."""
    out: list[tuple[int, int]] = []
    for bit in mask:
        if out and out[-1][0] == bit:
            out[-1] = (bit, out[-1][1] + 1)
        else:
            out.append((bit, 1))
    return out


def _one(rec: dict, path: Path, line: int, where: str, n: int) -> Trajectory:
    nested = rec.get("libra_trace")
    fields = rec.get("extra_fields")
    if not isinstance(nested, dict) and isinstance(fields, dict) and isinstance(fields.get("libra_trace"), dict):
        # a row of verl's v1 trainers (read back from TransferQueue): the record is inside its extra_fields, and
        # the sample index is the row's session_id
        nested = fields["libra_trace"]
        if "sample" not in rec and checks.is_whole(rec.get("session_id")):
            rec = {**rec, "sample": rec["session_id"]}
    if isinstance(nested, dict):  # a batch row with the record LibraToolAgentLoop left in extra_fields
        outer = {k: rec[k] for k in ("step", "sample", "reward") if k in rec and k not in nested}
        if "uid" in rec:
            outer["prompt_id"] = str(rec["uid"])
        rec = {**nested, **outer}
    if "turns" in rec and "response_mask" not in rec:  # already a Libra trace record (adapters/verl export)
        return parse_line(json.dumps(rec), path, line)
    extra_fields: dict = rec["extra_fields"] if isinstance(rec.get("extra_fields"), dict) else {}
    if "response_mask" not in rec:
        dump = isinstance(rec.get("input"), str) and isinstance(rec.get("output"), str)
        hint = " (a rollout_data_dir dump, text: import it with --format openai)" if dump else ""
        raise TraceError(path, line, f"{where}response_mask", f"missing: not a verl rollout record{hint}")
    mask = _ints(rec["response_mask"], path, line, f"{where}response_mask")
    if any(b not in (0, 1) for b in mask):
        raise TraceError(path, line, f"{where}response_mask", "must hold only 0 and 1")
    if "prompt_ids" in rec or "prompts" in rec:
        key = "prompt_ids" if "prompt_ids" in rec else "prompts"
        prompt = len(_ints(rec[key], path, line, f"{where}{key}"))
    elif "prompt_length" in rec or "prompt_tokens" in rec:
        key = "prompt_length" if "prompt_length" in rec else "prompt_tokens"
        prompt = _count(rec[key], path, line, f"{where}{key}")
    else:
        raise TraceError(path, line, f"{where}prompt_ids", "missing (or prompt_length)")
    valid = len(mask)
    if "response_length" in rec:
        valid = _count(rec["response_length"], path, line, f"{where}response_length")
    elif "attention_mask" in rec:
        attn = _ints(rec["attention_mask"], path, line, f"{where}attention_mask")
        if len(attn) < len(mask):  # it covers prompt + response: shorter than the response alone is another record's
            raise TraceError(
                path, line, f"{where}attention_mask", f"{len(attn)} long, shorter than response_mask ({len(mask)})"
            )
        valid = sum(attn[len(attn) - len(mask) :])
        prompt = min(prompt, sum(attn[: len(attn) - len(mask)])) if len(attn) > len(mask) else prompt
    if valid > len(mask):
        raise TraceError(path, line, f"{where}response_length", f"{valid} is longer than response_mask ({len(mask)})")
    names = rec.get("tool_names", extra_fields.get("tool_names")) or []
    statuses = rec.get("tool_statuses", extra_fields.get("tool_statuses")) or []
    segments: list[Segment] = []
    r = 0
    for bit, length in _runs(mask[:valid]):
        if bit == 1:
            segments.append(Segment(length))
        elif not segments:
            prompt += length  # tokens before the first generation belong to the prompt
        else:
            name = names[r] if r < len(names) and isinstance(names[r], str) and names[r] else "tool"
            status = statuses[r] if r < len(statuses) else "ok"
            if status not in TOOL_STATUSES:
                raise TraceError(path, line, f"{where}tool_statuses[{r}]", f"must be one of {TOOL_STATUSES}")
            last = segments[-1]
            segments[-1] = Segment(last.gen_tokens, last.returns + (Return(name, length, status),))
            r += 1
    pid = next((rec[k] for k in ("prompt_id", "uid", "index") if isinstance(rec.get(k), str | int)), f"{path.stem}-{n}")
    reward = next((rec[k] for k in ("reward_score", "reward", "score") if _number(rec.get(k))), None)
    step = next((rec[k] for k in ("step", "global_steps") if _count_or_none(rec.get(k)) is not None), None)
    meta = {k: v for k, v in rec.items() if k not in _USED and (v is None or isinstance(v, str | int | float | bool))}
    return build_trajectory(
        prompt_id=str(pid),
        prompt_tokens=prompt,
        segments=segments,
        path=path,
        line=line,
        reward=reward,
        sample=_count_or_none(rec.get("sample")),
        step=step,
        extra={"meta": meta} if meta else None,
    )


def _number(value: Any) -> bool:
    return checks.is_real(value)


def _count_or_none(value: Any) -> int | None:
    """`value` where it is a non-negative integer (not a bool), else None (a label the record may lack)."""
    return value if checks.is_whole(value) and value >= 0 else None


def import_verl(path: Path, **_: Any) -> Iterator[Trajectory]:
    """Trajectories of one verl rollout export (module docstring); no tokenizer needed."""
    places = Places()
    for line, value in iter_records(path):
        items = value if isinstance(value, list) else [value]
        for i, rec in enumerate(items):
            where = f"[{i}]." if isinstance(value, list) else ""
            with one_record():  # a bad record is left out alone where bad records are
                if not isinstance(rec, dict):
                    raise TraceError(path, line, where.rstrip(".") or None, "each record must be an object")
                yield _one(rec, path, line, where, places.of(line))
                places.kept()
