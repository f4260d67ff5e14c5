"""Rebuild the corpus of real agent trajectories (data/corpus/) from public repositories.

    python scripts/build_corpus.py --mirrors DIR [--out data/corpus] [--only SOURCE]...
    python scripts/build_corpus.py --check [--out data/corpus]

DIR holds bare git snapshots of the sources' repositories as DIR/<owner>+<name>/repo (what the project's fetch tool
brings; a `git clone --bare` works the same). For each source the files are read at the pinned commit, their
sha256 recorded, imported with `libra.workloads.importers` (o200k_base token counts) and written, deduplicated, to
OUT/<source>.jsonl.gz; OUT/MANIFEST.json keeps the provenance (repository, commit, path, licence, and the upstream
sha256 per file read), the counts, and the sums of the trace written (`trace_sha256`, `trace_bytes`), which
`--check` compares with the committed traces. Nothing of the original text is kept: only token counts, tool names
and statuses. Sources marked `held_out` (never used to choose or tune anything) go to OUT/held-out/ with a manifest
of their own. A source may convert its files first (`convert`: ToRA outputs, ReAct transcripts, text tool calls,
a notebook's printed episodes, InterCode's logs, Moatless trajectories), with other files of the repository read at
the same commit (`context`: prompts, templates), and add error patterns of its tools (`error_patterns`). A file the
snapshot lacks (a snapshot may keep no file of 4 MiB or more) and a file the source's converter refuses are skipped
and listed in the source's manifest entry (`absent`, `skipped` with the reason). The sources are listed in
scripts/corpus_sources.py (what each entry's keys mean), their converters in scripts/corpus_convert.py and
scripts/corpus_intercode.py; this script reads, converts, imports, writes and checks.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def _sibling(name: str) -> ModuleType:
    """scripts/NAME.py (the sources' table, or a module of converters), loaded by path (scripts/ is no package, and
    the tests load this script by path too)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


intercode = _sibling("corpus_intercode")  # InterCode's converters (its runs' templates restated)
convert = _sibling("corpus_convert")  # the other sources' converters
SOURCES: list[dict[str, Any]] = _sibling("corpus_sources").SOURCES  # what to read, where, and how

# a converter takes the file's bytes (and, for a source with `context`, those files' bytes by path)
CONVERTERS: dict[str, Callable[..., bytes]] = {**convert.CONVERTERS, **intercode.CONVERTERS}


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def _files(repo: Path, commit: str | None, globs: list[str]) -> list[tuple[str, str, str]]:
    """(commit, path, blob) of the files matching `globs`, at `commit` or over all commits (first seen)."""
    commits = [commit] if commit else _git(repo, "rev-list", "--all", "--reverse").decode().split()
    seen: dict[str, tuple[str, str, str]] = {}
    for c in commits:
        for row in _git(repo, "ls-tree", "-r", c).decode().splitlines():
            meta, path = row.split("\t", 1)
            blob = meta.split()[2]
            if any(fnmatch.fnmatch(path, g) for g in globs) and blob not in seen:
                seen[blob] = (c, path, blob)
    return list(seen.values())


CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the default --out, wherever it is run from
HELD_OUT = "held-out"
HELD_OUT_NOTE = (
    "Held-out sources: never used to choose or tune anything; the tests that gate the default router read "
    "OUT/MANIFEST.json only (docs/corpus.md)."
)

SUMS_NOTE = (
    "Two kinds of sum: files[].sha256 is the upstream file as read from the source repository at files[].commit "
    "(provenance); trace_sha256 and trace_bytes are the committed trace `file` in this folder (integrity: "
    "scripts/build_corpus.py --check)."
)


def _write_trace(target: Path, trajectories: list) -> None:
    """The trajectories as gzipped JSON Lines; the gzip header holds no name and no time, so that the same
    trajectories give the same bytes (and the same `trace_sha256`) on every rebuild."""
    with target.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        for t in trajectories:
            gz.write((json.dumps(t.to_json(), separators=(",", ":")) + "\n").encode())


def trace_sums(path: Path) -> dict[str, str | int]:
    """The committed trace's own sums, as a manifest entry records them: `trace_sha256` and `trace_bytes`."""
    data = path.read_bytes()
    return {"trace_sha256": hashlib.sha256(data).hexdigest(), "trace_bytes": len(data)}


def check_traces(root: Path) -> list[str]:
    """One line per committed trace of ROOT (and of ROOT/held-out/) whose bytes are not those its manifest entry
    records (`trace_sha256`, `trace_bytes`), or that is missing, or whose entry records no sums; empty when all
    match."""
    problems = []
    for d in (root, root / HELD_OUT):
        manifest = d / "MANIFEST.json"
        if not manifest.exists():
            continue
        for src in json.loads(manifest.read_text(encoding="utf-8"))["sources"]:
            path = d / src["file"]
            want = {k: src.get(k) for k in ("trace_sha256", "trace_bytes")}
            if None in want.values():
                problems.append(f"{manifest}: source {src['name']!r} records no trace_sha256 / trace_bytes")
            elif not path.is_file():
                problems.append(f"{path}: missing (the manifest lists it for {src['name']!r})")
            elif (got := trace_sums(path)) != want:
                problems.append(
                    f"{path}: {got['trace_bytes']:,} bytes, sha256 {got['trace_sha256']}; the manifest says "
                    f"{want['trace_bytes']:,} bytes, sha256 {want['trace_sha256']}"
                )
    return problems


def build(mirrors: Path, out: Path, only: list[str] | None = None) -> dict:
    """Rebuild every source (or only the named ones, keeping the others' files and manifest entries). Sources
    marked `held_out` go to OUT/held-out/ with a manifest of their own; the others to OUT/. Returns the manifest
    of OUT/."""
    from libra.workloads.importers import DEFAULT_ERROR_PATTERNS, StatusRules, import_files

    dirs = {False: out, True: out / HELD_OUT}
    old = {}
    for d in dirs.values():
        if only and (d / "MANIFEST.json").exists():
            old.update({s["name"]: s for s in json.loads((d / "MANIFEST.json").read_text())["sources"]})
    unknown = set(only or ()) - {s["name"] for s in SOURCES}
    if unknown:
        raise SystemExit(f"unknown source(s): {', '.join(sorted(unknown))}")
    missing = {s["repo"] for s in SOURCES if not only or s["name"] in only} - {
        s["repo"] for s in SOURCES if (mirrors / s["repo"].replace("/", "+") / "repo").is_dir()
    }
    if missing:
        raise SystemExit(f"no mirror of {', '.join(sorted(missing))} in {mirrors} (expected DIR/<owner>+<name>/repo)")
    manifests: dict[bool, dict] = {
        False: {"tokenizer": "o200k_base", "sums": SUMS_NOTE, "sources": []},
        True: {"tokenizer": "o200k_base", "note": HELD_OUT_NOTE, "sums": SUMS_NOTE, "sources": []},
    }
    for src in SOURCES:
        held = bool(src.get("held_out"))
        if only and src["name"] not in only:
            if src["name"] in old:
                manifests[held]["sources"].append(old[src["name"]])
            continue
        repo = mirrors / src["repo"].replace("/", "+") / "repo"
        files = _files(repo, src["commit"], src["globs"])
        rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, *src.get("error_patterns", ())))
        entries, trajectories, seen = [], [], set()
        absent: list[dict] = []
        skipped: list[dict] = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, (commit, path, blob) in enumerate(files):
                if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", blob], capture_output=True).returncode:
                    # a snapshot may lack its largest files (the fetch tool keeps none of 4 MiB or more): say which
                    print(f"skip {src['repo']}:{path}: absent from the snapshot", file=sys.stderr)
                    absent.append({"path": path, "commit": commit, "blob": blob})
                    continue
                data = _git(repo, "cat-file", "-p", blob)
                local = Path(tmp) / f"{i:04d}" / Path(path).name  # its own name: an importer may name the task by it
                local.parent.mkdir()
                try:
                    if "context" in src:  # files the converter needs besides the data, read at the same commit
                        context = {c: _git(repo, "show", f"{commit}:{c}") for c in src["context"]}
                        local.write_bytes(CONVERTERS[src["convert"]](data, context))
                    else:
                        local.write_bytes(CONVERTERS[src["convert"]](data) if "convert" in src else data)
                    got = import_files(src["format"], [local], source=src["name"], rules=rules)
                except Exception as exc:  # a file that is not a trajectory file (e.g. a summary): skip, say so
                    print(f"skip {src['repo']}:{path}: {exc}", file=sys.stderr)
                    if "convert" in src:  # a file the source's own converter refused: listed, with the reason
                        digest = hashlib.sha256(data).hexdigest()
                        skipped.append({"path": path, "commit": commit, "sha256": digest, "reason": str(exc)})
                    continue
                kept = 0
                for t in got:
                    key = hashlib.sha256(json.dumps([t.prompt_id, t.prompt_tokens, t.to_json()["turns"]]).encode())
                    if key.hexdigest() in seen:
                        continue
                    seen.add(key.hexdigest())
                    t.extra["origin"] = {"path": path, "commit": commit}
                    trajectories.append(t)
                    kept += 1
                entries.append(
                    {"path": path, "commit": commit, "sha256": hashlib.sha256(data).hexdigest(), "trajectories": kept}
                )
        dirs[held].mkdir(parents=True, exist_ok=True)
        target = dirs[held] / f"{src['name']}.jsonl.gz"
        _write_trace(target, trajectories)
        info = {k: v for k, v in src.items() if k not in ("globs",)}
        info.update(file=target.name, **trace_sums(target), trajectories=len(trajectories), files=entries)
        info.update({k: v for k, v in (("absent", absent), ("skipped", skipped)) if v})  # only where there are any
        manifests[held]["sources"].append(info)
        print(f"{src['name']}: {len(trajectories)} trajectories from {len(entries)} files", file=sys.stderr)
    for held, manifest in manifests.items():
        if manifest["sources"] or (dirs[held] / "MANIFEST.json").exists():
            dirs[held].mkdir(parents=True, exist_ok=True)
            (dirs[held] / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifests[False]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirrors", type=Path, metavar="DIR", help="bare git snapshots, DIR/<owner>+<name>/repo")
    p.add_argument("--out", default=CORPUS, type=Path, help="corpus folder (default: the repository's data/corpus)")
    p.add_argument("--only", action="append", default=None, help="rebuild only this source (repeatable)")
    p.add_argument("--check", action="store_true", help="check the traces of --out against their manifests; no build")
    args = p.parse_args()
    if args.check:
        problems = check_traces(args.out)
        print("\n".join(problems) or f"every trace in {args.out} matches its manifest", file=sys.stderr)
        return 1 if problems else 0
    if args.mirrors is None:
        p.error("--mirrors DIR is required to build (or pass --check)")
    build(args.mirrors, args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
