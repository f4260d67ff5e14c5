"""The corpus of real agent trajectories (data/corpus/, built by scripts/build_corpus.py): one gzipped trace per
source, and MANIFEST.json with each source's provenance (repository, commit, path, licence, sha256).

Two kinds of sum: `files[].sha256` are those of the files read from the source repositories (provenance);
`trace_sha256` and `trace_bytes` are those of the committed trace itself, which `load_corpus` checks before it
reads a line, so a trace that is not what the manifest records (one byte changed, cut, replaced) is refused. A
manifest without them (an older one, or one written by hand) is checked by the count of trajectories only. Every
problem is one `TraceError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from libra.workloads.trace import TraceError, Trajectory, load_trace

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def load_manifest(root: str | Path = DEFAULT_CORPUS) -> dict:
    """The corpus's MANIFEST.json: an object whose `sources` are objects with a `name` and a `file` (a trace in
    `root` itself) each, and the number of its `trajectories`."""
    path = Path(root) / "MANIFEST.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot read the corpus manifest: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, None, f"not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(path, exc.lineno, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    sources = manifest.get("sources") if isinstance(manifest, dict) else None
    if not isinstance(sources, list):
        raise TraceError(path, None, "sources", "the manifest must be an object with a list of sources")
    seen: set[str] = set()
    for i, src in enumerate(sources):
        _check_source(src, f"sources[{i}]", path)
        if src["name"] in seen:  # (`load_corpus` keys its answer by name: one would hide the other)
            raise TraceError(path, None, f"sources[{i}].name", f"{src['name']!r} names two sources")
        seen.add(src["name"])
    return manifest


def _check_source(src: Any, where: str, path: Path) -> None:
    if not isinstance(src, dict):
        raise TraceError(path, None, where, f"must be an object, got {type(src).__name__}")
    for key in ("name", "file"):
        if not isinstance(src.get(key), str) or not src[key]:
            raise TraceError(path, None, f"{where}.{key}", f"must be a non-empty string, got {src.get(key)!r}")
    name = src["file"]
    if name in (".", "..") or "/" in name or "\\" in name:  # a trace of the corpus, not a path out of it
        raise TraceError(path, None, f"{where}.file", f"must name a file in the corpus folder, got {name!r}")
    count = src.get("trajectories")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise TraceError(path, None, f"{where}.trajectories", f"must be an integer >= 1, got {count!r}")
    digest, size = src.get("trace_sha256"), src.get("trace_bytes")
    if digest is not None and (not isinstance(digest, str) or not _SHA256.fullmatch(digest)):
        raise TraceError(path, None, f"{where}.trace_sha256", f"must be 64 lowercase hex digits, got {digest!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise TraceError(path, None, f"{where}.trace_bytes", f"must be an integer >= 1, got {size!r}")


def load_corpus(root: str | Path = DEFAULT_CORPUS) -> dict[str, list[Trajectory]]:
    """Source name -> its trajectories, in the manifest's order; a trace whose bytes are not those the manifest
    records (`trace_sha256`, `trace_bytes`), or that holds another number of trajectories than it states (a
    truncated or replaced file), is an error."""
    root = Path(root)
    out: dict[str, list[Trajectory]] = {}
    for src in load_manifest(root)["sources"]:
        path = root / src["file"]
        _check_sums(path, src)
        trajectories = load_trace(path)
        expected = src.get("trajectories")
        if expected is not None and len(trajectories) != expected:
            raise TraceError(
                path, None, None, f"holds {len(trajectories):,} trajectories; the manifest says {expected:,}"
            )
        out[src["name"]] = trajectories
    return out


def _check_sums(path: Path, src: dict) -> None:
    """The trace's bytes against the sums its manifest entry records (none recorded: nothing to check)."""
    digest, size = src.get("trace_sha256"), src.get("trace_bytes")
    if (digest is None and size is None) or not path.is_file():
        return  # (a missing trace: the loader names it)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot open trace: {exc.strerror or exc}") from None
    if size is not None and len(data) != size:
        raise TraceError(path, None, None, f"is {len(data):,} bytes; the manifest says {size:,} (trace_bytes)")
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise TraceError(path, None, None, "its sha256 is not the manifest's trace_sha256: the file was changed")
