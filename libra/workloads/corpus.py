"""The corpus of real agent trajectories (data/corpus/, built by scripts/build_corpus.py): one gzipped trace per
source, and MANIFEST.json with each source's provenance (repository, commit, path, licence, sha256)."""

from __future__ import annotations

import json
from pathlib import Path

from libra.workloads.trace import Trajectory, load_trace

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"


def load_manifest(root: str | Path = DEFAULT_CORPUS) -> dict:
    return json.loads((Path(root) / "MANIFEST.json").read_text())


def load_corpus(root: str | Path = DEFAULT_CORPUS) -> dict[str, list[Trajectory]]:
    """Source name -> its trajectories, in the manifest's order."""
    root = Path(root)
    return {src["name"]: load_trace(root / src["file"]) for src in load_manifest(root)["sources"]}
