"""The corpus of real agent trajectories (data/corpus/, built by scripts/build_corpus.py): one gzipped trace per
source, and MANIFEST.json with each source's provenance (repository, commit, path, licence, sha256)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from libra.workloads.trace import TraceError, Trajectory, parse_line

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"


def load_trace_any(path: str | Path) -> list[Trajectory]:
    """A trace file, plain or gzipped (`.gz`); an empty one is an error."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            out = [parse_line(line, path, n) for n, line in enumerate(fh, start=1) if line.strip()]
    except OSError as exc:
        raise TraceError(path, None, None, f"cannot read trace: {exc}") from None
    except UnicodeDecodeError:
        raise TraceError(path, None, None, "not UTF-8") from None
    if not out:
        raise TraceError(path, None, None, "trace holds no trajectories")
    return out


def load_manifest(root: str | Path = DEFAULT_CORPUS) -> dict:
    return json.loads((Path(root) / "MANIFEST.json").read_text())


def load_corpus(root: str | Path = DEFAULT_CORPUS) -> dict[str, list[Trajectory]]:
    """Source name -> its trajectories, in the manifest's order."""
    root = Path(root)
    return {src["name"]: load_trace_any(root / src["file"]) for src in load_manifest(root)["sources"]}
