"""`libra trace import`: real agent logs to Libra traces (the trace schema of docs/trace-schema.md).

Formats: `openai` (chat-completions message lists with tool calls; tau-bench-style result files), `swe-agent`
(`.traj`), `mini-swe-agent` (`.traj.json`), `verl` (rollout exports: token ids and response masks), `atif` (the
Agent Trajectory Interchange Format of the Harbor framework: `steps` of system, user and agent). Text is
counted with a real tokenizer (`importers.tokenizer`, default o200k_base); verl records are already tokens.

`import_files(format, paths, tokenizer=..., rules=...)` returns the trajectories of all files in order (a directory
stands for the log files under it: `importers.paths`); any problem raises `TraceError` naming the file and the
line. `write_trace_atomic` writes them so that a failure leaves no file behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from os import PathLike
from pathlib import Path

from libra.workloads.importers.atif import import_atif
from libra.workloads.importers.common import (
    DEFAULT_ERROR_PATTERNS,
    DEFAULT_TIMEOUT_PATTERNS,
    BadRecord,
    CutTail,
    StatusRules,
    file_error,
    keeping_cut_tails,
    keeping_good_records,
)
from libra.workloads.importers.openai_chat import import_openai
from libra.workloads.importers.paths import DEFAULT_GLOBS, expand_paths
from libra.workloads.importers.swe_agents import import_mini_swe_agent, import_swe_agent
from libra.workloads.importers.tokenizer import DEFAULT_TOKENIZER, TokenizerError, get_counter
from libra.workloads.importers.verl_rollouts import import_verl
from libra.workloads.trace import TraceError, Trajectory, write_trace

IMPORT_FORMATS = ("openai", "swe-agent", "mini-swe-agent", "verl", "atif")
_IMPORTERS = {
    "openai": import_openai,
    "swe-agent": import_swe_agent,
    "mini-swe-agent": import_mini_swe_agent,
    "verl": import_verl,
    "atif": import_atif,
}


def import_files(
    fmt: str,
    paths: Sequence[str | Path],
    *,
    tokenizer: str = DEFAULT_TOKENIZER,
    rules: StatusRules | None = None,
    source: str | None = None,
    globs: Sequence[str] = (),
    progress: Callable[[Path], None] | None = None,
    on_error: Callable[[TraceError], None] | None = None,
    skip_records: bool = False,
) -> list[Trajectory]:
    """All trajectories of `paths` read as `fmt`, in order; a directory stands for its files that match `globs`
    (default: the format's, `DEFAULT_GLOBS`). `source`, when given, is stored in each trajectory's
    `extra["source"]`; `progress` is called with each file once it is read. A file that is not a log of the format
    raises its TraceError, or, with `on_error`, is left out whole (none of its trajectories kept) and its error
    handed to `on_error`; with `on_error` too, a JSON Lines file whose writer stopped mid-line is read up to its
    last whole line, and the line left out handed to `on_error` as a `CutTail` (common.py). With `skip_records`
    (needs `on_error`), a record of a file that holds many (a JSON Lines line, an item of a list, a sample) that is
    not a trajectory of the format is left out alone and handed to `on_error` as a `BadRecord`, the file's others
    kept; a file none of whose records is one is left out whole, as before; a session log's lines make one
    trajectory together, so a bad line there still leaves the file out. Raises TraceError (bad input, or every
    file left out), TokenizerError (tokenizer), ValueError (unknown format)."""
    _check_arguments(fmt, paths, tokenizer, rules, source)
    if skip_records and on_error is None:
        raise ValueError("skip_records needs on_error (what is told of each record left out)")
    rules = rules or StatusRules()
    files = expand_paths(fmt, paths, globs)  # (checks the globs)
    count = get_counter(tokenizer) if fmt != "verl" else len  # verl records are tokens already: no counter used
    out: list[Trajectory] = []
    left_out: list[TraceError] = []
    reading: contextlib.AbstractContextManager[list[CutTail]] = (
        keeping_cut_tails() if on_error is not None else contextlib.nullcontext([])
    )
    records: contextlib.AbstractContextManager[list[BadRecord]] = (
        keeping_good_records() if skip_records else contextlib.nullcontext([])
    )
    with reading as cut, records as bad:
        for path in files:
            before, bad_before = len(cut), len(bad)
            try:
                found = list(_IMPORTERS[fmt](path, count=count, rules=rules))
                bad[bad_before:] = sorted(bad[bad_before:], key=lambda e: e.line or 0)  # (read ahead: out of order)
                if not found and len(bad) > bad_before:  # no record of it is a trajectory: the file is bad
                    raise file_error(bad[bad_before])
            except TraceError as exc:
                if on_error is None:
                    raise
                del cut[before:], bad[bad_before:]  # the file is left out whole
                on_error(exc)
                found = []
                left_out.append(exc)
            if on_error is not None:
                for note in [*bad[bad_before:], *cut[before:]]:
                    on_error(note)
            for traj in found:
                if source is not None:
                    traj.extra["source"] = source
            out += found
            if progress is not None:
                progress(path)
    if not out:
        why = (
            f"every one of the {len(left_out)} file(s) was left out (the first: {left_out[0]})"
            if left_out
            else "no trajectories found"
        )
        raise TraceError(paths[0], None, None, why)
    return out


def _check_arguments(fmt: object, paths: object, tokenizer: object, rules: object, source: object) -> None:
    """One line naming the first odd argument (a path given as a string would be read one character at a time)."""
    if not isinstance(fmt, str) or fmt not in _IMPORTERS:
        raise ValueError(f"unknown import format {fmt!r}; expected one of {', '.join(IMPORT_FORMATS)}")
    if isinstance(paths, str | bytes | PathLike) or not isinstance(paths, Sequence):
        raise ValueError(f"paths must be a list of files, got {type(paths).__name__}: {paths!r}")
    if not paths:
        raise ValueError("no input files")
    odd = next((p for p in paths if not isinstance(p, str | PathLike)), None)
    if odd is not None:
        raise ValueError(f"paths must be file names, got {odd!r}")
    if not isinstance(tokenizer, str) or not tokenizer:
        raise ValueError(f"tokenizer must be a tokenizer's name or a tokenizer.json path, got {tokenizer!r}")
    if rules is not None and not isinstance(rules, StatusRules):
        raise ValueError(f"rules must be StatusRules or None, got {type(rules).__name__}")
    if source is not None and (not isinstance(source, str) or not source):
        raise ValueError(f"source must be a non-empty string or None, got {source!r}")


def write_trace_atomic(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """`write_trace`, which writes a trace whole or not at all (kept under this name for callers of it)."""
    return write_trace(path, trajectories)


__all__ = [
    "BadRecord",
    "CutTail",
    "DEFAULT_ERROR_PATTERNS",
    "DEFAULT_GLOBS",
    "DEFAULT_TIMEOUT_PATTERNS",
    "DEFAULT_TOKENIZER",
    "IMPORT_FORMATS",
    "StatusRules",
    "TokenizerError",
    "expand_paths",
    "get_counter",
    "import_files",
    "write_trace_atomic",
]
