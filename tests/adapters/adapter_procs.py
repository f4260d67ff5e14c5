"""Multi-process helpers of the trainer tests: spawn workers, collect JSON results, seeded toy data.

Children are spawned (fresh interpreters), import this module by name and use one intra-op thread each, so that
replicas computing the same thing produce the same bits.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path

GLOBAL_BATCH = 12
IN, HIDDEN, OUT = 4, 8, 2
LR = 1e-2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_mlp(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def data(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return {"x": torch.randn(GLOBAL_BATCH, IN, generator=g), "y": torch.randn(GLOBAL_BATCH, OUT, generator=g)}


def mse_loss(model, batch):
    import torch

    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def reference_step(state: dict, step: int, num_replicas: int) -> dict:
    """One data-parallel step of `num_replicas` replicas computed in one process: mean of the shard gradients,
    then torch Adam. `state` holds `model` and `optimizer` state dicts; returns the new state."""
    import torch

    from libra.elastic.grads import shard_bounds

    model = make_mlp(seed=123)
    model.load_state_dict(state["model"])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    if state.get("optimizer") is not None:
        opt.load_state_dict(state["optimizer"])
    batch = data(step)
    grads = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(num_replicas):
        rows = slice(*shard_bounds(GLOBAL_BATCH, i, num_replicas))
        model.zero_grad()
        mse_loss(model, {k: v[rows] for k, v in batch.items()}).backward()
        for g, p in zip(grads, model.parameters()):
            g += p.grad
    for g, p in zip(grads, model.parameters()):
        p.grad = g / num_replicas
    opt.step()
    return {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": opt.state_dict()}


def max_param_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def init_env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu", DS_BUILD_OPS="0")


def _entry(fn: Callable, args: tuple, out: str) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        Path(out).write_text(json.dumps({"ok": True, "result": fn(*args)}))
    except BaseException:
        Path(out).write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
        raise


def run_processes(targets: list[tuple[Callable, tuple]], *, tmp: Path, timeout_s: float) -> list:
    """One spawned process per (fn, args); kill leftovers after `timeout_s`; raise with any child's traceback."""
    ctx = mp.get_context("spawn")
    outs = [str(tmp / f"proc{i}.json") for i in range(len(targets))]
    procs = [ctx.Process(target=_entry, args=(fn, args, out)) for (fn, args), out in zip(targets, outs)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    results, errors = [], []
    for i, (p, out) in enumerate(zip(procs, outs)):
        if not Path(out).exists():
            errors.append(f"process {i} left no result (exit code {p.exitcode})")
            continue
        payload = json.loads(Path(out).read_text())
        if payload["ok"]:
            results.append(payload["result"])
        else:
            errors.append(f"process {i} failed:\n{payload['error']}")
    if errors:
        raise AssertionError("\n".join(errors))
    return results
