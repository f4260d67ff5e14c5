"""The trace schema (docs/trace-schema.md): JSON Lines, one trajectory per line, with a validating loader.

A turn is one generation plus the tool return that goes back into the context. Unknown keys are kept in `extra`.
A bad line raises `TraceError` naming the file, the line number and the field. Input is bounded before work:
a regular file (gzipped or not), UTF-8 lines of at most `MAX_LINE_BYTES`, token counts of at most `MAX_TOKENS` per
trajectory, at most `MAX_TURNS` turns, finite rewards, and a turn's optional `tool_latency_s` a finite number of
seconds in [0, `MAX_TOOL_LATENCY_S`] (docs/trace-schema.md).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from libra._native import optional_extension
from libra.spec.files import atomic_open

TOOL_STATUSES = ("ok", "error", "timeout")
MAX_TOKENS = 10_000_000  # tokens in one trajectory (prompt + generated + tool), 250 x a 40,960-token context
MAX_TURNS = 4096  # turns in one trajectory
MAX_TOOL_LATENCY_S = 3600.0  # seconds one tool call may take
MAX_LINE_BYTES = 64 << 20  # one JSON line
_KNOWN_KEYS = {"prompt_id", "sample", "step", "prompt_tokens", "turns", "reward"}
_TURN_KEYS = {"gen_tokens", "tool", "tool_status", "tool_tokens"}


class TraceError(ValueError):
    """A trace file (or one of its lines) does not follow the schema."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        where = f"{path}" + (f":{line}" if line is not None else "")
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
        self.path, self.line, self.field = str(path), line, field


@attrs.frozen(kw_only=True)
class Turn:
    gen_tokens: int
    tool: str | None = None
    tool_status: str | None = None
    tool_tokens: int = 0
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)


def _load_slots_native() -> Any:
    """The optional C maker of slotted values (ext/workloads/slots_native.c), or None where it is not built or
    `LIBRA_PURE_PYTHON` is set."""
    return optional_extension("libra.workloads._slots_native")


_SLOTS_NATIVE = _load_slots_native()


def trusted_values(cls: type, fields: tuple[str, ...], columns: tuple[Sequence[Any], ...]) -> list[Any]:
    """`cls(**{f: column[i] for f, column in zip(fields, columns)})` for each row i, for callers whose values are
    valid by construction and who give every field (a test checks the callers do): `object.__new__(cls)` and each
    slot's setter, which is what an attrs frozen slotted class's constructor does, without the keyword handling;
    in C where ext/workloads is built (no Python call per slot: tests/workloads/test_trusted_turns.py)."""
    if _SLOTS_NATIVE is not None:
        return _SLOTS_NATIVE.make(cls, fields, columns)
    new = object.__new__
    setters = [cls.__dict__[name].__set__ for name in fields]
    out: list[Any] = [new(cls) for _ in range(len(columns[0]) if columns else 0)]
    for setter, column in zip(setters, columns, strict=True):
        for value, row in zip(column, out, strict=True):
            setter(row, value)
    return out


def trusted_turns(
    gen_tokens: Sequence[int],
    tools: Sequence[str | None],
    statuses: Sequence[str | None],
    tool_tokens: Sequence[int],
    extras: Sequence[dict[str, Any]],
) -> list[Turn]:
    """`Turn(gen_tokens=g, tool=t, tool_status=s, tool_tokens=n, extra=e)` for each tuple of the sequences, for
    callers whose values are valid by construction (the synthetic generators make ~100K turns per step): see
    `trusted_values`."""
    return trusted_values(Turn, _TURN_FIELDS, (gen_tokens, tools, statuses, tool_tokens, extras))


# Turn's fields, in the order trusted_turns takes them (a test checks that they are all of them)
_TURN_FIELDS = ("gen_tokens", "tool", "tool_status", "tool_tokens", "extra")


@attrs.frozen(kw_only=True)
class Trajectory:
    prompt_id: str
    prompt_tokens: int
    turns: tuple[Turn, ...]
    sample: int | None = None
    step: int | None = None
    reward: float | None = None
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    @property
    def tool_tokens(self) -> int:
        return sum(t.tool_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """prompt_tokens + sum(gen_tokens + tool_tokens)."""
        return self.prompt_tokens + self.gen_tokens + self.tool_tokens

    @property
    def num_tool_calls(self) -> int:
        return sum(1 for t in self.turns if t.tool is not None)

    def context_after(self, num_turns: int) -> int:
        """Tokens in the context after the first `num_turns` turns (generation and tool return)."""
        return self.prompt_tokens + sum(t.gen_tokens + t.tool_tokens for t in self.turns[:num_turns])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_id": self.prompt_id}
        if self.sample is not None:
            out["sample"] = self.sample
        if self.step is not None:
            out["step"] = self.step
        out["prompt_tokens"] = self.prompt_tokens
        out["turns"] = [
            {
                "gen_tokens": t.gen_tokens,
                "tool": t.tool,
                "tool_status": t.tool_status,
                "tool_tokens": t.tool_tokens,
                **t.extra,
            }
            for t in self.turns
        ]
        if self.reward is not None:
            out["reward"] = self.reward
        out.update(self.extra)
        return out


def _int_field(obj: dict, key: str, path: Path, line: int, *, required: bool = True, default: int = 0) -> int:
    if key not in obj or obj[key] is None:
        if required:
            raise TraceError(path, line, key, "missing")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise TraceError(path, line, key, f"must be an integer in [0, {MAX_TOKENS:,}], got {value!r}")
    return value


def _parse_turn(raw: Any, index: int, path: Path, line: int) -> Turn:
    name = f"turns[{index}]"
    if not isinstance(raw, dict):
        raise TraceError(path, line, name, f"must be an object, got {type(raw).__name__}")
    gen = _int_field(raw, "gen_tokens", path, line)
    tool = raw.get("tool")
    if tool is not None and (not isinstance(tool, str) or not tool):
        raise TraceError(path, line, f"{name}.tool", f"must be a non-empty string or null, got {tool!r}")
    status = raw.get("tool_status")
    if tool is None:
        if status is not None:
            raise TraceError(path, line, f"{name}.tool_status", "must be null when tool is null")
    elif status not in TOOL_STATUSES:
        allowed = ", ".join(TOOL_STATUSES)
        raise TraceError(path, line, f"{name}.tool_status", f"must be one of {allowed}, got {status!r}")
    tool_tokens = _int_field(raw, "tool_tokens", path, line, required=False)
    if tool is None and tool_tokens:
        raise TraceError(path, line, f"{name}.tool_tokens", "must be 0 when tool is null")
    extra = {k: v for k, v in raw.items() if k not in _TURN_KEYS}
    latency = extra.get("tool_latency_s")
    if latency is not None and not (
        isinstance(latency, int | float)
        and not isinstance(latency, bool)
        and _finite(latency)
        and 0 <= latency <= MAX_TOOL_LATENCY_S
    ):
        raise TraceError(
            path,
            line,
            f"{name}.tool_latency_s",
            f"must be a number of seconds in [0, {MAX_TOOL_LATENCY_S:g}], got {latency!r}",
        )
    return Turn(gen_tokens=gen, tool=tool, tool_status=status, tool_tokens=tool_tokens, extra=extra)


def _finite(value: int | float) -> bool:
    """A finite number that a float holds (JSON's integers have no bound: 1e400 written out is not one)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_line(text: str, path: Path, line: int) -> Trajectory:
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # NaN, Infinity
        raise TraceError(path, line, None, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(path, line, None, "not valid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise TraceError(path, line, None, "each line must be a JSON object")
    prompt_id = obj.get("prompt_id")
    if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
        prompt_id = str(prompt_id)
    if not isinstance(prompt_id, str) or not prompt_id:
        raise TraceError(path, line, "prompt_id", f"must be a non-empty string, got {prompt_id!r}")
    prompt_tokens = _int_field(obj, "prompt_tokens", path, line)
    turns_raw = obj.get("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise TraceError(path, line, "turns", "must be a non-empty list of turns")
    if len(turns_raw) > MAX_TURNS:
        raise TraceError(path, line, "turns", f"has {len(turns_raw):,} turns; at most {MAX_TURNS:,}")
    turns = tuple(_parse_turn(t, i, path, line) for i, t in enumerate(turns_raw))
    total = prompt_tokens + sum(t.gen_tokens + t.tool_tokens for t in turns)
    if not 1 <= total <= MAX_TOKENS:
        raise TraceError(path, line, None, f"trajectory of {total:,} tokens; it must hold 1 to {MAX_TOKENS:,}")
    for i, t in enumerate(turns[:-1]):
        if t.tool is None:
            raise TraceError(path, line, f"turns[{i}].tool", "only the last turn may have no tool call")
    sample = _int_field(obj, "sample", path, line, required=False, default=-1)
    step = _int_field(obj, "step", path, line, required=False, default=-1)
    reward = obj.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float) or not _finite(reward)):
        raise TraceError(path, line, "reward", f"must be a finite number or null, got {reward!r}")
    extra = {k: v for k, v in obj.items() if k not in _KNOWN_KEYS}
    return Trajectory(
        prompt_id=prompt_id,
        prompt_tokens=prompt_tokens,
        turns=turns,
        sample=None if sample < 0 else sample,
        step=None if step < 0 else step,
        reward=None if reward is None else float(reward),
        extra=extra,
    )


def iter_trace(path: str | Path) -> Iterator[Trajectory]:
    """Yield trajectories in file order; blank lines are skipped. A gzipped file (told by its first two bytes, not
    its name) is read through gzip, with the same line limit."""
    path = Path(path)
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise TraceError(path, None, None, f"cannot open trace: it {what}")
        handle: Any = path.open("rb")
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot open trace: {exc.strerror or exc}") from None
    try:
        gzipped = handle.read(2) == b"\x1f\x8b"
        handle.seek(0)
    except OSError as exc:
        handle.close()
        raise TraceError(path, 1, None, f"cannot read trace: {exc.strerror or exc}") from None
    if gzipped:
        handle = gzip.GzipFile(fileobj=handle, mode="rb")
    with handle:
        number = 0
        while True:
            number += 1
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as exc:  # (gzip.BadGzipFile is an OSError)
                why = getattr(exc, "strerror", None) or exc
                if isinstance(exc, EOFError):
                    why = "the compressed stream ends early"
                raise TraceError(path, number, None, f"cannot read trace: {why}") from None
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(path, number, None, f"line longer than {MAX_LINE_BYTES >> 20} MiB")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(path, number, None, f"not UTF-8 text (byte {exc.start} of the line)") from None
            if text.strip():
                yield parse_line(text, path, number)


def load_trace(path: str | Path) -> list[Trajectory]:
    """All trajectories of a trace file, plain or gzipped; an empty file is an error."""
    trajectories = list(iter_trace(path))
    if not trajectories:
        raise TraceError(path, None, None, "trace holds no trajectories")
    return trajectories


def write_trace(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories as JSON Lines, gzipped where the name ends in ".gz", whole or not at all (a temporary
    file renamed over `path`: `atomic_open`); returns how many were written."""
    path = Path(path)
    count = 0
    with atomic_open(path, "wb") as raw:
        out = gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) if path.name.endswith(".gz") else raw
        for traj in trajectories:
            out.write(json.dumps(traj.to_json(), separators=(",", ":")).encode() + b"\n")
            count += 1
        if out is not raw:
            out.close()  # (the gzip trailer; `raw` stays open for the rename)
    return count


def group_by_step(trajectories: list[Trajectory], *, steps_without_label: int = 1) -> list[list[Trajectory]]:
    """Trajectories grouped by `step` in ascending order. Without `step` labels, file order is time order: the
    file is cut into `steps_without_label` consecutive chunks."""
    if all(t.step is not None for t in trajectories):
        by_step: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            by_step.setdefault(int(t.step), []).append(t)  # type: ignore[arg-type]
        return [by_step[s] for s in sorted(by_step)]
    n = len(trajectories)
    k = max(1, min(steps_without_label, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [trajectories[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


# Trajectory's fields, in the order `trusted_values` callers give them (a test checks that they are all of them)
TRAJECTORY_FIELDS = ("prompt_id", "prompt_tokens", "turns", "sample", "step", "reward", "extra")
