"""Snapshot buckets: a byte layout for a list of tensors, pack/unpack into contiguous uint8 buckets, and a checksum.

The layout is computed here, in Python, once; the C++ extension (``ext/libra_ext``, loaded by
:mod:`libra.elastic.native`) and the pure-Python reference below fill the same buckets with the same bytes:
each tensor's raw bytes at its slot (offsets aligned to ``align`` bytes), zeros everywhere else. The checksum is
CRC-32 as computed by ``zlib.crc32`` (the C++ path computes the identical value in parallel).

``backend`` is ``"auto"`` (the extension where it loads, else Python), ``"native"`` (raise if not built) or
``"python"``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import attrs
import torch

from libra.elastic import native

DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_ALIGN = 64


@attrs.frozen(kw_only=True)
class Layout:
    """Where each tensor lives: ``slot_bucket[i]``/``slot_offset[i]`` for tensor ``i``; ``bucket_sizes`` in bytes.

    Tensors are placed in order; a bucket is closed when the next tensor would overflow ``bucket_bytes`` (a tensor
    larger than that gets a bucket of its own).
    """

    bucket_sizes: tuple[int, ...]
    slot_bucket: tuple[int, ...]
    slot_offset: tuple[int, ...]
    slot_nbytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes)


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def plan_layout(
    nbytes: Sequence[int], *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, align: int = DEFAULT_ALIGN
) -> Layout:
    """The layout of tensors of the given byte sizes (pure arithmetic; identical on every replica)."""
    if bucket_bytes <= 0 or align <= 0:
        raise ValueError(f"bucket_bytes ({bucket_bytes}) and align ({align}) must be positive")
    sizes: list[int] = []
    buckets: list[int] = []
    offsets: list[int] = []
    cursor = 0
    for n in nbytes:
        if n < 0:
            raise ValueError(f"tensor size {n} bytes is negative")
        start = _round_up(cursor, align)
        if not sizes or (start + n > bucket_bytes and cursor > 0 and n > 0):
            if sizes:
                sizes[-1] = cursor
            sizes.append(0)
            start, cursor = 0, 0
        buckets.append(len(sizes) - 1)
        offsets.append(start)
        cursor = start + n
    if sizes:
        sizes[-1] = cursor
    return Layout(
        bucket_sizes=tuple(sizes), slot_bucket=tuple(buckets), slot_offset=tuple(offsets), slot_nbytes=tuple(nbytes)
    )


def layout_of(tensors: Sequence[torch.Tensor], **kwargs: int) -> Layout:
    return plan_layout([t.numel() * t.element_size() for t in tensors], **kwargs)


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _module(backend: str):
    if backend == "python":
        return None
    mod = native.load()
    if mod is None and backend == "native":
        raise RuntimeError(f"the C++ snapshot extension is not available: {native.load_error()}")
    if backend not in ("auto", "native"):
        raise ValueError(f"backend must be 'auto', 'native' or 'python', not {backend!r}")
    return mod


def pack(tensors: Sequence[torch.Tensor], layout: Layout, *, backend: str = "auto") -> list[torch.Tensor]:
    """New uint8 CPU buckets holding the tensors' bytes at their slots (zeros elsewhere)."""
    if len(tensors) != len(layout.slot_nbytes):
        raise ValueError(f"layout is for {len(layout.slot_nbytes)} tensors, got {len(tensors)}")
    mod = _module(backend)
    if mod is not None:
        return list(
            mod.pack(list(tensors), list(layout.bucket_sizes), list(layout.slot_bucket), list(layout.slot_offset))
        )
    buckets = [torch.zeros(size, dtype=torch.uint8) for size in layout.bucket_sizes]
    for t, b, off, n in zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True):
        if n:
            buckets[b][off : off + n].copy_(_bytes_view(t))
    return buckets


def unpack(
    buckets: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], layout: Layout, *, backend: str = "auto"
) -> None:
    """Copy each slot back into its tensor, in place. Tensors must be contiguous CPU tensors of the packed sizes."""
    for i, (t, n) in enumerate(zip(tensors, layout.slot_nbytes, strict=True)):
        if t.numel() * t.element_size() != n or not t.is_contiguous():
            raise ValueError(
                f"tensor {i}: {t.numel() * t.element_size()} bytes, contiguous={t.is_contiguous()}; layout says {n}"
            )
    mod = _module(backend)
    if mod is not None:
        mod.unpack(list(buckets), list(tensors), list(layout.slot_bucket), list(layout.slot_offset))
        return
    for t, b, off, n in zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True):
        if n:
            t.reshape(-1).view(torch.uint8).copy_(buckets[b][off : off + n])


def checksum(bucket: torch.Tensor, *, backend: str = "auto") -> int:
    """CRC-32 (``zlib.crc32``) of a contiguous CPU tensor's bytes, as an unsigned 32-bit int."""
    mod = _module(backend)
    if mod is not None:
        return int(mod.checksum(bucket)) & 0xFFFFFFFF
    return zlib.crc32(memoryview(bucket.contiguous().reshape(-1).view(torch.uint8).numpy())) & 0xFFFFFFFF


def _bucket_members(layout: Layout, bucket: int) -> list[int]:
    return [i for i, b in enumerate(layout.slot_bucket) if b == bucket]


def _cuda_module():
    mod = native.load()
    if mod is None or not hasattr(mod, "pack_cuda_into"):
        why = native.load_error() or native.cuda_compatible()[1]
        raise RuntimeError(f"the CUDA snapshot path is not built: {why}")
    return mod


def pack_cuda(tensors: Sequence[torch.Tensor], layout: Layout) -> list[torch.Tensor]:
    """GPU path: pinned host buckets holding the CUDA tensors' bytes, in the same layout as :func:`pack`.

    Per bucket, a batched gather kernel fills a device bucket and an asynchronous copy moves it to pinned host
    memory, all on the current stream; the stream is synchronised once after every bucket is enqueued."""
    mod = _cuda_module()
    stream = torch.cuda.current_stream()
    hosts, keep = [], []
    for b, size in enumerate(layout.bucket_sizes):
        members = _bucket_members(layout, b)
        srcs = [tensors[i].contiguous() for i in members]
        device = srcs[0].device if srcs else torch.device("cuda")
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        mod.pack_cuda_into(srcs, [layout.slot_offset[i] for i in members], dev, host, stream.cuda_stream)
        hosts.append(host)
        keep.append((dev, srcs))
    stream.synchronize()
    return hosts


def unpack_cuda(hosts: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], layout: Layout) -> None:
    """GPU path: copy pinned host buckets to the device and scatter them into contiguous CUDA tensors in place."""
    mod = _cuda_module()
    stream = torch.cuda.current_stream()
    keep = []
    for b, host in enumerate(hosts):
        members = _bucket_members(layout, b)
        dsts = [tensors[i] for i in members]
        device = dsts[0].device if dsts else torch.device("cuda")
        pinned = host if host.is_pinned() else host.pin_memory()
        dev = torch.empty(host.numel(), dtype=torch.uint8, device=device)
        mod.unpack_cuda_from(pinned, dev, dsts, [layout.slot_offset[i] for i in members], stream.cuda_stream)
        keep.append((dev, pinned))
    stream.synchronize()
