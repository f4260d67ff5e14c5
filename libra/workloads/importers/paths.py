"""The files that `trace import` reads: each path given as it is, each directory as the log files under it.

Agent harnesses write one file per run into a tree (SWE-agent `RUN/ID/ID.traj`, mini-swe-agent
`RUN/ID/ID.traj.json`, Moatless `RUN/trajs/ID/trajectory.json`), often beside files that are not runs (predictions,
reports, configurations). A directory therefore stands for the files under it, at any depth, whose names match the
format's patterns (`DEFAULT_GLOBS`) or the ones given, sorted by their paths folder by folder (a fixed order, so
that a replay of the directory is the same on every machine); names that start with a dot (`.git`, editors' files) are
left out, and symbolic links to directories are not followed (no cycles).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatchcase
from os import PathLike
from pathlib import Path

from libra.workloads.trace import TraceError

_JSON = ("*.json", "*.jsonl", "*.json.gz", "*.jsonl.gz")
DEFAULT_GLOBS: dict[str, tuple[str, ...]] = {
    "openai": (*_JSON, "*.parquet", "*.eval"),
    "swe-agent": ("*.traj",),
    "mini-swe-agent": ("*.traj.json",),
    "verl": (*_JSON, "*.parquet"),
    "atif": _JSON,
}


def expand_paths(fmt: str, paths: Sequence[str | PathLike[str]], globs: Sequence[str] = ()) -> list[Path]:
    """`paths` with every directory replaced by its matching files (`globs`, else the format's defaults; a pattern
    matches a file's name, not its path). A directory with none of them is an error naming it and the patterns."""
    check_globs(globs)
    patterns = tuple(globs) or DEFAULT_GLOBS[fmt]
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            out.append(path)  # a file, or a missing path the importer names
            continue
        found = _files_under(path, patterns)
        if not found:
            raise TraceError(path, None, None, f"no file under this directory matches {' '.join(patterns)}")
        out.extend(found)
    return out


def check_globs(globs: Sequence[str]) -> None:
    """ValueError naming the first pattern that cannot match a file's name (not a string, empty, or holding a
    '/': patterns match names, not paths)."""
    if isinstance(globs, str):
        raise ValueError(f"globs must be a list of file-name patterns, got {globs!r}")
    bad = next((g for g in globs if not isinstance(g, str) or not g or "/" in g), None)
    if bad is not None:
        raise ValueError(f"--glob {bad!r}: a pattern matches a file's name, so it cannot be empty or hold a '/'")


def _files_under(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    found: list[tuple[tuple[str, ...], Path]] = []
    for folder, dirs, files in os.walk(root, onerror=_raise):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and any(fnmatchcase(name, pat) for pat in patterns):
                path = Path(folder, name)
                found.append((path.relative_to(root).parts, path))
    return [path for _, path in sorted(found)]


def _raise(exc: OSError) -> None:
    raise TraceError(exc.filename or "?", None, None, f"cannot list this directory ({exc.strerror or exc})")
