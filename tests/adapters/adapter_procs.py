"""Multi-process helpers of the trainer tests: spawn workers, collect JSON results, seeded toy data.

Children are spawned (fresh interpreters), import this module by name and use one intra-op thread each, so that
replicas computing the same thing produce the same bits.
"""

from __future__ import annotations

import os

from spawned import run_processes  # noqa: F401  (re-exported: the tests call it from here)

from libra.elastic.wire import free_port  # noqa: F401  (re-exported)

GLOBAL_BATCH = 12
IN, HIDDEN, OUT = 4, 8, 2
LR = 1e-2


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
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        DS_ACCELERATOR="cpu",
        DS_BUILD_OPS="0",
    )
