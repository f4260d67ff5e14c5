"""Snapshot buckets: a byte layout for a list of tensors, pack/unpack into contiguous uint8 buckets, and a checksum.

The layout is computed here, in Python, once; every backend fills the same buckets with the same bytes: each
tensor's raw bytes at its slot (offsets aligned to ``align`` bytes), zeros everywhere else. The checksum of a
bucket is XXH3-64 (the ``xxhash`` package: the reference xxHash library, SIMD-accelerated, GIL released), an
unsigned 64-bit int.

``backend`` picks who copies the bytes:

- ``"auto"`` (default): the fast path. :func:`pack_checksummed` copies each bucket in chunks of ``CHUNK_BYTES``
  and hashes each chunk right after copying it, while it is still in the core's L2 cache (so the
  checksum costs no extra pass over memory); buckets are spread over a small thread pool (numpy's memmove and
  xxhash both release the GIL). :func:`unpack` copies slot by slot over the same pool.
  :func:`adopt` unpacks without copying: each tensor is rebound to its slot of the buckets (for buckets that
  nothing else reuses, such as those a received snapshot arrived in).
- ``"native"``: the C++ extension (``ext/libra_ext``, loaded by :mod:`libra.elastic.native`; raise if not built):
  parallel memcpy, checksum in a separate pass.
- ``"python"``: the reference: one ``torch`` copy per tensor, checksum in a separate pass.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np
import torch
import xxhash

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
    if backend in ("python", "auto"):
        return None
    if backend != "native":
        raise ValueError(f"backend must be 'auto', 'native' or 'python', not {backend!r}")
    mod = native.load()
    if mod is None:
        raise RuntimeError(f"the C++ snapshot extension is not available: {native.load_error()}")
    return mod


def _check_slots(tensors: Sequence[torch.Tensor], layout: Layout) -> None:
    """Each tensor has its slot's size, and each non-empty slot lies inside its bucket, apart from the others, as
    `plan_layout` places them: a hand-made or damaged layout is refused here, the same way for every backend (the
    C++ copies slots in parallel, and the fast path hashes them in offset order)."""
    if len(tensors) != len(layout.slot_nbytes):
        raise ValueError(f"layout is for {len(layout.slot_nbytes)} tensors, got {len(tensors)}")
    sizes = layout.bucket_sizes
    spans: list[tuple[int, int, int, int]] = []
    slots = zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True)
    for i, (t, b, off, n) in enumerate(slots):
        have = t.numel() * t.element_size()
        if have != n:
            raise ValueError(f"pack: tensor {i} has {have} bytes; its slot in the layout has {n}")
        if n and not (0 <= b < len(sizes) and 0 <= off <= sizes[b] - n):
            raise ValueError(f"pack: slot {i} ({n} bytes at bucket {b} offset {off}) is outside the buckets {sizes}")
        if n:
            spans.append((b, off, off + n, i))
    spans.sort()
    for (b0, _, end, i0), (b1, off, _, i1) in itertools.pairwise(spans):
        if b0 == b1 and off < end:
            raise ValueError(f"pack: slot {i1} at bucket {b1} offset {off} overlaps slot {i0}, which ends at {end}")


def pack(tensors: Sequence[torch.Tensor], layout: Layout, *, backend: str = "auto") -> list[torch.Tensor]:
    """New uint8 CPU buckets holding the tensors' bytes at their slots (zeros elsewhere)."""
    if backend == "auto":
        return pack_checksummed(tensors, layout)[0]  # (which checks the slots)
    _check_slots(tensors, layout)
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
    """Copy each slot back into its tensor, in place. Tensors must be contiguous CPU tensors of the packed sizes,
    buckets contiguous uint8 CPU tensors that hold every slot."""
    for b, bucket in enumerate(buckets):
        if bucket.device.type != "cpu" or bucket.dtype != torch.uint8 or not bucket.is_contiguous():
            raise ValueError(f"unpack: bucket {b} is {bucket.dtype} on {bucket.device}; want contiguous uint8 on cpu")
    slots = zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True)
    for i, (t, b, off, n) in enumerate(slots):
        if t.numel() * t.element_size() != n or not t.is_contiguous():
            raise ValueError(
                f"tensor {i}: {t.numel() * t.element_size()} bytes, contiguous={t.is_contiguous()}; layout says {n}"
            )
        if n and not (0 <= b < len(buckets) and 0 <= off <= buckets[b].numel() - n):
            raise ValueError(f"unpack: slot {i} ({n} bytes at bucket {b} offset {off}) is outside the buckets")
    if backend == "auto":
        _unpack_fast(buckets, tensors, layout)
        return
    mod = _module(backend)
    if mod is not None:
        mod.unpack(list(buckets), list(tensors), list(layout.slot_bucket), list(layout.slot_offset))
        return
    for t, b, off, n in zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True):
        if n:
            t.reshape(-1).view(torch.uint8).copy_(buckets[b][off : off + n])


def slot_view(
    buckets: Sequence[torch.Tensor], layout: Layout, i: int, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Slot ``i`` as a tensor of ``shape``/``dtype`` that shares the bucket's memory (slots are 64-byte aligned,
    so a view of any dtype is aligned)."""
    n = layout.slot_nbytes[i]
    if n == 0:
        return torch.empty(list(shape), dtype=dtype)
    b, off = layout.slot_bucket[i], layout.slot_offset[i]
    if b >= len(buckets) or off + n > buckets[b].numel():
        raise ValueError(f"slot {i} at bucket {b} offset {off} ({n} bytes) is outside the buckets")
    return buckets[b][off : off + n].view(dtype).view(list(shape))


def adopt(buckets: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], layout: Layout) -> None:
    """Unpack without copying: each tensor is rebound, in place (``tensor.data = slot``), to its slot of the
    buckets, so it keeps its identity (a ``Parameter`` stays the optimizer's and its module's) and its value is the
    packed bytes. The buckets then belong to the tensors: writing to either changes the other, so adopt only
    buckets nothing else will reuse (the ones a received snapshot arrived in; of two sets of buckets packed in
    turn, the one the tensors do not hold). Each tensor's old memory is released when nothing else holds it.

    Buckets are contiguous uint8 CPU tensors, tensors CPU tensors of the packed sizes (any strides: the adopted
    tensor is contiguous)."""
    for i, (t, n) in enumerate(zip(tensors, layout.slot_nbytes, strict=True)):
        if t.device.type != "cpu" or t.numel() * t.element_size() != n:
            raise ValueError(f"tensor {i}: {t.numel() * t.element_size()} bytes on {t.device}; layout says {n} on cpu")
    for b, bucket in enumerate(buckets):
        if bucket.device.type != "cpu" or bucket.dtype != torch.uint8 or not bucket.is_contiguous():
            raise ValueError(f"bucket {b}: {bucket.dtype} on {bucket.device}; adopt needs contiguous uint8 on cpu")
    # every slot is checked (by slot_view) before any tensor moves
    views = [slot_view(buckets, layout, i, t.shape, t.dtype) for i, t in enumerate(tensors)]
    for t, view in zip(tensors, views, strict=True):
        if t.numel():
            t.data = view


def checksum(bucket: torch.Tensor, *, backend: str = "auto") -> int:
    """XXH3-64 of a CPU tensor's bytes, as an unsigned 64-bit int (the same for every backend)."""
    _module(backend)  # validates the name (and, for "native", that the extension exists)
    return xxhash.xxh3_64_intdigest(_np_bytes(bucket).data)


def new_hasher() -> xxhash.xxh3_64:
    """A streaming checksum: ``update`` it with consecutive pieces of a buffer; ``intdigest()`` then equals
    :func:`checksum` of the whole buffer."""
    return xxhash.xxh3_64()


# -- the fast path: chunked copy fused with the checksum, over a thread pool ------------------------------------

#: Copy-and-hash granularity: a chunk is hashed right after it is copied, while it is still in L2 (2 MiB per core
#: on the EPYC VM of benchmarks/README.md: a chunk's source and copy fit with room to spare). 512 KiB rather than
#: 256 KiB halves the Python work per byte (two slices, a copy call and a hash call per chunk); docs/elastic.md
#: has the measurements.
CHUNK_BYTES = 512 << 10
#: Below this many bytes in all, work runs on the calling thread (a pool round trip costs more than it saves).
_INLINE_BYTES = 8 << 20

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool_after_fork() -> None:
    """A forked child has none of the parent's pool threads: start a new pool there when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def workers() -> int:
    """Threads of the copy/checksum pool: ``$LIBRA_PACK_THREADS``, else the CPU count (at most 8)."""
    return max(1, int(os.environ.get("LIBRA_PACK_THREADS") or min(os.cpu_count() or 1, 8)))


def _run(tasks: Sequence[Callable[[], object]], nbytes: int, meanwhile: Callable[[], None] | None = None) -> list:
    """Run ``tasks`` (largest first) on the pool, or inline when the work is small; results in task order.
    ``meanwhile`` runs on the calling thread while the pool works (after the tasks, when they run inline)."""
    global _pool
    if len(tasks) <= 1 or nbytes < _INLINE_BYTES or workers() == 1:
        results = [task() for task in tasks]
        if meanwhile is not None:
            meanwhile()
        return results
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="libra-pack")
    futures = [_pool.submit(task) for task in tasks]
    if meanwhile is not None:
        meanwhile()
    return [f.result() for f in futures]


def _np_bytes(t: torch.Tensor) -> np.ndarray:
    """A 1-D uint8 numpy view of a tensor's bytes (a contiguous copy first only if it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _fill_bucket(dst: np.ndarray, slots: list[tuple[int, np.ndarray]]) -> int:
    """Write ``slots`` (offset, bytes; ascending offsets) into ``dst`` with zeros in the gaps, hashing each chunk
    just after it is written. Returns the bucket's checksum."""
    h = xxhash.xxh3_64()
    cursor = 0
    for off, src in slots:
        if off > cursor:
            gap = dst[cursor:off]
            gap.fill(0)
            h.update(gap.data)
        n = src.size
        for start in range(0, n, CHUNK_BYTES):
            end = min(n, start + CHUNK_BYTES)
            piece = dst[off + start : off + end]
            np.copyto(piece, src[start:end])
            h.update(piece.data)
        cursor = max(cursor, off + n)
    if cursor < dst.size:
        tail = dst[cursor:]
        tail.fill(0)
        h.update(tail.data)
    return h.intdigest()


def _offset(slot: tuple[int, np.ndarray]) -> int:
    return slot[0]


def pack_checksummed(
    tensors: Sequence[torch.Tensor],
    layout: Layout,
    *,
    backend: str = "auto",
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[int]]:
    """Uint8 CPU buckets (as :func:`pack`) and the checksum of each (as :func:`checksum`). On ``"auto"`` the
    checksum is computed chunk by chunk during the copy (no second pass over memory). ``out``: buckets to
    overwrite (contiguous uint8, the layout's sizes), e.g. those of an earlier pack, instead of new memory (the
    kernel zero-fills every page of new memory on first touch, which costs about as much as a copy)."""
    if backend != "auto":
        buckets = pack(tensors, layout, backend=backend)
        return buckets, checksums(buckets)
    _check_slots(tensors, layout)
    for i, t in enumerate(tensors):
        if t.device.type != "cpu":
            raise ValueError(f"pack: tensor {i} is on {t.device}; use the CUDA path")
    if out is None:
        buckets = [torch.empty(size, dtype=torch.uint8) for size in layout.bucket_sizes]
    else:
        buckets = list(out)
        have = [(int(b.numel()), b.dtype, b.is_contiguous()) for b in buckets]
        if have != [(size, torch.uint8, True) for size in layout.bucket_sizes]:
            raise ValueError(f"pack: out buckets {have} do not match the layout's {list(layout.bucket_sizes)}")
    slots: list[list[tuple[int, np.ndarray]]] = [[] for _ in buckets]
    for t, b, off, n in zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True):
        if n:
            slots[b].append((off, _np_bytes(t)))
    for listed in slots:  # (in offset order, so that each bucket is hashed front to back)
        listed.sort(key=_offset)
    order = sorted(range(len(buckets)), key=lambda b: -layout.bucket_sizes[b])
    views = [_np_bytes(b) for b in buckets]
    done = _run([functools.partial(_fill_bucket, views[b], slots[b]) for b in order], layout.total_bytes)
    crcs = [0] * len(buckets)
    for b, value in zip(order, done, strict=True):
        crcs[b] = value
    return buckets, crcs


def checksums(buckets: Sequence[torch.Tensor]) -> list[int]:
    """:func:`checksum` of every bucket, spread over the pool."""
    views = [_np_bytes(b) for b in buckets]
    return _run([functools.partial(xxhash.xxh3_64_intdigest, v.data) for v in views], sum(v.size for v in views))


def _unpack_fast(buckets: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], layout: Layout) -> None:
    views = [_np_bytes(b) for b in buckets]
    per_bucket: list[list[tuple[np.ndarray, int]]] = [[] for _ in buckets]
    for t, b, off, n in zip(tensors, layout.slot_bucket, layout.slot_offset, layout.slot_nbytes, strict=True):
        if n:
            if b >= len(views) or off + n > views[b].size:
                raise ValueError(f"unpack: slot at bucket {b} offset {off} ({n} bytes) is outside the buckets")
            per_bucket[b].append((t.detach().reshape(-1).view(torch.uint8).numpy(), off))

    def copy(b: int) -> None:
        for dst, off in per_bucket[b]:
            np.copyto(dst, views[b][off : off + dst.size])

    order = sorted(range(len(views)), key=lambda b: -views[b].size)
    _run([functools.partial(copy, b) for b in order], layout.total_bytes)


def sub_layout(layout: Layout, slots: Sequence[int]) -> Layout:
    """The layout of some of the slots (in the given order) over the same buckets."""
    return Layout(
        bucket_sizes=layout.bucket_sizes,
        slot_bucket=tuple(layout.slot_bucket[i] for i in slots),
        slot_offset=tuple(layout.slot_offset[i] for i in slots),
        slot_nbytes=tuple(layout.slot_nbytes[i] for i in slots),
    )
