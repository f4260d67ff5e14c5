"""Run test functions in spawned processes (fresh interpreters) and collect their JSON results.

Each child uses one intra-op thread, so that replicas computing the same thing produce the same bits. Children
import the target's module by name, which works because they inherit the parent's `sys.path` (pytest puts each
test folder on it).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def _entry(fn: Callable, args: tuple, out: str) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        result = fn(*args)
        Path(out).write_text(json.dumps({"ok": True, "result": result}))
    except BaseException:
        Path(out).write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
        raise


def run_processes(targets: list[tuple[Callable, tuple]], *, tmp: Path, timeout_s: float) -> list:
    """Start one spawned process per (fn, args), wait up to `timeout_s` in all, kill leftovers, and return their
    results in order. A process that fails, hangs or leaves no result makes this raise with what it left."""
    ctx = mp.get_context("spawn")
    outs = [str(tmp / f"proc{i}.json") for i in range(len(targets))]
    procs = [ctx.Process(target=_entry, args=(fn, args, out), daemon=False) for (fn, args), out in zip(targets, outs)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.0))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    results, errors = [], []
    for i, (p, out) in enumerate(zip(procs, outs)):
        if not Path(out).exists():
            errors.append(f"process {i} left no result (exit code {p.exitcode}; killed after {timeout_s}s?)")
            continue
        try:
            data = json.loads(Path(out).read_text())
        except ValueError:
            errors.append(f"process {i} left a partial result (exit code {p.exitcode}; killed after {timeout_s}s?)")
            continue
        if not data["ok"]:
            errors.append(f"process {i} failed:\n{data['error']}")
            continue
        results.append(data["result"])
    if errors:
        raise AssertionError("\n".join(errors))
    return results
