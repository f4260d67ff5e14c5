"""The corpus's own sums: every committed trace (data/corpus/ and data/corpus/held-out/) against the `trace_sha256`
and `trace_bytes` its manifest entry records (scripts/build_corpus.py writes them when it builds a source). The
upstream `files[].sha256` sums are of the source repositories' files and say nothing of the committed traces."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from libra.workloads.trace import TraceError, load_trace
from tests.scripts import SCRIPTS

SCRIPT = SCRIPTS / "build_corpus.py"


@pytest.fixture
def corpus_copy(tmp_path) -> Path:
    """A copy of data/corpus to damage (never the committed files)."""
    return Path(shutil.copytree(DEFAULT_CORPUS, tmp_path / "corpus"))


def test_every_committed_trace_matches_its_manifest(build_corpus) -> None:
    """Both manifests record a trace sum for every source, and every committed trace has those bytes."""
    for root in (DEFAULT_CORPUS, DEFAULT_CORPUS / "held-out"):
        sources = load_manifest(root)["sources"]
        assert sources and all(len(s["trace_sha256"]) == 64 and s["trace_bytes"] > 0 for s in sources)
    assert build_corpus.check_traces(DEFAULT_CORPUS) == []


@pytest.mark.parametrize("where", ["", "held-out"], ids=["gated", "held-out"])
@pytest.mark.parametrize("at", ["header", "middle", "last"])
def test_one_changed_byte_in_a_trace_is_found(build_corpus, corpus_copy, where, at) -> None:
    """One byte changed anywhere in one trace is one problem naming that file, and `load_corpus` refuses it. A
    changed byte of the gzip header (its time stamp) still reads as the same trajectories: only the sum finds it."""
    folder = corpus_copy / where
    src = load_manifest(folder)["sources"][-1]
    path = folder / src["file"]
    data = bytearray(path.read_bytes())
    i = {"header": 4, "middle": len(data) // 2, "last": len(data) - 1}[at]
    data[i] ^= 0x01
    path.write_bytes(bytes(data))
    (problem,) = build_corpus.check_traces(corpus_copy)
    assert str(path) in problem and f"the manifest says {src['trace_bytes']:,} bytes" in problem
    if at == "header":
        assert len(load_trace(path)) == src["trajectories"]
    with pytest.raises(TraceError, match="trace_sha256: the file was changed$"):
        load_corpus(folder)


def test_a_missing_trace_or_sum_is_found(build_corpus, corpus_copy) -> None:
    manifest = load_manifest(corpus_copy)
    first, second = manifest["sources"][:2]
    (corpus_copy / first["file"]).unlink()
    del second["trace_sha256"]
    (corpus_copy / "MANIFEST.json").write_text(json.dumps(manifest))
    problems = build_corpus.check_traces(corpus_copy)
    assert len(problems) == 2
    assert f"{first['file']}: missing" in problems[0]
    assert f"source {second['name']!r} records no trace_sha256" in problems[1]


def test_check_command_exits_non_zero_on_a_changed_trace(corpus_copy) -> None:
    def check():
        cmd = [sys.executable, str(SCRIPT), "--check", "--out", str(corpus_copy)]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    ok = check()
    assert ok.returncode == 0 and "matches its manifest" in ok.stderr
    path = corpus_copy / load_manifest(corpus_copy)["sources"][0]["file"]
    path.write_bytes(path.read_bytes() + b"\0")
    bad = check()
    assert bad.returncode == 1 and str(path) in bad.stderr


def test_the_same_trajectories_give_the_same_bytes(build_corpus, tmp_path) -> None:
    """The trace's gzip header holds no file name and no time: a rebuild of the same trajectories reproduces the
    committed sum, whatever the file is called and whenever it is written."""
    trajs = load_corpus()["swe-agent-demos"]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "other-name.jsonl.gz"
    build_corpus._write_trace(a, trajs)
    header = bytearray(a.read_bytes()[:10])
    build_corpus._write_trace(b, trajs)
    assert a.read_bytes() == b.read_bytes() and header[4:8] == b"\0\0\0\0" and not header[3] & 0x08  # no FNAME
    assert [json.loads(line) for line in gzip.decompress(a.read_bytes()).splitlines()] == [t.to_json() for t in trajs]


def _git(repo: Path, *args: str) -> None:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    subprocess.run(cmd, check=True, capture_output=True)


def test_build_records_the_sums_of_the_trace_it_writes(build_corpus, tmp_path, monkeypatch) -> None:
    """A source built from a repository snapshot: its manifest entry keeps the upstream file's sha256 under
    `files` and the written trace's sums beside `file`, and the check passes on what was written."""
    repo = tmp_path / "mirrors" / "someone+agent-logs" / "repo"
    repo.mkdir(parents=True)
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "function": {"name": "calc", "arguments": "2+2"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    (repo / "runs.jsonl").write_text(json.dumps({"id": "q1", "messages": messages}) + "\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "runs.jsonl")
    _git(repo, "commit", "-q", "-m", "runs")
    src = {"name": "tiny", "repo": "someone/agent-logs", "commit": None, "licence": "MIT", "globs": ["*.jsonl"]}
    monkeypatch.setattr(build_corpus, "SOURCES", [{**src, "format": "openai", "held_out": True}])
    out = tmp_path / "out"
    build_corpus.build(tmp_path / "mirrors", out)
    (entry,) = load_manifest(out / "held-out")["sources"]
    assert entry["trace_sha256"] != entry["files"][0]["sha256"]
    assert entry["files"][0]["sha256"] == build_corpus.hashlib.sha256((repo / "runs.jsonl").read_bytes()).hexdigest()
    assert build_corpus.trace_sums(out / "held-out" / "tiny.jsonl.gz") == {
        "trace_sha256": entry["trace_sha256"],
        "trace_bytes": entry["trace_bytes"],
    }
    assert build_corpus.check_traces(out) == []
