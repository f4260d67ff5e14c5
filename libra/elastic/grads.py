"""Shared values and gradient helpers of the side channel: step assignments, batch shards, flat buckets.

Gradient order everywhere is ``[p.grad for p in model.parameters() if p.requires_grad]``; a flat bucket is their
concatenation (one dtype).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import attrs
import torch

from libra.spec import checks


class Mode(StrEnum):
    """What a hybrid replica does in one step: ``ACTIVE`` sends a real gradient, ``PLACEHOLDER`` sends none (the
    core treats it as exact zeros that are not counted) and still steps with the reduced gradient."""

    ACTIVE = "active"
    PLACEHOLDER = "placeholder"


@attrs.frozen(kw_only=True)
class StepAssignment:
    """Membership of one step, agreed by the core before any replica computes: this replica's index among the
    ``num_replicas`` that contribute real gradients, and its mode. Placeholders get ``replica_index == -1``."""

    step: int
    mode: Mode
    replica_index: int
    num_replicas: int

    def shard(self, global_batch: int) -> slice:
        """This replica's part of a fixed global batch (see :func:`shard_bounds`); empty for a placeholder."""
        if self.mode == Mode.PLACEHOLDER:
            return slice(0, 0)
        return slice(*shard_bounds(global_batch, self.replica_index, self.num_replicas))


def shard_bounds(global_batch: int, index: int, num_replicas: int) -> tuple[int, int]:
    """[start, stop) of replica ``index`` when ``global_batch`` samples are split over ``num_replicas``.

    Shards differ by at most one sample; the global batch never changes with membership (more replicas, fewer
    samples each). The mean over replicas equals the global mean exactly when ``num_replicas`` divides the batch.
    """
    if not 0 <= index < num_replicas:
        raise ValueError(f"replica index {index} not in [0, {num_replicas})")
    if global_batch < num_replicas:
        raise ValueError(f"global batch {global_batch} is smaller than num_replicas {num_replicas}")
    base, extra = divmod(global_batch, num_replicas)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def check_whole(name: str, value: Any, *, least: int) -> int:
    """``value`` as an int when it is a whole number (not a bool) of at least ``least``; else one ValueError that
    names the argument and the value (the side channel's arguments are checked where they are given)."""
    if not (checks.is_whole(value) and value >= least):
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return int(value)


def check_seconds(name: str, value: object) -> float:
    """``value`` as a float when it is a finite number of seconds > 0 (a wait bound); else one ValueError."""
    seconds = checks.as_float(value)  # NaN for a bool, a string or an integer too large for a float
    if not 0 < seconds < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return seconds


BACKENDS = ("auto", "native", "python")


def check_backend(backend: object) -> str:
    """A backend name of :mod:`libra.elastic.pack`, checked where it is given rather than at the first pack (on the
    core that is a joiner's snapshot, on a background thread: a typo would fail every join, not the caller)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return str(backend)


def check_gradients(step: int, grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> None:
    """``grads`` must be tensors holding as many values as ``params`` (the trainable parameters): checked by
    ``reduce`` on either end before the step is used up, so the caller can reduce the right gradients then."""
    missing = [i for i, g in enumerate(grads) if not isinstance(g, torch.Tensor)]
    if missing:
        raise ValueError(
            f"reduce({step}): gradient {missing[0]} is {grads[missing[0]]!r}, not a tensor (in a placeholder step "
            "too: bind zeros as p.grad)"
        )
    size, expected = sum(g.numel() for g in grads), sum(p.numel() for p in params)
    if size != expected:
        raise ValueError(
            f"reduce({step}): {len(grads)} gradients of {size:,} values, but the model's trainable parameters "
            f"hold {expected:,} (give [p.grad for p in model.parameters() if p.requires_grad])"
        )


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flatten(grads: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """One contiguous 1-D copy of the gradients (a single dtype). Written into ``out`` when it is a contiguous 1-D
    tensor of their dtype and total size (and returned), else into new memory: a caller that flattens every step
    passes the last step's result, because new memory of this size is mapped afresh on each allocation and costs
    a page fault per 4 KiB on first touch (400 MB: 0.19 s against 0.035 s for the copy itself, one thread here)."""
    dtypes = {g.dtype for g in grads}
    if len(dtypes) > 1:
        raise ValueError(f"gradients mix dtypes {sorted(map(str, dtypes))}; exchange one bucket per dtype")
    if not grads:
        return torch.empty(0)
    parts = [g.detach().reshape(-1) for g in grads]
    if (
        out is not None
        and out.dim() == 1
        and out.is_contiguous()
        and out.dtype == parts[0].dtype
        and out.device == parts[0].device
        and out.numel() == sum(p.numel() for p in parts)
    ):
        return torch.cat(parts, out=out)
    return torch.cat(parts)


def _fits(out: torch.Tensor | None, like: torch.Tensor, device: torch.device) -> bool:
    return (
        out is not None
        and out.shape == like.shape
        and out.dtype == like.dtype
        and out.device == device
        and out.is_contiguous()
    )


def to_host(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``t`` itself when it is in host memory (a CPU replica: nothing is copied); else a copy of it in host memory,
    written into ``out`` when ``out`` fits (pass the last call's result: page-locked memory, allocated once) and
    returned. The copy is synchronous, so what returns can be sent at once: messages carry host memory."""
    if t.device.type == "cpu":
        return t
    if not _fits(out, t, torch.device("cpu")):
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    assert out is not None
    return out.copy_(t)


def to_device_of(t: torch.Tensor, like: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``t`` on ``like``'s device: itself when it is there already, else a copy written into ``out`` when ``out``
    fits (pass the last call's result: device memory allocated once) and returned. For a gradient received in host
    memory by a replica on a GPU; the values are the same bits wherever they are added."""
    if t.device == like.device:
        return t
    if not _fits(out, t, like.device):
        out = torch.empty(t.shape, dtype=t.dtype, device=like.device)
    assert out is not None
    return out.copy_(t)


def unflatten_into(flat: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Copy a flat bucket back into the gradient tensors, in place."""
    total = sum(g.numel() for g in grads)
    if flat.numel() != total:
        raise ValueError(f"flat bucket has {flat.numel()} elements, gradients {total}")
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def set_grads(model: torch.nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """Make every trainable parameter's ``.grad`` hold its part of ``flat`` (creating zeros where absent)."""
    params = trainable(model)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    unflatten_into(flat, grads)
    return grads
