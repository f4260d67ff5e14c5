"""The trace schema (docs/trace-schema.md): JSON Lines, one trajectory per line, with a validating loader.

A turn is one generation plus the tool return that goes back into the context. Unknown keys are kept in `extra`.
A bad line raises `TraceError` naming the file, the line number and the field. Input is bounded before work:
a regular file (gzipped or not), UTF-8 lines of at most `MAX_LINE_BYTES`, token counts of at most `MAX_TOKENS` per
trajectory, at most `MAX_TURNS` turns, finite rewards, and a turn's optional `tool_latency_s` a finite number of
seconds in [0, `MAX_TOOL_LATENCY_S`] (docs/trace-schema.md).

`Turn` and `Trajectory` apply the same rules when built in code, with the same messages (`TraceValueError`, naming
the class and the field), so that a value the planner or the simulator gets is one the loader would have given;
`write_trace` refuses, in one line, an `extra` that JSON cannot hold: what it writes, the loader reads back equal.
Only `trusted_values` (the generators' fast path, for values valid by construction) makes them without the checks.
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
from libra.spec.errors import SpecError
from libra.spec.files import atomic_open

TOOL_STATUSES = ("ok", "error", "timeout")
_STATUS_SET = frozenset(TOOL_STATUSES)
MAX_TOKENS = 10_000_000  # tokens in one trajectory (prompt + generated + tool), 250 x a 40,960-token context
MAX_TURNS = 4096  # turns in one trajectory
MAX_TOOL_LATENCY_S = 86_400.0  # seconds one tool call may take: a day (a run's slowest test suites take hours)
MAX_LINE_BYTES = 64 << 20  # one JSON line
_UTF8_BOM = b"\xef\xbb\xbf"  # the byte order mark some editors put at the start of a UTF-8 file
_KNOWN_KEYS = frozenset({"prompt_id", "sample", "step", "prompt_tokens", "turns", "reward"})
_TURN_KEYS = frozenset({"gen_tokens", "tool", "tool_status", "tool_tokens"})
# keys that mark a record of the agent logs `libra trace import` reads (chat messages, SWE-agent, verl rollouts)
_AGENT_LOG_KEYS = frozenset(
    {"messages", "conversations", "conversation", "role", "contents", "history", "trajectory", "response_mask"}
)
_AGENT_LOG_HINT = "this looks like an agent log, not a Libra trace: convert it with `libra trace import`"


class TraceError(ValueError):
    """A trace file (or one of its lines) does not follow the schema."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        where = f"{path}" + (f":{line}" if line is not None else "")
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
        self.path, self.line, self.field, self.message = str(path), line, field, message


class TraceValueError(TraceError, SpecError):
    """A `Turn` or `Trajectory` built in code breaks a rule of the schema: the loader's rule and message, naming the
    class and the field in place of a file and a line."""

    def __init__(self, cls: str, field: str | None, message: str) -> None:
        TraceError.__init__(self, cls, None, field, message)
        self.path = ""


def _count_error(value: Any) -> str | None:
    """Why `value` is not a token count (or a sample / step number), or None where it is one."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return None
    return f"must be an integer in [0, {MAX_TOKENS:,}], got {value!r}"


def _reward_error(value: Any) -> str | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)):
        return None
    return f"must be a finite number or null, got {value!r}"


def _latency_error(value: Any) -> str | None:
    if value is None or (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and _finite(value)
        and 0 <= value <= MAX_TOOL_LATENCY_S
    ):
        return None
    return f"must be a number of seconds in [0, {MAX_TOOL_LATENCY_S:g}], got {value!r}"


def _extra_error(extra: Any, fields: frozenset[str]) -> tuple[str, str] | None:
    """Why `extra` cannot be the unknown keys of a line (a dict with string keys, none of them a field of the
    schema, which the line's own field would shadow), or None."""
    if not isinstance(extra, dict):
        return "extra", f"must be a dict of the unknown keys, got {type(extra).__name__}"
    for key in extra:
        if not isinstance(key, str):
            return "extra", f"keys must be strings (JSON object keys), got {key!r}"
        if key in fields:
            return "extra", f"key {key!r} is a field of the schema: set the field, not extra"
    return None


@attrs.frozen(kw_only=True)
class Turn:
    """One generation and the tool return that follows it, under the loader's rules (docs/trace-schema.md): a turn
    that breaks one raises `TraceValueError` naming the field. `tool_status` left out is "ok" for a tool call (an
    explicit None with a tool is refused, as the loader refuses null)."""

    gen_tokens: int
    tool: str | None = None
    tool_status: str | None = attrs.field(
        default=attrs.Factory(lambda self: None if self.tool is None else "ok", takes_self=True)
    )
    tool_tokens: int = 0
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        # the common turns pass one expression (the loader builds millions); any other is looked at rule by rule
        g, n, tool, extra = self.gen_tokens, self.tool_tokens, self.tool, self.extra
        if (
            type(g) is int
            and type(n) is int
            and 0 <= g <= MAX_TOKENS
            and (
                (tool is None and self.tool_status is None and n == 0)
                or (type(tool) is str and tool and _plain_status(self.tool_status) and 0 <= n <= MAX_TOKENS)
            )
            and type(extra) is dict
            and (not extra or (len(extra) == 1 and _plain_latency(extra.get("tool_latency_s"))))
        ):
            return
        problem = _turn_error(self)
        if problem is not None:
            raise TraceValueError("Turn", *problem)


def _plain_status(value: Any) -> bool:
    return type(value) is str and value in _STATUS_SET  # (a list is not hashable: asked of a set, it would raise)


def _plain_latency(value: Any) -> bool:
    return type(value) is float and 0.0 <= value <= MAX_TOOL_LATENCY_S


def _turn_error(turn: Turn) -> tuple[str, str] | None:
    """(field, why) of the first rule of the trace schema that `turn` breaks, or None (docs/trace-schema.md)."""
    if (why := _count_error(turn.gen_tokens)) is not None:
        return "gen_tokens", why
    tool, status = turn.tool, turn.tool_status
    if tool is None:
        if status is not None:
            return "tool_status", "must be null when tool is null"
    elif not isinstance(tool, str) or not tool:
        return "tool", f"must be a non-empty string or null, got {tool!r}"
    elif status not in TOOL_STATUSES:
        return "tool_status", f"must be one of {', '.join(TOOL_STATUSES)}, got {status!r}"
    if (why := _count_error(turn.tool_tokens)) is not None:
        return "tool_tokens", why
    if tool is None and turn.tool_tokens:
        return "tool_tokens", "must be 0 when tool is null"
    extra = turn.extra
    if type(extra) is not dict or extra:  # (most turns have none: the common case costs one test)
        if (problem := _extra_error(extra, _TURN_KEYS)) is not None:
            return problem
        if (why := _latency_error(extra.get("tool_latency_s"))) is not None:
            return "tool_latency_s", why
    return None


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
        try:
            return _SLOTS_NATIVE.make(cls, fields, columns)
        except TypeError:  # a class the C maker does not take (its own allocation, a slot that is not plain)
            pass  # the reference makes it, or refuses it as object.__new__ does
    new = object.__new__
    # each field's slot, on whichever class of the MRO declares it (a subclass inherits its base's slots)
    setters = [next(c.__dict__[name] for c in cls.__mro__ if name in c.__dict__).__set__ for name in fields]
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


def _reward(value: Any) -> float | None:
    """A reward as the loader gives it back: a float (an integer past 2**53 written out would not read back equal)."""
    if (why := _reward_error(value)) is not None:
        raise TraceValueError("Trajectory", "reward", why)
    return None if value is None else float(value)


def _trajectory_error(traj: Trajectory) -> tuple[str | None, str] | None:
    """(field, why) of the first rule of the schema `traj` breaks, or None (its turns checked themselves)."""
    prompt_id = traj.prompt_id
    if not isinstance(prompt_id, str) or not prompt_id:
        return "prompt_id", f"must be a non-empty string, got {prompt_id!r}"
    if (why := _count_error(traj.prompt_tokens)) is not None:
        return "prompt_tokens", why
    turns = traj.turns
    if not isinstance(turns, tuple):  # (a list would make the value unhashable and let it change)
        return "turns", f"must be a tuple of Turn values, got {type(turns).__name__}"
    if (why := _turns_count_error(len(turns))) is not None:
        return "turns", why
    total = traj.prompt_tokens
    last = len(turns) - 1
    for i, t in enumerate(turns):  # (a plain loop: the fastest form in CPython 3.11)
        if not isinstance(t, Turn):
            return f"turns[{i}]", f"must be a Turn, got {type(t).__name__}"
        if t.tool is None and i != last:
            return f"turns[{i}].tool", "only the last turn may have no tool call"
        total += t.gen_tokens + t.tool_tokens
    if not 1 <= total <= MAX_TOKENS:
        return None, f"trajectory of {total:,} tokens; it must hold 1 to {MAX_TOKENS:,}"
    for name in ("sample", "step"):
        value = getattr(traj, name)
        if value is not None and (why := _count_error(value)) is not None:
            return name, why
    return _extra_error(traj.extra, _KNOWN_KEYS)


def _turns_count_error(count: int) -> str | None:
    if count == 0:
        return "must be a non-empty list of turns"
    if count > MAX_TURNS:
        return f"has {count:,} turns; at most {MAX_TURNS:,}"
    return None


# Turn's fields, in the order trusted_turns takes them (a test checks that they are all of them)
_TURN_FIELDS = ("gen_tokens", "tool", "tool_status", "tool_tokens", "extra")


@attrs.frozen(kw_only=True)
class Trajectory:
    """One sampled answer to one prompt, with all its turns (a tuple), under the loader's rules: one that breaks one
    raises `TraceValueError` naming the field. `reward` is kept as a float, as the loader gives it back. `extra`
    holds the keys the schema does not name (none of those it names), and takes no part in equality."""

    prompt_id: str
    prompt_tokens: int
    turns: tuple[Turn, ...]
    sample: int | None = None
    step: int | None = None
    reward: float | None = attrs.field(default=None, converter=_reward)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        problem = _trajectory_error(self)
        if problem is not None:
            raise TraceValueError("Trajectory", *problem)

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


def _parse_turn(raw: Any, index: int, path: Path, line: int) -> Turn:
    """The turn of a line; `Turn` applies the schema's rules, and its error is given the file, line and turn."""
    name = f"turns[{index}]"
    if not isinstance(raw, dict):
        raise TraceError(path, line, name, f"must be an object, got {type(raw).__name__}")
    gen = raw.get("gen_tokens")
    if gen is None:
        raise TraceError(path, line, f"{name}.gen_tokens", "missing")
    tool_tokens = raw.get("tool_tokens")
    extra = {k: v for k, v in raw.items() if k not in _TURN_KEYS}
    try:
        return Turn(
            gen_tokens=gen,
            tool=raw.get("tool"),
            tool_status=raw.get("tool_status"),
            tool_tokens=0 if tool_tokens is None else tool_tokens,
            extra=extra,
        )
    except TraceValueError as exc:
        raise TraceError(path, line, f"{name}.{exc.field}", exc.message) from None


def _finite(value: int | float) -> bool:
    """A finite number that a float holds (JSON's integers have no bound: 1e400 written out is not one)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _missing_prompt_tokens(obj: dict[str, Any]) -> str:
    """The message for a line without `prompt_tokens`: "missing", with the way on where the line is a record of an
    agent log (a chat's `messages`, a `role`, ...) rather than a trace line, the most common wrong file given."""
    if "turns" not in obj and not _AGENT_LOG_KEYS.isdisjoint(obj):
        return f"missing; {_AGENT_LOG_HINT}"
    return "missing"


def _not_an_object(obj: Any) -> str:
    """The message for a line that is not a JSON object, with the way on where it is a chat's list of messages (each
    a mapping with a `role`), an agent log's line rather than a trace's."""
    if isinstance(obj, list) and obj and all(isinstance(m, dict) and "role" in m for m in obj):
        return f"each line must be a JSON object; {_AGENT_LOG_HINT}"
    return "each line must be a JSON object"


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
        raise TraceError(path, line, None, _not_an_object(obj))
    prompt_id: Any = obj.get("prompt_id")
    if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
        prompt_id = str(prompt_id)
    if obj.get("prompt_tokens") is None:
        raise TraceError(path, line, "prompt_tokens", _missing_prompt_tokens(obj))
    # the turns are bounded before any of them is read
    turns_raw = obj.get("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise TraceError(path, line, "turns", "must be a non-empty list of turns")
    if (why := _turns_count_error(len(turns_raw))) is not None:
        raise TraceError(path, line, "turns", why)
    turns = tuple(_parse_turn(t, i, path, line) for i, t in enumerate(turns_raw))
    try:
        return Trajectory(
            prompt_id=prompt_id,
            prompt_tokens=obj["prompt_tokens"],
            turns=turns,
            sample=obj.get("sample"),
            step=obj.get("step"),
            reward=obj.get("reward"),
            extra={k: v for k, v in obj.items() if k not in _KNOWN_KEYS},
        )
    except TraceValueError as exc:
        raise TraceError(path, line, exc.field, exc.message) from None


def iter_trace(path: str | Path) -> Iterator[Trajectory]:
    """Yield trajectories in file order; blank lines are skipped, and so is a UTF-8 byte order mark that opens the
    file. A gzipped file (told by its first two bytes, not its name) is read through gzip, with the same line
    limit."""
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
            if number == 1 and raw.startswith(_UTF8_BOM):  # (Windows tools write one: the text is still UTF-8)
                raw = raw[len(_UTF8_BOM) :]
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
    try:
        with atomic_open(path, "wb") as raw:
            out = gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) if path.name.endswith(".gz") else raw
            for traj in trajectories:
                out.write(_json_line(traj, path, count + 1))
                count += 1
            if out is not raw:
                out.close()  # (the gzip trailer; `raw` stays open for the rename)
    except OSError as exc:  # (a folder, a missing parent, a full disk: the temporary file's name would mislead)
        raise TraceError(path, None, None, f"cannot write trace: {exc.strerror or exc}") from None
    return count


def _json_line(traj: Any, path: Path, line: int) -> bytes:
    """`traj` as one line of JSON that the loader reads back equal, or a `TraceError` naming the line it would have
    been and the field that JSON cannot hold (NaN, a set, an object): `extra` is checked here, not at construction,
    where the loader would pay for it."""
    if not isinstance(traj, Trajectory):
        raise TraceError(path, line, None, f"cannot write a {type(traj).__name__}: a Trajectory is wanted")
    obj = traj.to_json()
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError, RecursionError) as exc:
        field = _unwritable_field(obj)
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise TraceError(path, line, field, f"cannot be written as JSON ({why})") from None


def _unwritable_field(obj: dict[str, Any]) -> str | None:
    """The first field of a trajectory's JSON form that JSON cannot hold (`turns[i].key` for a turn's), if one."""
    for key, value in obj.items():
        if key == "turns":
            for i, turn in enumerate(value):
                for k, v in turn.items():
                    if not _writable(v):
                        return f"turns[{i}].{k}"
        elif not _writable(value):
            return key
    return None


def _writable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def group_by_step(trajectories: list[Trajectory], *, steps_without_label: int = 1) -> list[list[Trajectory]]:
    """Trajectories grouped by `step` in ascending order. Without `step` labels, file order is time order: the
    file is cut into `steps_without_label` consecutive chunks."""
    if isinstance(steps_without_label, bool) or not isinstance(steps_without_label, int) or steps_without_label < 1:
        raise SpecError(f"steps_without_label must be an integer >= 1, got {steps_without_label!r}")
    if all(t.step is not None for t in trajectories):
        by_step: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            by_step.setdefault(int(t.step), []).append(t)  # type: ignore[arg-type]
        return [by_step[s] for s in sorted(by_step)]
    n = len(trajectories)
    k = max(1, min(steps_without_label, n))  # (n = 0: no chunk)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [trajectories[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


# Trajectory's fields, in the order `trusted_values` callers give them (a test checks that they are all of them)
TRAJECTORY_FIELDS = ("prompt_id", "prompt_tokens", "turns", "sample", "step", "reward", "extra")
