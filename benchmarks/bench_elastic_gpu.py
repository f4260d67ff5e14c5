"""Issue 16 targets 1 and 3 where the state lives on a GPU (pytest-benchmark; skipped without a CUDA device).

    python -m pytest benchmarks/bench_elastic_gpu.py --benchmark-only -p no:cacheprovider -s
    LIBRA_BENCH_PARAMS=10000000 python -m pytest benchmarks/bench_elastic_gpu.py ...   # quick: 10M parameters

`scripts/gpu_check.sh` runs this with the GPU tests. The state is ``LIBRA_BENCH_PARAMS`` fp32 parameters (default
100M) plus Adam's two moments, 1.2 GB in 150 tensors on the GPU, as in ``bench_elastic.py``. Each benchmark measures
its physical baseline in the same run, round by round (pytest-benchmark's untimed ``setup``), and reports the ratio.

- ``test_gpu_pack_checksum`` (target 1, sender's side): :func:`~libra.elastic.pack_gpu.pack_checksummed_cuda` into
  pinned buckets kept from the round before (gather kernels, device-to-host copies, XXH3 of every bucket as it
  lands) against the plain device-to-host copy of the same tensors into pinned memory (``Tensor.copy_``, one
  stream): the PCIe link's ceiling. ``nohash`` is :func:`~libra.elastic.pack_gpu.pack_cuda` alone.
- ``test_gpu_unpack`` (target 1, receiver's side): :func:`~libra.elastic.pack_gpu.unpack_cuda` of the pinned buckets
  into the state against the plain host-to-device copy of the same bytes.
- ``test_gpu_step_with_capture`` (target 3): a core step of an MLP of about ``LIBRA_BENCH_PARAMS`` parameters with
  Adam on the GPU (forward, backward, ``optimizer.step()``, synchronised) against the same step with a
  :class:`~libra.elastic.snapshot.PendingCapture` taken at its start whose copy is waited for before
  ``optimizer.step()`` (``wait_copied``), as the elastic core does during a join on a TCP link; its checksums may
  run on (every timed step packs the whole state). Steps with and without alternate, and each plain step first
  waits for the capture before it to finish (not timed).
  ``batch`` sets the step's length: the capture is hidden when the forward/backward outlasts the copy.

Nothing here asserts a time.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

torch = pytest.importorskip("torch")

from benchmarks.bench_elastic import _report  # noqa: E402
from libra.elastic.pack import layout_of  # noqa: E402
from libra.elastic.pack_gpu import pack_checksummed_cuda, pack_cuda, unpack_cuda  # noqa: E402
from libra.elastic.snapshot import PendingCapture  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU benchmarks need one")

NUM_PARAMS = int(os.environ.get("LIBRA_BENCH_PARAMS", "100000000"))
NUM_TENSORS = 50
ROUNDS = 10


def _synced(fn):
    def run():
        fn()
        torch.cuda.synchronize()

    return run


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def gpu_state():
    per = NUM_PARAMS // NUM_TENSORS
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(per, generator=gen, device="cuda") for _ in range(NUM_TENSORS)]
    moments = [torch.rand(per, generator=gen, device="cuda") for _ in range(2 * NUM_TENSORS)]
    tensors = params + moments
    layout = layout_of(tensors)
    hosts = [torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, pin_memory=True) for t in tensors]
    return tensors, layout, hosts


def _d2h(tensors, hosts):
    for t, h in zip(tensors, hosts, strict=True):
        h.copy_(t.view(-1).view(torch.uint8), non_blocking=True)


def _h2d(tensors, hosts):
    for t, h in zip(tensors, hosts, strict=True):
        t.view(-1).view(torch.uint8).copy_(h, non_blocking=True)


@pytest.mark.parametrize("variant", ["checksum", "nohash"])
def test_gpu_pack_checksum(benchmark, gpu_state, variant):
    tensors, layout, hosts = gpu_state
    kept: list = [pack_cuda(tensors, layout)]  # pinned buckets every timed round reuses
    sums: list = []

    def one_round():
        if variant == "checksum":
            buckets, got = pack_checksummed_cuda(tensors, layout, out=kept[0])
            sums.append(got)
        else:
            pack_cuda(tensors, layout, out=kept[0])

    baseline: list[float] = []
    benchmark.pedantic(
        _synced(one_round), setup=lambda: baseline.append(_timed(lambda: _d2h(tensors, hosts))), rounds=ROUNDS
    )
    if sums:
        assert all(s == sums[0] for s in sums)
    _report(benchmark, f"gpu_pack[{variant}]", "device-to-host copy", baseline, layout.total_bytes, device=_device())


def test_gpu_unpack(benchmark, gpu_state):
    tensors, layout, hosts = gpu_state
    buckets = pack_cuda(tensors, layout)
    outs = [torch.empty_like(t) for t in tensors]
    baseline: list[float] = []
    benchmark.pedantic(
        _synced(lambda: unpack_cuda(buckets, outs, layout)),
        setup=lambda: baseline.append(_timed(lambda: _h2d(outs, hosts))),
        rounds=ROUNDS,
    )
    unpack_cuda(buckets, outs, layout)
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs, strict=True))
    _report(benchmark, "gpu_unpack", "host-to-device copy", baseline, layout.total_bytes, device=_device())


def _mlp(width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 4)).cuda()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("batch", [1024, 8192])
def test_gpu_step_with_capture(benchmark, batch):
    width = max(8, round(NUM_PARAMS**0.5))
    model, opt = _mlp(width)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(batch, width, generator=gen, device="cuda")
    kept: list = []
    version = [0]
    packing: list = []

    def finish() -> None:
        """The previous capture's checksums (they may outlast its step): its buckets are the next one's."""
        if packing:
            kept[:] = [list(packing.pop().wait(timeout=600).buckets)]

    def step(capture: bool) -> None:
        pending = None
        if capture:
            version[0] += 1
            pending = PendingCapture(model, opt, version=version[0], out=kept[0] if kept else None)
            packing.append(pending)
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        if pending is not None:
            pending.wait_copied(timeout=600)  # what the core waits for before the optimizer step
        opt.step()

    def plain_step() -> None:
        finish()
        plain.append(_timed(lambda: step(False)))

    plain: list[float] = []
    for capture in (False, True, False, True):  # warm-up: kernels, Adam's state, the pinned buckets
        finish()
        _timed(lambda capture=capture: step(capture))
    benchmark.pedantic(_synced(lambda: step(True)), setup=plain_step, rounds=ROUNDS)
    finish()
    stats = benchmark.stats.stats
    nbytes = sum(b.numel() for b in kept[0])
    pack_s = _timed(lambda: PendingCapture(model, opt, version=0, out=kept[0]).wait(timeout=600))
    torch.cuda.synchronize()
    start = time.perf_counter()
    pending = PendingCapture(model, opt, version=0, out=kept[0])
    pending.wait_copied(timeout=600)
    copy_s = time.perf_counter() - start
    pending.wait(timeout=600)
    info = {
        "batch": batch,
        "params": sum(p.numel() for p in model.parameters()),
        "state_bytes": nbytes,
        "step_s": plain,
        "ratio": stats.min / min(plain),
        "ratio_median": stats.median / statistics.median(plain),
        "pack_alone_s": pack_s,
        "copy_alone_s": copy_s,
        "device": _device(),
    }
    benchmark.extra_info.update(info)
    print(
        f"\n[gpu_step_with_capture batch={batch}] {info['params'] / 1e6:.0f}M params, {nbytes / 1e9:.2f} GB: "
        f"step best {min(plain) * 1e3:.1f} ms, with a capture best {stats.min * 1e3:.1f} ms; "
        f"ratio {info['ratio']:.3f} (medians {info['ratio_median']:.3f}); the capture alone {pack_s * 1e3:.1f} ms, "
        f"its copy {copy_s * 1e3:.1f} ms"
    )


def _device() -> str:
    return torch.cuda.get_device_name()
