"""The corpus of real agent trajectories (data/corpus/, built by scripts/build_corpus.py): one gzipped trace per
source, and MANIFEST.json with each source's provenance (repository, commit, path, licence, sha256).

The sha256 sums are those of the files read from the source repositories, not of the corpus's own traces: a trace
that no longer holds what the manifest says is found by the loader (a broken stream or line) or by its count of
trajectories (`load_corpus`), not by a checksum. Every problem is one `TraceError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from libra.workloads.trace import TraceError, Trajectory, load_trace

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"


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


def load_corpus(root: str | Path = DEFAULT_CORPUS) -> dict[str, list[Trajectory]]:
    """Source name -> its trajectories, in the manifest's order; a trace holding another number of trajectories
    than the manifest states (a truncated or replaced file) is an error."""
    root = Path(root)
    out: dict[str, list[Trajectory]] = {}
    for src in load_manifest(root)["sources"]:
        path = root / src["file"]
        trajectories = load_trace(path)
        expected = src.get("trajectories")
        if expected is not None and len(trajectories) != expected:
            raise TraceError(
                path, None, None, f"holds {len(trajectories):,} trajectories; the manifest says {expected:,}"
            )
        out[src["name"]] = trajectories
    return out
