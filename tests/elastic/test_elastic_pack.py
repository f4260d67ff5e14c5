"""Snapshot buckets: layout, the fast path and the C++ extension against the pure-Python reference (identical
bytes and checksums), the checksum is XXH3-64 and catches corruption, and the compile-only check of the CUDA
source."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import xxhash  # noqa: E402

from libra.elastic import native  # noqa: E402
from libra.elastic import pack as pack_mod  # noqa: E402
from libra.elastic.pack import (  # noqa: E402
    adopt,
    checksum,
    checksums,
    layout_of,
    new_hasher,
    pack,
    pack_checksummed,
    plan_layout,
    unpack,
)
from tests.limits import scaled  # noqa: E402

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def random_tensors(seed: int) -> list:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rng.randint(1, 12)):
        shape = tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3)))
        dtype = rng.choice(DTYPES)
        t = (torch.randn(shape, generator=gen) * 50).to(dtype)
        if t.dim() == 2 and rng.random() < 0.3:
            t = t.t()  # non-contiguous input
        out.append(t)
    return out


def test_layout_slots_are_aligned_disjoint_and_inside_their_bucket():
    sizes = [0, 1, 7, 64, 65, 1000, 5000, 3, 0, 4096]
    lay = plan_layout(sizes, bucket_bytes=4096, align=64)
    spans = {}
    for n, b, off in zip(sizes, lay.slot_bucket, lay.slot_offset):
        assert off % 64 == 0 and (off + n <= lay.bucket_sizes[b] or n > 4096)
        spans.setdefault(b, []).append((off, off + n))
    for ranges in spans.values():
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    assert lay.bucket_sizes[lay.slot_bucket[6]] == 5000  # bigger than a bucket: a bucket of its own
    with pytest.raises(ValueError):
        plan_layout([1], bucket_bytes=0)


def test_checksum_is_xxh3_64():
    # Test vectors of the reference implementation (xxHash's XXH3_64bits with seed 0).
    assert checksum(torch.empty(0, dtype=torch.uint8)) == 0x2D06800538D394C2
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert checksum(data) == xxhash.xxh3_64_intdigest(bytes(range(256)))
    assert checksum(torch.tensor([1.0, -2.0])) == xxhash.xxh3_64_intdigest(torch.tensor([1.0, -2.0]).numpy().tobytes())


@pytest.mark.parametrize("seed", range(20))
def test_python_reference_roundtrip(seed):
    tensors = random_tensors(seed)
    lay = layout_of(tensors, bucket_bytes=256)
    buckets = pack(tensors, lay, backend="python")
    for b in buckets:
        assert checksum(b, backend="python") == xxhash.xxh3_64_intdigest(bytes(b.numpy()))
    outs = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
    unpack(buckets, outs, lay, backend="python")
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs))


@pytest.mark.parametrize("seed", range(30))
def test_fast_path_writes_the_same_bytes_and_checksums_as_python(seed):
    tensors = random_tensors(seed)
    lay = layout_of(tensors, bucket_bytes=random.Random(seed).choice([64, 256, 4096, 1 << 20]))
    ref = pack(tensors, lay, backend="python")
    fast, sums = pack_checksummed(tensors, lay)
    assert len(ref) == len(fast)
    for a, b, c in zip(ref, fast, sums):
        assert torch.equal(a, b)
        assert c == checksum(a, backend="python")
    outs = [torch.full(t.shape, 3, dtype=t.dtype) for t in tensors]
    unpack(fast, outs, lay)
    assert all(torch.equal(a.contiguous(), b) for a, b in zip(tensors, outs))


def test_fast_path_on_the_thread_pool_with_multi_chunk_tensors(monkeypatch):
    """Big enough to run on the pool, tensors spanning many copy/hash chunks and several buckets."""
    monkeypatch.setattr(pack_mod, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(pack_mod, "_INLINE_BYTES", 0)
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(n, generator=gen) for n in (50_000, 1, 123_457, 0, 70_001)]
    tensors.append(torch.randint(0, 2, (9_999,), generator=gen).bool())
    lay = layout_of(tensors, bucket_bytes=300_000)
    assert len(lay.bucket_sizes) >= 3
    ref = pack(tensors, lay, backend="python")
    fast, sums = pack_checksummed(tensors, lay)
    assert all(torch.equal(a, b) for a, b in zip(ref, fast))
    assert sums == [checksum(b) for b in ref] == checksums(ref)
    outs = [torch.empty_like(t) for t in tensors]
    unpack(fast, outs, lay)
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs))


def _inside(t, buckets) -> bool:
    return any(b.data_ptr() <= t.data_ptr() < b.data_ptr() + b.numel() for b in buckets)


@pytest.mark.parametrize("seed", range(20))
def test_adopt_rebinds_each_tensor_to_its_slot_without_a_copy(seed):
    tensors = random_tensors(seed)
    lay = layout_of(tensors, bucket_bytes=random.Random(seed).choice([64, 256, 4096]))
    buckets, _ = pack_checksummed(tensors, lay)
    # 2-D targets transposed views (not contiguous): a target's strides do not matter
    outs = [
        torch.full(t.shape[::-1], 3, dtype=t.dtype).t() if t.dim() == 2 else torch.full(t.shape, 3, dtype=t.dtype)
        for t in tensors
    ]
    ids = [id(o) for o in outs]
    adopt(buckets, outs, lay)
    assert [id(o) for o in outs] == ids
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs))
    for o, b, off in zip(outs, lay.slot_bucket, lay.slot_offset):  # at its very slot: the bucket's memory
        assert o.numel() == 0 or (o.data_ptr() == buckets[b].data_ptr() + off and o.is_contiguous())


def test_adopt_keeps_a_parameter_that_its_optimizer_then_updates_in_the_bucket():
    p = torch.nn.Parameter(torch.zeros(4, 3))
    opt = torch.optim.SGD([p], lr=1.0)
    src = [torch.arange(12, dtype=torch.float32).reshape(4, 3)]
    lay = layout_of(src)
    buckets, _ = pack_checksummed(src, lay)
    adopt(buckets, [p], lay)
    assert isinstance(p, torch.nn.Parameter) and torch.equal(p, src[0]) and _inside(p, buckets)
    p.sum().backward()
    opt.step()
    assert torch.equal(buckets[0][:48].view(torch.float32).view(4, 3), src[0] - 1)


def test_adopt_checks_every_tensor_before_it_moves_any():
    tensors = [torch.ones(5), torch.ones(7), torch.ones(2)]
    lay = layout_of(tensors)
    buckets, _ = pack_checksummed(tensors, lay)
    outs = [torch.zeros(5), torch.zeros(6), torch.zeros(2)]
    ptrs = [o.data_ptr() for o in outs]
    with pytest.raises(ValueError, match="tensor 1: 24 bytes"):
        adopt(buckets, outs, lay)
    assert [o.data_ptr() for o in outs] == ptrs
    with pytest.raises(ValueError, match="outside the buckets"):
        adopt([buckets[0][:30]], [torch.zeros(5), torch.zeros(7), torch.zeros(2)], lay)
    with pytest.raises(ValueError, match="contiguous uint8"):
        adopt([buckets[0].view(torch.int8)], [torch.zeros(5), torch.zeros(7), torch.zeros(2)], lay)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=5000), cuts=st.lists(st.integers(0, 5000), max_size=6), flip=st.integers())
def test_streaming_checksum_equals_one_shot_and_catches_any_flipped_byte(data, cuts, flip):
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    h = new_hasher()
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in zip(edges, edges[1:]):
        h.update(buf[a:b].numpy())
    assert h.intdigest() == checksum(buf)
    bad = buf.clone()
    bad[flip % len(data)] ^= 0x01
    assert checksum(bad) != checksum(buf)


@pytest.mark.parametrize("seed", range(40))
def test_cpp_extension_writes_the_same_bytes_as_python(ext, seed):
    tensors = random_tensors(seed)
    lay = layout_of(tensors, bucket_bytes=random.Random(seed).choice([64, 256, 4096, 1 << 20]))
    py = pack(tensors, lay, backend="python")
    cc = pack(tensors, lay, backend="native")
    assert len(py) == len(cc)
    for a, b in zip(py, cc):
        assert torch.equal(a, b)
        assert checksum(a, backend="python") == checksum(b, backend="native")
    outs = [torch.full(t.shape, 3, dtype=t.dtype) for t in tensors]
    unpack(cc, outs, lay, backend="native")
    assert all(torch.equal(a.contiguous(), b) for a, b in zip(tensors, outs))


def test_cpp_multi_chunk_tensors_pack_like_python(ext):
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) for n in (1, (1 << 20) + 7, 3 << 20)]
    lay = layout_of(tensors, bucket_bytes=2 << 20)
    assert all(
        torch.equal(a, b) for a, b in zip(pack(tensors, lay, backend="python"), pack(tensors, lay, backend="native"))
    )


def test_cpp_rejects_a_layout_that_does_not_fit(ext):
    with pytest.raises(RuntimeError, match=r"pack: tensor 0 \(40 bytes\) does not fit bucket 0 at offset 0"):
        ext.pack([torch.zeros(10)], [8], [0], [0])


def test_cpp_errors_name_the_numbers(ext):
    """The extension's messages carry their integers (built without iostreams: pack.cpp, `msg`)."""
    with pytest.raises(RuntimeError, match="layout has 2 bucket ids and 1 offsets for 1 tensors"):
        ext.pack([torch.zeros(1)], [8], [0, 0], [0])
    with pytest.raises(RuntimeError, match="pack: tensor 1 \\(4 bytes\\) does not fit bucket 3 at offset 12"):
        ext.pack([torch.zeros(1), torch.zeros(1)], [8], [0, 3], [0, 12])
    with pytest.raises(RuntimeError, match="unpack: bucket id -1 out of range"):
        ext.unpack([torch.zeros(8, dtype=torch.uint8)], [torch.zeros(1)], [-1], [0])
    with pytest.raises(RuntimeError, match="holding 4 bytes at offset 8"):
        ext.unpack([torch.zeros(8, dtype=torch.uint8)], [torch.zeros(1)], [0], [8])


def test_native_backend_is_explicit_about_absence(monkeypatch):
    monkeypatch.setattr(native, "load", lambda: None)
    with pytest.raises(RuntimeError, match="not available"):
        pack([torch.zeros(1)], layout_of([torch.zeros(1)]), backend="native")
    assert len(pack([torch.zeros(1)], layout_of([torch.zeros(1)]), backend="auto")) == 1


def test_is_compatible_reports_a_reason():
    ok, why = native.is_compatible()
    assert isinstance(ok, bool) and why


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed; the CUDA source is not compiled")
@pytest.mark.timeout(scaled(180))
def test_cuda_source_compiles_with_nvcc(tmp_path):
    out = tmp_path / "pack_cuda.o"
    proc = subprocess.run(native.nvcc_compile_command(out), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit: the binding's CUDA path is not checked")
@pytest.mark.timeout(scaled(180))
def test_cpp_binding_with_cuda_path_passes_a_syntax_check():
    proc = subprocess.run(native.cuda_binding_syntax_command(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU pack/unpack cannot run here")
def test_cuda_path_writes_the_same_bytes_as_python():
    from libra.elastic.pack_gpu import pack_cuda, unpack_cuda

    tensors = random_tensors(3)
    lay = layout_of(tensors, bucket_bytes=256)
    hosts = pack_cuda([t.cuda() for t in tensors], lay)
    assert all(torch.equal(a, b) for a, b in zip(hosts, pack(tensors, lay, backend="python")))
    outs = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in tensors]
    unpack_cuda(hosts, outs, lay)
    assert all(torch.equal(a.contiguous(), b.cpu()) for a, b in zip(tensors, outs))


@pytest.mark.timeout(120)
def test_a_forked_child_packs_on_a_pool_of_its_own(monkeypatch):
    """The pool's threads do not survive fork: a child that reused the parent's pool object would hang."""
    import os

    monkeypatch.setattr(pack_mod, "_INLINE_BYTES", 0)
    tensors = [torch.arange(1000, dtype=torch.float32), torch.ones(500)]
    lay = layout_of(tensors, bucket_bytes=2048)
    expected = pack_checksummed(tensors, lay)[1]  # creates the parent's pool
    assert pack_mod._pool is not None
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if pack_checksummed(tensors, lay)[1] == expected else 2
        finally:
            os._exit(code)
    import signal
    import time

    from tests.limits import scaled

    deadline = time.monotonic() + scaled(30)
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung packing on the parent's (threadless) pool")
    assert os.WIFEXITED(waited[1]) and os.WEXITSTATUS(waited[1]) == 0
