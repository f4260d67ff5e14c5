"""The GPU snapshot path on a real device: the CUDA gather kernels and copies write the CPU path's bytes, a GPU state
restores bitwise (also across CPU and GPU), and a background capture on its own stream sees the state as it was
when it was taken. Skipped where there is no CUDA device; `scripts/gpu_check.sh` runs these on a GPU machine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from libra.elastic import pack_gpu as pack_mod  # noqa: E402
from libra.elastic.pack import layout_of, pack, pack_checksummed, sub_layout  # noqa: E402
from libra.elastic.pack_gpu import pack_checksummed_cuda, pack_cuda, unpack_cuda  # noqa: E402
from libra.elastic.snapshot import PendingCapture, capture, restore, state_digest  # noqa: E402
from tests.elastic.test_elastic_overlap import _join_once, _small  # noqa: E402
from tests.elastic.test_elastic_pack import random_tensors  # noqa: E402
from tests.limits import scaled  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the GPU snapshot path cannot run here"
)


def _make(seed: int, device: str):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.BatchNorm1d(65), torch.nn.Linear(65, 7)).to(device)
    return m, torch.optim.Adam(m.parameters(), lr=1e-2)


def _train(m, o, steps: int, seed: int = 0) -> None:
    device = next(m.parameters()).device
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        o.zero_grad()
        m(torch.randn(16, 33, generator=g).to(device)).square().mean().backward()
        o.step()


#: (piece size, direct-copy threshold): one piece a bucket and small tensors gathered; several pieces, CPU slots
#: and runs straddling them; nearly every tensor copied straight into its slot; a mix of both ways in a bucket.
SPLITS = [(8 << 20, 1 << 20), (96, 1 << 20), (8 << 20, 1), (96, 64)]


@pytest.mark.parametrize(("chunk", "direct"), SPLITS)
def test_cuda_pack_writes_the_python_references_bytes_and_unpacks_them(monkeypatch, chunk, direct):
    monkeypatch.setattr(pack_mod, "CUDA_CHUNK_BYTES", chunk)
    monkeypatch.setattr(pack_mod, "CUDA_DIRECT_BYTES", direct)
    for seed in range(12):
        for bucket_bytes in (128, 4096, 1 << 20):
            tensors = random_tensors(seed)
            lay = layout_of(tensors, bucket_bytes=bucket_bytes)
            want = pack(tensors, lay, backend="python")
            hosts = pack_cuda([t.cuda() for t in tensors], lay)
            assert all(h.is_pinned() for h in hosts if h.numel())
            assert all(torch.equal(a, b) for a, b in zip(hosts, want, strict=True)), (seed, bucket_bytes)
            stale = [h.fill_(0xAB) for h in hosts]  # the same pinned buckets, every old byte to be overwritten
            again = pack_cuda([t.cuda() for t in tensors], lay, out=stale)
            assert [a.data_ptr() for a in again] == [b.data_ptr() for b in hosts]
            assert all(map(torch.equal, again, want)), (seed, bucket_bytes)
            outs = [torch.full(t.shape, 3, dtype=t.dtype, device="cuda") for t in tensors]
            unpack_cuda(want, outs, lay)  # from pageable buckets: staged through pinned memory
            assert all(torch.equal(a.contiguous(), b.cpu()) for a, b in zip(tensors, outs, strict=True))


@pytest.mark.parametrize(("chunk", "direct"), SPLITS)
def test_a_gpu_state_with_cpu_tensors_beside_it_packs_to_the_cpu_bytes_and_checksums(monkeypatch, chunk, direct):
    monkeypatch.setattr(pack_mod, "CUDA_CHUNK_BYTES", chunk)
    monkeypatch.setattr(pack_mod, "CUDA_DIRECT_BYTES", direct)
    for seed in range(6):
        tensors = random_tensors(seed) + random_tensors(seed + 100)
        lay = layout_of(tensors, bucket_bytes=512)
        mixed = [t.cuda() if i % 3 else t for i, t in enumerate(tensors)]  # every third stays on the CPU
        want, want_sums = pack_checksummed(tensors, lay)
        got, sums = pack_checksummed_cuda(mixed, lay)
        assert sums == want_sums and all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), seed
        stale = [b.fill_(0xAB) for b in got]  # the same pinned buckets, every old byte to be overwritten
        reused, sums2 = pack_checksummed_cuda(mixed, lay, out=stale)
        assert sums2 == want_sums and all(torch.equal(a, b) for a, b in zip(reused, want, strict=True)), seed


def test_large_tensors_are_copied_in_pieces_and_pack_like_the_reference(monkeypatch):
    monkeypatch.setattr(pack_mod, "CUDA_CHUNK_BYTES", 1 << 20)
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randn(n, generator=gen) for n in (5, (3 << 20) // 4 + 3, 17, 1 << 20, 9)]  # 3 MiB+, 4 MiB
    lay = layout_of(tensors, bucket_bytes=2 << 20)
    want, want_sums = pack_checksummed(tensors, lay)
    got, sums = pack_checksummed_cuda([t.cuda() for t in tensors], lay)
    assert sums == want_sums and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_out_buckets_that_are_not_pinned_are_refused():
    tensors = [torch.arange(100.0, device="cuda"), torch.ones(7, device="cuda")]
    lay = layout_of(tensors, bucket_bytes=256)
    with pytest.raises(ValueError, match="not pinned"):
        pack_cuda(tensors, lay, out=[torch.empty(n, dtype=torch.uint8) for n in lay.bucket_sizes])


def test_unpack_of_a_sub_layout_leaves_the_other_slots_alone():
    tensors = [torch.arange(50.0), torch.arange(30, dtype=torch.int64), torch.ones(9)]
    lay = layout_of(tensors, bucket_bytes=4096)
    hosts = pack(tensors, lay, backend="python")
    outs = [torch.zeros(50, device="cuda"), torch.zeros(9, device="cuda")]
    unpack_cuda(hosts, outs, sub_layout(lay, [0, 2]))
    assert torch.equal(outs[0].cpu(), tensors[0]) and torch.equal(outs[1].cpu(), tensors[2])


@pytest.mark.parametrize("backend", ["auto", "python"])
def test_a_gpu_snapshot_is_the_cpu_snapshot_of_the_same_state_and_restores_bitwise_on_either_side(backend):
    m, o = _make(0, "cuda")
    _train(m, o, 3)
    gpu_snap = capture(m, o, version=3, bucket_bytes=1024, backend=backend)
    cm, co = _make(0, "cpu")
    restore(gpu_snap, cm, co, backend=backend)  # GPU -> CPU
    assert capture(cm, co, version=3, bucket_bytes=1024).checksums == gpu_snap.checksums
    m2, o2 = _make(1, "cuda")  # other weights, no optimizer state yet
    restore(capture(cm, co, version=3, bucket_bytes=1024), m2, o2, backend=backend)  # CPU -> GPU
    assert state_digest(m2, o2) == state_digest(m, o)
    for a, b in zip(m.state_dict().values(), m2.state_dict().values(), strict=True):
        assert a.device == b.device and torch.equal(a, b)
    _train(m, o, 2, seed=5)
    _train(m2, o2, 2, seed=5)
    assert state_digest(m, o) == state_digest(m2, o2)  # the restored replica keeps stepping in lockstep


def test_restore_on_the_gpu_overwrites_the_optimizers_state_where_it_lives():
    m, o = _make(0, "cuda")
    _train(m, o, 2)
    snap = capture(m, o, version=2)
    m2, o2 = _make(1, "cuda")
    _train(m2, o2, 1)
    held = [s["exp_avg"].data_ptr() for s in o2.state.values()]
    restore(snap, m2, o2)
    assert [s["exp_avg"].data_ptr() for s in o2.state.values()] == held  # in place: no new GPU memory
    assert all(s["exp_avg"].is_cuda for s in o2.state.values())
    assert state_digest(m2, o2) == state_digest(m, o)


def test_a_background_capture_waits_for_what_the_callers_stream_had_enqueued():
    """The capture's stream starts after the work enqueued before it: a parameter update queued behind a long
    kernel is in the snapshot (without the stream's wait the gather would read the old values)."""
    m, o = _make(0, "cuda")
    _train(m, o, 1)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the caller's stream
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    pending = PendingCapture(m, o, version=1, bucket_bytes=2048)
    snap = pending.wait(timeout=60)
    assert snap.checksums == capture(m, o, version=1, bucket_bytes=2048).checksums


def test_a_background_capture_is_the_state_at_its_start_while_forward_and_backward_run():
    m, o = _make(0, "cuda")
    _train(m, o, 2)
    want = capture(m, o, version=2, bucket_bytes=4096).checksums
    pending = PendingCapture(m, o, version=2, bucket_bytes=4096)
    g = torch.Generator().manual_seed(9)
    o.zero_grad()
    m(torch.randn(16, 33, generator=g).cuda()).square().mean().backward()  # changes BatchNorm's buffers
    pending.wait_copied(timeout=60)
    o.step()  # as soon as the bytes have landed, while the checksums may still be computed
    assert capture(m, o, version=3, bucket_bytes=4096).checksums != want
    snap = pending.wait(timeout=60)
    assert snap.checksums == want and snap.verified
    m2, o2 = _make(1, "cuda")
    restore(snap, m2, o2)
    assert capture(m2, o2, version=2, bucket_bytes=4096).checksums == want


def test_a_core_and_a_hybrid_on_the_gpu_exchange_gradients_and_stay_bitwise_equal(group):
    """Both replicas' models and optimizers on the GPU. Messages carry host memory: each sends its flat gradient
    from page-locked host memory and adds or applies the other's through device memory, both reused step after
    step; the replica counts are reduced where the core group needs them. The hybrid joins, replays the steps it
    missed and trains, and its state is bitwise the core's after every step."""
    from libra.elastic.core import CoreExchange
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica

    model, opt = _small(device="cuda")
    core = CoreExchange(core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=30)
    h_model, h_opt = _small(device="cuda")
    hybrid = HybridReplica(worker="h", model=h_model, optimizer=h_opt, timeout_s=scaled(30))
    seen, digests = _join_once(core, model, opt, hybrid, 5)
    assert [(s, m) for s, m, _ in seen] == [(1, Mode.ACTIVE), (2, Mode.ACTIVE), (3, Mode.ACTIVE), (4, Mode.ACTIVE)]
    assert all(d == digests[s] for s, _, d in seen)
    assert {r.step: r.num_contributed for r in core.records} == {0: 1, 1: 2, 2: 2, 3: 2, 4: 2}
    assert core._host_flat is not None and core._host_flat.is_pinned() and core._device_in.is_cuda
    assert hybrid._host_flat is not None and hybrid._host_flat.is_pinned()
    core.close()
