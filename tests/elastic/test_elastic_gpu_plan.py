"""The GPU pack's plan and landing, on the CPU: which copies it enqueues (large tensors straight to their slots in
pieces, small ones gathered and copied as runs), which padding the host zeroes, and which event each piece of a
bucket waits for before it is hashed. A fake stream runs the queued work lazily, in order, only as far as an event
that is waited for, so a piece hashed before its bytes have landed gives a wrong checksum. The same code runs on a
GPU in `test_elastic_cuda.py`; this runs in CI, which has none."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from libra.elastic import pack_gpu as pack_mod  # noqa: E402
from libra.elastic.pack import _np_bytes, layout_of, pack_checksummed, sub_layout  # noqa: E402
from tests.elastic.test_elastic_pack import random_tensors  # noqa: E402


class FakeStream:
    """Work queued in order and run lazily: waiting on the k-th event runs everything queued up to it, as a CUDA
    stream would have done by the time that event passed; nothing lands before it is waited for."""

    def __init__(self) -> None:
        self.queue: list = []
        self.ran = 0

    def run_to(self, k: int) -> None:
        while self.ran <= k:
            self.queue[self.ran]()
            self.ran += 1

    def gather(self, srcs, offsets, bucket) -> None:
        def work(srcs=srcs, offsets=offsets, bucket=bucket):
            bucket.zero_()
            for src, off in zip(srcs, offsets, strict=True):
                raw = src.reshape(-1).view(torch.uint8)
                bucket[off : off + raw.numel()].copy_(raw)

        self.queue.append(work)

    def copy(self, host, device):
        self.queue.append(lambda host=host, device=device: host.copy_(device))
        return FakeEvent(self, len(self.queue) - 1)


class FakeEvent:
    def __init__(self, stream: FakeStream, k: int) -> None:
        self.stream, self.k = stream, k

    def synchronize(self) -> None:
        self.stream.run_to(self.k)


def fake_pack_checksummed(tensors, on_gpu: set[int], layout):
    """What `pack_checksummed_cuda` does, with the fake stream for the device: stale host buckets, the GPU
    tensors' plan enqueued, then the buckets landed in a shuffled order (the pool may take them in any)."""
    stream = FakeStream()
    gpu = sorted(on_gpu)
    hosts = [torch.full((n,), 0xAB, dtype=torch.uint8) for n in layout.bucket_sizes]  # stale bytes everywhere
    scratch = torch.full((max(layout.bucket_sizes, default=0),), 0xCD, dtype=torch.uint8)
    buckets, _keep = pack_mod._enqueue_copies(
        [tensors[i] for i in gpu], sub_layout(layout, gpu), hosts, scratch, stream.gather, stream.copy
    )
    assert stream.ran == 0  # nothing has landed yet
    cpu_slots: list[list] = [[] for _ in hosts]
    for i, t in enumerate(tensors):
        if i not in on_gpu and layout.slot_nbytes[i]:
            cpu_slots[layout.slot_bucket[i]].append((layout.slot_offset[i], _np_bytes(t)))
    views = [_np_bytes(h) for h in hosts]
    sums = [0] * len(hosts)
    order = list(range(len(hosts)))
    random.Random(len(tensors)).shuffle(order)
    for b in order:
        sums[b] = pack_mod._land(views[b], buckets[b], cpu_slots[b])
    return hosts, sums, buckets


def _with_large(seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    sizes = random.Random(seed).sample([3, 70, 300, 1000, 2500], 3)
    return random_tensors(seed) + [torch.randn(n, generator=gen) for n in sizes]


@given(
    seed=st.integers(0, 10_000),
    gpu_share=st.sampled_from([0.0, 0.5, 1.0]),
    chunk=st.sampled_from([64, 96, 1000, 8 << 20]),
    direct=st.sampled_from([1, 64, 500, 1 << 20]),
    bucket_bytes=st.sampled_from([128, 512, 4096, 1 << 20]),
)
def test_the_planned_copies_landed_piece_by_piece_give_the_cpu_paths_bytes_and_checksums(
    seed, gpu_share, chunk, direct, bucket_bytes
):
    tensors = _with_large(seed)
    rng = random.Random(seed)
    on_gpu = {i for i in range(len(tensors)) if rng.random() < gpu_share}
    layout = layout_of(tensors, bucket_bytes=bucket_bytes)
    want, want_sums = pack_checksummed(tensors, layout)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pack_mod, "CUDA_CHUNK_BYTES", chunk)
        mp.setattr(pack_mod, "CUDA_DIRECT_BYTES", direct)
        hosts, sums, buckets = fake_pack_checksummed(tensors, on_gpu, layout)
    assert sums == want_sums
    assert all(torch.equal(a, b) for a, b in zip(hosts, want, strict=True))
    for plan, size in zip(buckets, layout.bucket_sizes, strict=True):
        assert all(hi - lo <= chunk for lo, hi, _ in plan.copies)  # every copy is one piece
        spans = sorted([(lo, hi) for lo, hi, _ in plan.copies] + list(plan.zeros))
        covered = np.zeros(size, dtype=np.int8)
        for lo, hi in spans:
            covered[lo:hi] += 1
        assert (covered == 1).all()  # copies and padding cover the bucket exactly once


def test_a_bucket_of_large_and_small_tensors_copies_large_ones_first_and_small_ones_as_runs(monkeypatch):
    monkeypatch.setattr(pack_mod, "CUDA_CHUNK_BYTES", 256)
    monkeypatch.setattr(pack_mod, "CUDA_DIRECT_BYTES", 128)
    tensors = [torch.arange(4.0), torch.arange(3.0), torch.arange(100.0), torch.arange(5.0), torch.arange(2.0)]
    layout = layout_of(tensors, bucket_bytes=1 << 20)  # one bucket: 16 | 12 | 400 | 20 | 8 bytes at 64-byte slots
    hosts, sums, buckets = fake_pack_checksummed(tensors, set(range(5)), layout)
    (plan,) = buckets
    offsets = layout.slot_offset
    big = [(lo, hi) for lo, hi, _ in plan.copies[:2]]
    assert big == [(offsets[2], offsets[2] + 256), (offsets[2] + 256, offsets[2] + 400)]  # the large one, 2 pieces
    runs = [(lo, hi) for lo, hi, _ in plan.copies[2:]]
    assert runs == [(0, offsets[1] + 12), (offsets[3], offsets[4] + 8)]  # the small ones, around it
    assert plan.zeros == ((offsets[1] + 12, offsets[2]), (offsets[2] + 400, offsets[3]))
    assert sums == pack_checksummed(tensors, layout)[1]


def test_a_one_byte_gap_before_a_large_tensor_is_zeroed(monkeypatch):
    monkeypatch.setattr(pack_mod, "CUDA_DIRECT_BYTES", 128)
    tensors = [torch.full((63,), 7, dtype=torch.uint8), torch.arange(100.0)]  # slots [0, 63) and [64, 464)
    layout = layout_of(tensors, bucket_bytes=1 << 20)
    hosts, sums, buckets = fake_pack_checksummed(tensors, {0, 1}, layout)
    assert buckets[0].zeros == ((63, 64),)
    assert int(hosts[0][63]) == 0 and sums == pack_checksummed(tensors, layout)[1]
