"""The snapshot buckets of a state on one GPU: pinned host buckets with the bytes and checksums that
:mod:`libra.elastic.pack` writes for a CPU state, and the way back into GPU tensors.

- :func:`pack_cuda` / :func:`pack_checksummed_cuda`: tensors of ``CUDA_DIRECT_BYTES`` or more are copied straight
  into their slots in pieces of ``CUDA_CHUNK_BYTES`` (the copy engine alone: the copy does not wait for
  multiprocessors that training kernels hold); smaller ones are gathered by one kernel call per bucket
  (``gather_cuda_into`` of the C++ extension, ``ext/libra_ext/pack_cuda.cu``) and copied as runs of consecutive
  slots; the host zeroes the padding, and the checksums are computed piece by piece as the pieces land.
- :func:`unpack_cuda`: each bucket to one reused device buffer, then scattered by the same kernel.

The plan (:func:`_enqueue_copies`) and the landing (:func:`_land`) are functions of their gather and copy, so the
tests run them on the CPU with a fake stream as well as on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import numpy as np
import torch
import xxhash

from libra.elastic import native
from libra.elastic.pack import Layout, _np_bytes, _run, sub_layout


def _bucket_members(layout: Layout, bucket: int) -> list[int]:
    return [i for i, b in enumerate(layout.slot_bucket) if b == bucket]


def _cuda_module():
    mod = native.load()
    if mod is None or not hasattr(mod, "gather_cuda_into"):
        why = native.load_error() or native.cuda_compatible()[1]
        raise RuntimeError(f"the CUDA snapshot path is not built: {why}")
    return mod


def _cuda_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """The one CUDA device the tensors live on (the current one if none is on a GPU)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    if len(devices) > 1:
        raise ValueError(f"CUDA pack: tensors on several devices {sorted(map(str, devices))}; pack each separately")
    return devices.pop() if devices else torch.device("cuda", torch.cuda.current_device())


def _pinned_buckets(layout: Layout, out: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    if out is None:
        return [torch.empty(size, dtype=torch.uint8, pin_memory=size > 0) for size in layout.bucket_sizes]
    have = [(int(b.numel()), b.dtype, b.is_contiguous(), b.is_pinned() or not b.numel()) for b in out]
    if have != [(size, torch.uint8, True, True) for size in layout.bucket_sizes]:
        sizes = list(layout.bucket_sizes)
        raise ValueError(f"CUDA pack: out buckets {have} are not pinned uint8 of the layout's sizes {sizes}")
    return list(out)


#: The pack's device-to-host copies are made in pieces of this many bytes, each followed by an event, so a bucket's
#: checksum runs over the pieces already landed while the rest are still on the bus.
CUDA_CHUNK_BYTES = 8 << 20
#: A GPU tensor of at least this many bytes is copied straight from its memory into its slot (the copy engine
#: alone, so the copy does not wait for multiprocessors that training kernels hold); smaller ones are gathered by
#: one kernel call per bucket and copied as runs of consecutive slots.
CUDA_DIRECT_BYTES = 1 << 20


class _Waitable(Protocol):
    def synchronize(self) -> None: ...


@attrs.frozen
class _BucketCopies:
    """What the GPU pack enqueued for one bucket: ``copies`` are ``(start, stop, event)`` byte ranges copied to
    the host in stream order (the event passes once that range and everything enqueued before it have landed);
    ``zeros`` are ranges no copy writes (padding), which the host fills."""

    copies: tuple[tuple[int, int, _Waitable], ...]
    zeros: tuple[tuple[int, int], ...]


def _pieces(start: int, stop: int) -> range:
    return range(start, stop, CUDA_CHUNK_BYTES)


def _enqueue_copies(
    tensors: Sequence[torch.Tensor],
    layout: Layout,
    hosts: Sequence[torch.Tensor],
    scratch: torch.Tensor,
    gather: Callable[[list[torch.Tensor], list[int], torch.Tensor], None],
    copy: Callable[[torch.Tensor, torch.Tensor], _Waitable],
) -> tuple[list[_BucketCopies], list[torch.Tensor]]:
    """The GPU pack's plan, enqueued through ``gather(srcs, offsets, device_bucket)`` (zero the bucket, gather the
    tensors into their slots) and ``copy(host_range, device_range) -> event`` (one asynchronous copy, then an
    event), both in one stream's order. Per bucket: first the large tensors (``CUDA_DIRECT_BYTES`` or more),
    straight into their slots in pieces of ``CUDA_CHUNK_BYTES``; then the small ones, gathered into ``scratch``
    (reused bucket after bucket: the stream orders its reuse) and copied as runs of consecutive slots. Returns each
    bucket's copies and padding, and what must stay alive until the last event has passed."""
    order = sorted(range(len(tensors)), key=lambda i: (layout.slot_bucket[i], layout.slot_offset[i]))
    per_bucket: list[list[int]] = [[] for _ in layout.bucket_sizes]
    for i in order:
        if layout.slot_nbytes[i]:
            per_bucket[layout.slot_bucket[i]].append(i)
    keep: list[torch.Tensor] = [scratch]
    out: list[_BucketCopies] = []

    def pieces(host: torch.Tensor, src: torch.Tensor, at: int) -> list[tuple[int, int, _Waitable]]:
        """``src``'s bytes to ``host[at:]``, piece by piece, an event after each."""
        done = []
        for s in _pieces(0, src.numel()):
            piece = src[s : s + CUDA_CHUNK_BYTES]
            done.append((at + s, at + s + piece.numel(), copy(host[at + s : at + s + piece.numel()], piece)))
        return done

    for b, size in enumerate(layout.bucket_sizes):
        members = per_bucket[b]
        big = [i for i in members if layout.slot_nbytes[i] >= CUDA_DIRECT_BYTES]
        small = [i for i in members if layout.slot_nbytes[i] < CUDA_DIRECT_BYTES]
        copies = []
        for i in big:
            src = tensors[i].contiguous().reshape(-1).view(torch.uint8)
            keep.append(src)
            copies += pieces(hosts[b], src, layout.slot_offset[i])
        runs: list[list[int]] = []  # [start, stop) of consecutive small slots (no large slot between)
        for i in members:
            off, n = layout.slot_offset[i], layout.slot_nbytes[i]
            if n >= CUDA_DIRECT_BYTES:
                runs.append([])
            elif runs and runs[-1]:
                runs[-1][1] = off + n
            else:
                runs.append([off, off + n])
        runs = [r for r in runs if r]
        if small:
            srcs = [tensors[i].contiguous() for i in small]
            keep.extend(srcs)
            gather(srcs, [layout.slot_offset[i] for i in small], scratch[:size])
            for lo, hi in runs:
                copies += pieces(hosts[b], scratch[lo:hi], lo)
        written = [(layout.slot_offset[i], layout.slot_offset[i] + layout.slot_nbytes[i]) for i in big]
        written = sorted(written + [(lo, hi) for lo, hi in runs])
        zeros, cursor = [], 0
        for lo, hi in written:
            if lo > cursor:
                zeros.append((cursor, lo))
            cursor = max(cursor, hi)
        if cursor < size:
            zeros.append((cursor, size))
        out.append(_BucketCopies(tuple(copies), tuple(zeros)))
    return out, keep


def _land(view: np.ndarray, bucket: _BucketCopies, cpu_slots: Sequence[tuple[int, np.ndarray]]) -> int:
    """A bucket's checksum, piece by piece as the pieces land: wait for the last copy that writes into the piece,
    zero its padding, copy the CPU tensors' bytes in (the GPU copies wrote zeros or nothing there), hash it."""
    hasher = xxhash.xxh3_64()
    last_copy = [-1] * len(_pieces(0, view.size))  # per piece, the last copy (in stream order) writing into it
    for k, (lo, hi, _) in enumerate(bucket.copies):
        for p in range(lo // CUDA_CHUNK_BYTES, (hi - 1) // CUDA_CHUNK_BYTES + 1):
            last_copy[p] = k
    for p, start in enumerate(_pieces(0, view.size)):
        stop = min(view.size, start + CUDA_CHUNK_BYTES)
        last = last_copy[p]
        if last >= 0:
            bucket.copies[last][2].synchronize()  # it and every copy before it have landed
        for lo, hi in bucket.zeros:
            if max(lo, start) < min(hi, stop):
                view[max(lo, start) : min(hi, stop)] = 0
        for off, src in cpu_slots:
            lo, hi = max(off, start), min(off + src.size, stop)
            if lo < hi:
                np.copyto(view[lo:hi], src[lo - off : hi - off])
        hasher.update(view[start:stop].data)
    return hasher.intdigest()


def _enqueue_pack_cuda(
    tensors: Sequence[torch.Tensor], layout: Layout, hosts: Sequence[torch.Tensor], stream: torch.cuda.Stream
) -> tuple[list[_BucketCopies], list[torch.Tensor]]:
    """:func:`_enqueue_copies` on ``stream``: the gather kernel (``gather_cuda_into``) and ``Tensor.copy_``
    with an event recorded after each copy."""
    mod = _cuda_module()
    needs_scratch = any(n < CUDA_DIRECT_BYTES for n in layout.slot_nbytes if n)
    scratch_bytes = max(layout.bucket_sizes, default=0) if needs_scratch else 0
    scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device=_cuda_device(tensors))

    def gather(srcs: list[torch.Tensor], offsets: list[int], bucket: torch.Tensor) -> None:
        mod.gather_cuda_into(srcs, offsets, bucket, stream.cuda_stream)

    def copy(host: torch.Tensor, device: torch.Tensor) -> torch.cuda.Event:
        host.copy_(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        return event

    with torch.cuda.stream(stream):
        return _enqueue_copies(tensors, layout, hosts, scratch, gather, copy)


def pack_cuda(
    tensors: Sequence[torch.Tensor], layout: Layout, *, out: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """GPU path: pinned host buckets holding the CUDA tensors' bytes, in the same layout as :func:`pack`.

    Tensors of ``CUDA_DIRECT_BYTES`` or more are copied straight into their slots; per bucket, a batched gather
    kernel fills a device buffer (one, of the largest bucket's size, reused bucket after bucket) with the smaller
    ones, copied on as runs of consecutive slots; all asynchronously on the current stream, which is synchronised
    once after every bucket is enqueued. The host zeroes the padding. ``out``: pinned buckets to overwrite (an
    earlier pack's) instead of new pinned memory."""
    if len(tensors) != len(layout.slot_nbytes):
        raise ValueError(f"layout is for {len(layout.slot_nbytes)} tensors, got {len(tensors)}")
    stream = torch.cuda.current_stream(_cuda_device(tensors))
    hosts = _pinned_buckets(layout, out)
    buckets, keep = _enqueue_pack_cuda(tensors, layout, hosts, stream)
    for host, copies in zip(hosts, buckets, strict=True):  # the padding no copy writes, while the copies run
        for lo, hi in copies.zeros:
            host[lo:hi].zero_()
    stream.synchronize()
    del keep
    return hosts


def pack_checksummed_cuda(
    tensors: Sequence[torch.Tensor],
    layout: Layout,
    *,
    out: Sequence[torch.Tensor] | None = None,
    on_copied: Callable[[], None] | None = None,
) -> tuple[list[torch.Tensor], list[int]]:
    """:func:`pack_checksummed` for a state on one GPU: pinned host buckets with the same bytes and checksums as
    the CPU path writes. CPU tensors may sit beside the CUDA ones (an optimizer's step counts): they are copied
    into their slots as the piece of the bucket that holds them lands. Every bucket is enqueued on the current
    stream first; then the pool hashes each bucket piece by piece as the pieces land (a bucket's checksum is one
    streaming XXH3, so the largest bucket bounds the time: hashing it cannot be split over threads).
    ``on_copied()`` is called once every GPU byte has landed in the host buckets, while the hashing may go on:
    from then on the GPU tensors may change."""
    if len(tensors) != len(layout.slot_nbytes):
        raise ValueError(f"layout is for {len(layout.slot_nbytes)} tensors, got {len(tensors)}")
    on_gpu = [i for i, t in enumerate(tensors) if t.device.type == "cuda"]
    on_cpu = [i for i, t in enumerate(tensors) if t.device.type == "cpu"]
    if len(on_gpu) + len(on_cpu) != len(tensors):
        other = next(t.device for t in tensors if t.device.type not in ("cpu", "cuda"))
        raise ValueError(f"CUDA pack: a tensor is on {other}; only cuda and cpu tensors are packed")
    stream = torch.cuda.current_stream(_cuda_device(tensors))
    hosts = _pinned_buckets(layout, out)
    buckets, keep = _enqueue_pack_cuda([tensors[i] for i in on_gpu], sub_layout(layout, on_gpu), hosts, stream)
    cpu_slots: list[list[tuple[int, np.ndarray]]] = [[] for _ in hosts]
    for i in on_cpu:
        if layout.slot_nbytes[i]:
            cpu_slots[layout.slot_bucket[i]].append((layout.slot_offset[i], _np_bytes(tensors[i])))
    views = [_np_bytes(h) for h in hosts]

    def land(b: int) -> int:
        return _land(views[b], buckets[b], cpu_slots[b])

    def copied() -> None:
        for bucket in buckets:
            for _, _, event in bucket.copies[-1:]:
                event.synchronize()
        if on_copied is not None:
            on_copied()

    sums = _run([functools.partial(land, b) for b in range(len(hosts))], layout.total_bytes, meanwhile=copied)
    del keep
    return hosts, sums


def unpack_cuda(hosts: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], layout: Layout) -> None:
    """GPU path: copy host buckets to the device and scatter them into contiguous CUDA tensors in place (a bucket
    that is not pinned is staged through pinned memory first). One device buffer serves every bucket in turn."""
    mod = _cuda_module()
    if len(tensors) != len(layout.slot_nbytes):
        raise ValueError(f"layout is for {len(layout.slot_nbytes)} tensors, got {len(tensors)}")
    device = _cuda_device(tensors)
    stream = torch.cuda.current_stream(device)
    scratch = torch.empty(max((int(h.numel()) for h in hosts), default=0), dtype=torch.uint8, device=device)
    keep = []
    for b, host in enumerate(hosts):
        members = [i for i in _bucket_members(layout, b) if layout.slot_nbytes[i]]
        if not members:
            continue
        dsts = [tensors[i] for i in members]
        pinned = host if host.is_pinned() else host.pin_memory()
        dev = scratch[: host.numel()]
        mod.unpack_cuda_from(pinned, dev, dsts, [layout.slot_offset[i] for i in members], stream.cuda_stream)
        keep.append(pinned)
    stream.synchronize()
