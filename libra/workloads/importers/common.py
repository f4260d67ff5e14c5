"""What every importer shares: reading JSON / JSON Lines (or Parquet rows, parquet.py) strictly, the tool-status
rules, and turning an ordered list of (generation, returns) segments into a `Trajectory`.

Reading: a file must be UTF-8; a file holding one JSON value is read whole, else as JSON Lines. Every error is a
`TraceError` naming the file and the line (and the field where there is one). Inside `keeping_cut_tails()` (what
`libra trace import --skip-errors` reads under), a JSON Lines file whose writer stopped mid-line (a run killed, a
log still being written: its last line is not valid JSON and no newline ends the file; gzipped, the stream ends
early) is read up to that line, which is left out and reported as a `CutTail`. Inside `keeping_good_records()`
(`--skip-bad-records`), a record that is not a trajectory of the format (a JSON Lines line that is not JSON, an item
or a line the importer rejects) is left out and reported as a `BadRecord`, and the file's other records are kept;
each importer marks what one record is with `one_record()`.

Tool status (`StatusRules`): a return is `timeout` if a timeout flag or text says so, else `error` if an explicit
error field, a non-zero exit code or a known error text says so, else `ok`. Texts are regular expressions matched
(case-insensitively, per line) against the first and last lines of the return, where shells and tools put their
verdict, not in the middle of a file listing that happens to contain the word "Error"; a line longer than 400
characters is looked at by its first and last 200 (its two ends read as two lines).
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import json
import logging
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from libra.workloads.importers import parquet
from libra.workloads.trace import TraceError, TraceValueError, Trajectory, Turn

DEFAULT_ERROR_PATTERNS: tuple[str, ...] = (
    r"^Traceback \(most recent call last\)",
    r"^[A-Za-z_.]*(Error|Exception)\b\s*[:(]",
    r"^error\b",
    r"^fatal:",
    r"command not found",
    r"No such file or directory",
    r"^Usage:",
    r"^Invalid\b",
    r"not found$",
)
DEFAULT_TIMEOUT_PATTERNS: tuple[str, ...] = (
    r"timed out",
    r"TimeoutError",
    r"TimeoutExpired",
    r"^timeout\b",
    r"execution time(d)? ?out",
)
_EDGE_LINES = 3  # lines looked at, at each end of a return
_EDGE_CHARS = 200  # characters looked at, at each end of one of those lines
# the key under which a message rewritten from another dialect lists the tools it called without a text of their
# own to count (`openai_chat._gen_text` reads it): a ShareGPT function call's whole text is its generation
CALL_NAMES = "_libra_call_names"
# the key under which a rewritten tool result states a status its text does not (a Gemini code deadline: timeout)
STATUS = "_libra_status"
# the key under which a rewritten assistant message names the model response it is part of, where a log writes one
# response as several messages with returns between them (OpenHands runs a response's tool calls one at a time,
# each action followed by its observation; Claude Code writes each content block on a line of its own): the parts
# of one response are one generation (`openai_chat.convert_messages`)
RESPONSE = "_libra_response"


@attrs.frozen
class StatusRules:
    """How a tool return's status is decided (module docstring). Patterns are regular expressions."""

    error_patterns: tuple[str, ...] = DEFAULT_ERROR_PATTERNS
    timeout_patterns: tuple[str, ...] = DEFAULT_TIMEOUT_PATTERNS
    _error_re: Any = attrs.field(init=False, repr=False, eq=False)
    _timeout_re: Any = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        for attr, patterns in (("_error_re", self.error_patterns), ("_timeout_re", self.timeout_patterns)):
            if not isinstance(patterns, tuple | list) or not all(isinstance(p, str) for p in patterns):
                raise ValueError(f"{attr[1:-3]}_patterns must be a tuple of regular expressions, got {patterns!r}")
            try:
                compiled = re.compile("|".join(f"(?:{p})" for p in patterns), re.I | re.M) if patterns else None
            except re.error as exc:
                raise ValueError(f"bad status pattern in {list(patterns)!r}: {exc}") from None
            object.__setattr__(self, attr, compiled)

    def classify(self, text: str, *, error: bool | None = None, exit_code: int | None = None) -> str:
        """`ok`, `error` or `timeout` for one return (explicit signals first, then the texts)."""
        edges = _edges(text)
        if self._timeout_re is not None and self._timeout_re.search(edges):
            return "timeout"
        if error or (exit_code is not None and exit_code != 0):
            return "error"
        if error is False or exit_code == 0:
            return "ok"
        if self._error_re is not None and self._error_re.search(edges):
            return "error"
        return "ok"


def _edges(text: str) -> str:
    """The first and last `_EDGE_LINES` lines of a return, each cut to its first and last `_EDGE_CHARS` characters
    (a verdict opens or closes a line; a long line, a document or a minified file, is not searched whole)."""
    lines = text.strip().splitlines()
    if len(lines) > 2 * _EDGE_LINES:
        lines = lines[:_EDGE_LINES] + lines[-_EDGE_LINES:]
    return "\n".join(_line_edges(line.strip()) for line in lines)


def _line_edges(line: str) -> str:
    if len(line) <= 2 * _EDGE_CHARS:
        return line
    return f"{line[:_EDGE_CHARS]}\n{line[-_EDGE_CHARS:]}"


class CutTail(TraceError):
    """The last line of a JSON Lines file that its writer stopped in the middle of, left out (`keeping_cut_tails`)."""


_CUT_TAILS: contextvars.ContextVar[list[CutTail] | None] = contextvars.ContextVar("cut_tails", default=None)


_E = TypeVar("_E", bound=TraceError)


@contextlib.contextmanager
def _collecting(notes: contextvars.ContextVar[list[_E] | None]) -> Iterator[list[_E]]:
    """A fresh list set as `notes` within it (what is left out is noted there), given to the caller."""
    got: list[_E] = []
    token = notes.set(got)
    try:
        yield got
    finally:
        notes.reset(token)


def keeping_cut_tails() -> contextlib.AbstractContextManager[list[CutTail]]:
    """Within it, a JSON Lines file cut off mid-line is read up to its last whole line (module docstring); the list
    it gives collects what was left out, one `CutTail` per file."""
    return _collecting(_CUT_TAILS)


class BadRecord(TraceError):
    """A record of a log that holds many (a JSON Lines line, an item of a list, a sample of an evaluation log) that
    is not a trajectory of the format, left out within `keeping_good_records`."""


_BAD_RECORDS: contextvars.ContextVar[list[BadRecord] | None] = contextvars.ContextVar("bad_records", default=None)


def keeping_good_records() -> contextlib.AbstractContextManager[list[BadRecord]]:
    """Within it, a record that `one_record()` reads and that raises a TraceError is left out, the file's others
    kept; the list it gives collects what was left out, one `BadRecord` per record."""
    return _collecting(_BAD_RECORDS)


@contextlib.contextmanager
def one_record() -> Iterator[None]:
    """Around what reads one record: within `keeping_good_records`, a TraceError raised in it is noted as a
    `BadRecord` and the rest of the block skipped (the record left out); else it goes on up (the file is bad)."""
    try:
        yield
    except TraceError as exc:
        bad = _BAD_RECORDS.get()
        if bad is None:
            raise
        bad.append(BadRecord(exc.path, exc.line, exc.field, exc.message))


def file_error(note: TraceError) -> TraceError:
    """A bad record's error as the error of its whole file (what leaves the file out)."""
    return TraceError(note.path, note.line, note.field, note.message)


def whole_lines(records: Iterator[tuple[int, Any]], path: Path, since: int) -> Iterator[tuple[int, Any]]:
    """`records` (from `iter_records`) for a log whose lines make one trajectory together (a session log: a line
    left out would change it): if a line of `path` was left out as a bad record (noted after the first `since`),
    that line's error is raised when `records` is done, so that the file is left out whole."""
    yield from records
    bad = _BAD_RECORDS.get()
    mine = [b for b in (bad or [])[since:] if b.path == str(path)]
    if mine:
        raise file_error(mine[0])


def forget_bad_records(since: int) -> None:
    """Drop the bad records noted after the first `since` (a file read again from its start notes them again)."""
    bad = _BAD_RECORDS.get()
    if bad is not None:
        del bad[since:]


def bad_records_noted() -> int:
    """How many bad records have been noted (0 outside `keeping_good_records`): a mark for `whole_lines`."""
    bad = _BAD_RECORDS.get()
    return len(bad) if bad is not None else 0


class Places:
    """The place of each record of one file, the records left out as bad counted, so that an id-less record keeps
    its name (`FILE-N`) whatever is left out before it. Made before the file is read; `kept()` after each record
    read."""

    def __init__(self) -> None:
        self._kept = 0
        self._mark = bad_records_noted()

    def of(self, line: int | None) -> int:
        """The place of the record read now, at `line`: a bad line read ahead of it (a later line) not counted."""
        bad = _BAD_RECORDS.get()
        if not bad or len(bad) == self._mark:
            return self._kept
        return self._kept + sum(1 for b in bad[self._mark :] if line is None or b.line is None or b.line <= line)

    def kept(self) -> None:
        self._kept += 1


def read_text(path: Path) -> str:
    """The file as text: must exist, be UTF-8 (gzipped or not: told by its first two bytes, as traces are) and hold
    something."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot read: {exc.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError as exc:  # the stream ends early: what it holds, if cut tails are kept
            cut = _CUT_TAILS.get()
            if cut is None:
                raise TraceError(path, None, None, f"not a whole gzip file ({exc})") from None
            data = _whole_lines_of_cut_gzip(path, data, cut)
        except (OSError, zlib.error) as exc:  # (gzip.BadGzipFile is an OSError)
            raise TraceError(path, None, None, f"not a whole gzip file ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceError(path, line, None, f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if not text.strip():
        raise TraceError(path, None, None, "file is empty")
    return text.lstrip("\ufeff")


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """`(line, value)` for the JSON value of a file, or for each line of a JSON Lines file (blank lines skipped), or
    for each row of a Parquet file (parquet.py: `line` is then the row)."""
    if parquet.is_parquet(path):
        yield from parquet.iter_rows(path)
        return
    text = read_text(path)
    try:
        yield 1, json.loads(text)
        return
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data" and not _bad_first_line(text, exc):
            raise TraceError(path, exc.lineno, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TraceError(path, None, None, _TOO_DEEP) from None
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    cut = _CUT_TAILS.get()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        with one_record():  # a bad line is left out (within keeping_good_records) or the file's error
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                why = f"not valid JSON ({exc.msg} at column {exc.colno})"
                if cut is not None and number == last and not text.endswith("\n"):
                    cut.append(CutTail(path, number, None, f"{why}: its writer stopped in the middle of the last line"))
                    return
                raise TraceError(path, number, None, why) from None
            except RecursionError:
                raise TraceError(path, number, None, _TOO_DEEP) from None
            yield number, value


def _bad_first_line(text: str, exc: json.JSONDecodeError) -> bool:
    """Whether, with bad records kept out, a text that is not one JSON value is JSON Lines whose first line is bad:
    the error is on line 1 and the next line that holds something is a JSON value of its own (not the middle of a
    value spread over lines)."""
    if _BAD_RECORDS.get() is None or exc.lineno != 1:
        return False
    following = next((line for line in text.splitlines()[1:] if line.strip()), None)
    if following is None:
        return False
    try:
        json.loads(following)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def _whole_lines_of_cut_gzip(path: Path, data: bytes, cut: list[CutTail]) -> bytes:
    """The whole lines a gzip stream that ends early holds (a file still being written, or its writer killed); the
    line it stops in, or its end, noted in `cut`."""
    try:
        held = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    except zlib.error as exc:
        raise TraceError(path, None, None, f"not a whole gzip file ({exc})") from None
    whole = held[: held.rfind(b"\n") + 1]
    if not whole.strip():
        raise TraceError(path, None, None, "not a whole gzip file (it ends before its first whole line)")
    line = whole.count(b"\n") + 1  # the line it stops in, if it stops inside one
    if whole != held:
        cut.append(
            CutTail(
                path,
                line,
                None,
                f"the gzip stream ends early, in the middle of line {line}: read up to the line before it",
            )
        )
    else:
        cut.append(CutTail(path, None, None, f"the gzip stream ends early, after line {line - 1}: read up to there"))
    return whole


_TOO_DEEP = "not valid JSON (nested too deeply)"  # (the trace loader's words)


@attrs.frozen
class Return:
    """One piece of context that comes back after a generation: a tool result, a user (simulator) message, an
    environment observation."""

    tool: str
    tokens: int
    status: str = "ok"


@attrs.frozen
class Segment:
    """One generation and the returns that follow it before the next generation."""

    gen_tokens: int
    returns: tuple[Return, ...] = ()


def build_trajectory(
    *,
    prompt_id: str,
    prompt_tokens: int,
    segments: Sequence[Segment],
    path: Path,
    line: int | None,
    reward: float | None = None,
    sample: int | None = None,
    step: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Trajectory:
    """A trajectory from its segments: one turn per generation; the returns after it are its tool return (tool =
    the first return's tool, status = the worst status, tokens summed; with several, the tools are kept in the
    turn's `extra["tools"]`). A trajectory without any generation is an error, and so is one that breaks a rule of
    the trace schema (`Trajectory` checks them: a log too long for a trace, say), named in the log read."""
    if not segments:
        raise TraceError(path, line, None, "trajectory has no model generation")
    extra = _finite_json(dict(extra or {}))
    if reward is not None and not _finite(reward):  # a failed reward (Python writes NaN): JSON has no NaN
        extra["reward_not_finite"] = _NON_FINITE.get(str(reward), str(reward))
        reward = None
    try:
        return Trajectory(
            prompt_id=prompt_id,
            prompt_tokens=prompt_tokens,
            turns=_merged([_turn(seg) for seg in segments]),
            sample=sample,
            step=step,
            reward=reward,
            extra=extra,
        )
    except TraceValueError as exc:
        raise TraceError(path, line, exc.field, exc.message) from None


def _turn(seg: Segment) -> Turn:
    if not seg.returns:
        return Turn(gen_tokens=seg.gen_tokens)
    statuses = {r.status for r in seg.returns}
    status = "timeout" if "timeout" in statuses else "error" if "error" in statuses else "ok"
    return Turn(
        gen_tokens=seg.gen_tokens,
        tool=seg.returns[0].tool,
        tool_status=status,
        tool_tokens=sum(r.tokens for r in seg.returns),
        extra={"tools": [r.tool for r in seg.returns]} if len(seg.returns) > 1 else {},
    )


def _merged(turns: list[Turn]) -> tuple[Turn, ...]:
    """Only the last turn may have no tool: a generation followed directly by another (no return between them,
    e.g. an assistant message split in two) is folded into the next one."""
    merged: list[Turn] = []
    carry = 0
    for i, t in enumerate(turns):
        if t.tool is None and i < len(turns) - 1:
            carry += t.gen_tokens
            continue
        merged.append(attrs.evolve(t, gen_tokens=t.gen_tokens + carry) if carry else t)
        carry = 0
    return tuple(merged)


def _finite(value: float) -> bool:
    """A finite number that a float holds (an integer past a float's range is not one)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _finite_json(value: Any) -> Any:
    """`value` with every NaN or infinite float (Python's json reads and writes them; JSON and the trace loader do
    not) written as the string Python's json would have written, so that an imported trace loads again."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[str(value)]
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """A value as the text a model read or wrote: a string as it is, anything else as JSON (tool-call arguments,
    structured tool results)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def text_of(content: Any) -> str:
    """The text of a message's content: a string, a list of parts (`{"type": "text", "text": ...}`, OpenAI's
    `{"type": "refusal", "refusal": ...}`, or strings), or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                value = part.get("text", part.get("content", part.get("refusal")))  # (an assistant's refusal part)
                if isinstance(value, str):
                    parts.append(value)
                elif value is not None:
                    parts.append(text_of(value))
        return "\n".join(parts)
    if isinstance(content, dict):
        return text_of(content.get("text", content.get("content")))
    return str(content)


def warn_skipped(path: Path, skipped: list[str], what: str) -> None:
    """One warning for a file's skipped records (`what`: what they were), the first five named, on the importers'
    logger (`libra trace import` prints it on stderr)."""
    if skipped:
        shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        logging.getLogger("libra.workloads.importers").warning(f"{path}: skipped {len(skipped)} {what}: {shown}")
