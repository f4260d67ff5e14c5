"""Versioned snapshots of model + optimizer state, packed into contiguous buckets (see :mod:`libra.elastic.pack`).

``version`` is the number of optimizer steps the state has taken. A snapshot holds the model's ``state_dict``
tensors (parameters and buffers, in order) and the optimizer's per-parameter state tensors, packed into buckets
with a checksum each (XXH3-64, see :mod:`libra.elastic.pack`), plus a JSON description (names, shapes, dtypes,
the optimizer's non-tensor state and ``param_groups``). :func:`restore` checks every checksum before it touches
the model, so a partial or corrupted snapshot is rejected, never applied. A snapshot whose buckets were
checksummed as they were written (by :func:`capture`, or by :meth:`~libra.elastic.wire.TcpLink.recv` as they
arrived) carries ``verified=True``, and :func:`restore` does not read them a second time.

:func:`state_digest` is a content hash of model + optimizer (the checksums of a packed copy): two replicas with
equal digests hold bitwise-identical state (up to hash collisions; tests also compare tensors).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from libra.elastic.pack import DEFAULT_BUCKET_BYTES, Layout, checksums, pack_checksummed, plan_layout, unpack
from libra.elastic.wire import Kind, Message

_DTYPES = {
    str(d): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


class SnapshotError(ValueError):
    """A snapshot does not fit the model/optimizer it is restored into, or failed its checksum."""


@attrs.frozen(kw_only=True)
class Snapshot:
    version: int
    description: dict = attrs.field(eq=False)
    buckets: tuple[torch.Tensor, ...] = attrs.field(eq=False)
    checksums: tuple[int, ...]
    #: The checksums were computed from these very buffers as they were written (pack or receive), so
    #: :func:`restore` need not verify them again. Constructed snapshots default to False (verified on restore).
    verified: bool = attrs.field(default=False, eq=False)

    @property
    def nbytes(self) -> int:
        return sum(int(b.numel()) for b in self.buckets)

    def to_message(self) -> Message:
        info = {"description": self.description, "checksums": list(self.checksums)}
        return Message(
            kind=Kind.SNAPSHOT,
            step=self.version,
            version=self.version,
            info=info,
            blobs=self.buckets,
            checksums=self.checksums if self.verified else None,
        )

    @classmethod
    def from_message(cls, msg: Message) -> Snapshot:
        if msg.kind != Kind.SNAPSHOT:
            raise SnapshotError(f"expected a SNAPSHOT message, got {msg.kind.name}")
        sums = tuple(msg.info["checksums"])
        return cls(
            version=msg.version,
            description=msg.info["description"],
            buckets=msg.blobs,
            checksums=sums,
            verified=msg.checksums is not None and tuple(msg.checksums) == sums,
        )


def _entry(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype)]


def _collect(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[list[torch.Tensor], dict]:
    tensors: list[torch.Tensor] = []
    model_entries = []
    for name, t in model.state_dict().items():
        model_entries.append([name, *_entry(t)])
        tensors.append(t.detach())
    opt: dict[str, Any] = {"state": [], "param_groups": None}
    if optimizer is not None:
        sd = optimizer.state_dict()
        for pid in sorted(sd["state"]):
            slot = []
            for key in sorted(sd["state"][pid]):
                value = sd["state"][pid][key]
                if isinstance(value, torch.Tensor):
                    slot.append([key, "tensor", *_entry(value)])
                    tensors.append(value.detach())
                else:
                    slot.append([key, "value", value])
            opt["state"].append([pid, slot])
        opt["param_groups"] = sd["param_groups"]
    for t in tensors:
        if t.device.type != "cpu":
            raise SnapshotError(f"snapshot of {t.device} tensors needs the CUDA path; move to CPU first")
        if str(t.dtype) not in _DTYPES:
            raise SnapshotError(f"dtype {t.dtype} is not supported; supported: {sorted(_DTYPES)}")
    return tensors, {"model": model_entries, "optimizer": opt}


def _layout(description: dict, nbytes: list[int]) -> Layout:
    return plan_layout(nbytes, bucket_bytes=description["bucket_bytes"])


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    backend: str = "auto",
) -> Snapshot:
    """Pack the current model + optimizer state (a copy: training may continue at once)."""
    tensors, description = _collect(model, optimizer)
    description["bucket_bytes"] = bucket_bytes
    layout = _layout(description, [t.numel() * t.element_size() for t in tensors])
    buckets, sums = pack_checksummed(tensors, layout, backend=backend)
    return Snapshot(
        version=version, description=description, buckets=tuple(buckets), checksums=tuple(sums), verified=True
    )


def restore(
    snapshot: Snapshot, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, backend: str = "auto"
) -> None:
    """Overwrite model (in place) and optimizer state with the snapshot, after verifying every bucket checksum."""
    if len(snapshot.buckets) != len(snapshot.checksums):
        raise SnapshotError(f"{len(snapshot.buckets)} buckets but {len(snapshot.checksums)} checksums")
    if not snapshot.verified:
        for i, (got, want) in enumerate(zip(checksums(snapshot.buckets), snapshot.checksums, strict=True)):
            if got != want:
                raise SnapshotError(f"snapshot v{snapshot.version}: bucket {i} fails its checksum")
    desc = snapshot.description
    state = model.state_dict()
    targets: list[torch.Tensor] = []
    for name, shape, dtype in desc["model"]:
        t = state.get(name)
        if t is None or list(t.shape) != shape or str(t.dtype) != dtype:
            have = None if t is None else _entry(t)
            raise SnapshotError(f"model tensor {name!r}: snapshot has {[shape, dtype]}, model has {have}")
        targets.append(t)
    opt_tensors: list[torch.Tensor] = []
    opt_state: dict[int, dict[str, Any]] = {}
    for pid, slot in desc["optimizer"]["state"]:
        entry: dict[str, Any] = {}
        for key, kind, *rest in slot:
            if kind == "tensor":
                t = torch.empty(rest[0], dtype=_DTYPES[rest[1]])
                opt_tensors.append(t)
                entry[key] = t
            else:
                entry[key] = rest[0]
        opt_state[int(pid)] = entry
    nbytes = [t.numel() * t.element_size() for t in (*targets, *opt_tensors)]
    layout = _layout(desc, nbytes)
    if layout.bucket_sizes != tuple(int(b.numel()) for b in snapshot.buckets):
        raise SnapshotError(f"bucket sizes {[int(b.numel()) for b in snapshot.buckets]} != {layout.bucket_sizes}")
    staging = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format) for t in targets]
    with torch.no_grad():
        unpack(snapshot.buckets, [*staging, *opt_tensors], layout, backend=backend)
        for t, s in zip(targets, staging, strict=True):
            if s is not t:
                t.copy_(s)
    if optimizer is not None and desc["optimizer"]["param_groups"] is not None:
        optimizer.load_state_dict({"state": opt_state, "param_groups": desc["optimizer"]["param_groups"]})


def state_digest(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, backend: str = "auto"
) -> tuple[int, ...]:
    """The checksum of every bucket of a packed copy of model + optimizer state."""
    return capture(model, optimizer, version=0, backend=backend).checksums
