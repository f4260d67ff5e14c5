"""The old-against-new harness the `*_compare.py` benchmarks share: git revisions exported to temporary trees (a path
to a source tree is used as it is), one measuring script run per tree and round in a fresh process, the best CPU
time of each and whether its result is identical to the first's.

Each process runs from inside its own tree with only that tree on PYTHONPATH (pytest's `pythonpath = ["."]`, or
`python -c` started in a worktree, would import the worktree's code whatever PYTHONPATH says), and the script
reports `libra.__file__`, which must lie in that tree. The script gets its arguments, then the path of a JSON file
to write: {"cpu": seconds, "file": libra.__file__, <result>: anything comparable}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


class RevisionError(Exception):
    """A revision that could not be exported, or a tree whose process imported another tree's code."""


def export_tree(rev: str, tmp: Path) -> Path:
    """The source tree of `rev`: a directory as it is, else `git archive rev` unpacked under `tmp`."""
    if Path(rev).is_dir():
        return Path(rev).resolve()
    dest = tmp / rev.replace("/", "_").replace("~", "-")
    dest.mkdir()
    try:
        archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        raise RevisionError(f"git archive failed: {e.stderr.decode().strip()}") from None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_in_tree(script: str, args: Sequence[str], tree: Path, out: Path) -> dict:
    """Run `python -c script *args out` inside `tree` with only it importable; the JSON it wrote."""
    cmd = [sys.executable, "-c", script, *args, str(out)]
    subprocess.run(cmd, cwd=tree, env={"PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}, check=True)
    got = json.loads(out.read_text())
    if not got["file"].startswith(str(tree)):
        raise RevisionError(f"the process for {tree} imported {got['file']}")
    return got


def compare(
    revs: Sequence[str],
    script: str,
    args: Sequence[str],
    *,
    rounds: int,
    result: str,
    scale: float = 1.0,
    unit: str = "s",
) -> int:
    """Run `script` for each of `revs` in turn, `rounds` times; print each run's CPU time (times `scale`, in
    `unit`) with the load average, then per revision the best, the ratio baseline / this and whether its `result`
    equals the baseline's (the first revision). Returns the exit status: 2 when a revision could not be run."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            trees = [export_tree(r, tmp) for r in revs]
            cpu: dict[int, list[float]] = {i: [] for i in range(len(trees))}
            results: dict[int, object] = {}
            for r in range(rounds):
                for i, tree in enumerate(trees):
                    got = run_in_tree(script, args, tree, tmp / f"out{i}.json")
                    cpu[i].append(got["cpu"])
                    results[i] = got[result]
                    load = os.getloadavg()[0]
                    print(f"round {r}: {revs[i]} {got['cpu'] * scale:.2f} {unit} CPU (load {load:.1f})", flush=True)
        except RevisionError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    base = min(cpu[0])
    for i, rev in enumerate(revs):
        same = "baseline" if i == 0 else ("identical" if results[i] == results[0] else "DIFFERENT")
        best = min(cpu[i])
        print(f"{rev}: best {best * scale:.2f} {unit} CPU, baseline / this {base / best:.3f}, {result} {same}")
    return 0


def import_renamed(tree: Path, into: Path, name: str = "libra_old"):
    """Import the `libra` package of `tree` as `name` next to this process's `libra` (a copy under `into` with its
    imports rewritten), for old-against-new measurements interleaved call by call in one process."""
    import importlib
    import re
    import shutil

    dst = into / name
    shutil.copytree(tree / "libra", dst)
    pattern = re.compile(r"\b(from|import) libra\b")
    for path in dst.rglob("*.py"):
        text = path.read_text()
        path.write_text(pattern.sub(rf"\1 {name}", text).replace('"libra.', f'"{name}.'))
    sys.path.insert(0, str(into))
    return importlib.import_module(name)
