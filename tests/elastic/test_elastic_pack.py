"""Snapshot buckets: layout, the C++ extension against the pure-Python reference (identical bytes and CRCs),
and the compile-only check of the CUDA source."""

from __future__ import annotations

import random
import shutil
import subprocess
import zlib

import pytest

torch = pytest.importorskip("torch")

from libra.elastic import native  # noqa: E402
from libra.elastic.pack import checksum, layout_of, pack, plan_layout, unpack  # noqa: E402
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


@pytest.mark.parametrize("seed", range(20))
def test_python_reference_roundtrip_and_crc_is_zlib(seed):
    tensors = random_tensors(seed)
    lay = layout_of(tensors, bucket_bytes=256)
    buckets = pack(tensors, lay, backend="python")
    for b in buckets:
        assert checksum(b, backend="python") == zlib.crc32(bytes(b.numpy()))
    outs = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
    unpack(buckets, outs, lay, backend="python")
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs))


@pytest.fixture(scope="module")
def ext():
    mod = native.load()
    if mod is None:
        pytest.skip(f"C++ extension not built here: {native.load_error()}")
    return mod


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


def test_cpp_parallel_crc_matches_zlib_on_multi_chunk_buffers(ext):
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 7, (1 << 20) - 1, 1 << 20, (3 << 20) + 12345):
        buf = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
        assert checksum(buf, backend="native") == zlib.crc32(bytes(buf.numpy())), n


def test_cpp_rejects_a_layout_that_does_not_fit(ext):
    with pytest.raises(RuntimeError, match="does not fit"):
        ext.pack([torch.zeros(10)], [8], [0], [0])


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
    from libra.elastic.pack import pack_cuda, unpack_cuda

    tensors = random_tensors(3)
    lay = layout_of(tensors, bucket_bytes=256)
    hosts = pack_cuda([t.cuda() for t in tensors], lay)
    assert all(torch.equal(a, b) for a, b in zip(hosts, pack(tensors, lay, backend="python")))
    outs = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in tensors]
    unpack_cuda(hosts, outs, lay)
    assert all(torch.equal(a.contiguous(), b.cpu()) for a, b in zip(tensors, outs))
