"""Shared pieces of the multi-process elastic tests: a tiny model, seeded batches, process start/stop, leak probes.

Every process sets one intra-op thread so that CPU kernels are deterministic and replicas computing the same
thing produce the same bits.
"""

from __future__ import annotations

import datetime
import os

from spawned import run_processes  # noqa: F401  (re-exported: the tests call it from here)

from tests.limits import scaled

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4 replicas
IN, HIDDEN, OUT = 4, 8, 2
LR = 1e-2


def make_model(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def batch(step: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn(GLOBAL_BATCH, IN, generator=g), torch.randn(GLOBAL_BATCH, OUT, generator=g)


def local_grads(model, step: int, shard: slice, seed: int = 0):
    """This replica's gradient on its shard of the global batch of ``step`` (mean over the shard)."""
    import torch

    from libra.elastic.grads import trainable

    x, y = batch(step, seed)
    for p in model.parameters():
        p.grad = None
    torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    return [p.grad for p in trainable(model)]


def zero_grads(model):
    import torch

    from libra.elastic.grads import trainable

    for p in trainable(model):
        p.grad = torch.zeros_like(p)
    return [p.grad for p in trainable(model)]


def state_bytes(model, optimizer) -> bytes:
    """Every byte of the parameters and of the optimizer state (tensors as raw bytes, the rest as repr), in a
    fixed order: two states are equal exactly when these are."""
    import torch

    out = bytearray()
    for p in model.parameters():
        out += p.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    sd = optimizer.state_dict()
    for key in sorted(sd["state"]):
        for name, value in sorted(sd["state"][key].items()):
            out += name.encode()
            if isinstance(value, torch.Tensor):
                out += value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            else:
                out += repr(value).encode()
    out += repr(sd["param_groups"]).encode()
    return bytes(out)


def flat_state(model, optimizer):
    """Parameters and optimizer state as one flat float64 vector (for tolerance comparisons)."""
    import torch

    parts = [p.detach().reshape(-1).double() for p in model.parameters()]
    for state in optimizer.state_dict()["state"].values():
        parts += [v.detach().reshape(-1).double() for k, v in sorted(state.items()) if isinstance(v, torch.Tensor)]
    return torch.cat(parts)


def init_gloo(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=scaled(60)),
    )


def count_new_groups() -> list[int]:
    """Wrap torch.distributed.new_group so that every call is counted; returns the one-element counter."""
    import torch.distributed as dist

    counter = [0]
    original = dist.new_group

    def counting(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    dist.new_group = counting
    return counter


def leak_probe() -> dict[str, int]:
    """Threads, open file descriptors (sockets included) and resident memory of this process."""
    import threading

    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "py_threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_bytes": rss_pages * os.sysconf("SC_PAGE_SIZE"),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]
