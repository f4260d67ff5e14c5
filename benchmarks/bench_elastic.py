"""Elastic hybrid pool (pytest-benchmark): snapshot pack + transfer + unpack, C++ against Python; join time.

    python -m pytest benchmarks/bench_elastic.py --benchmark-only -p no:cacheprovider

- ``test_snapshot_pack_transfer_unpack``: a 100M-parameter fp32 state (parameters + Adam's two moments =
  300M floats, 1.2 GB, in 50 tensors per kind) is packed into 64 MiB buckets, sent with per-bucket CRC-32 over a
  TCP socket on 127.0.0.1 to a receiver thread, checked and unpacked into preallocated tensors. ``native`` uses
  the C++ extension for pack, CRC and unpack; ``python`` the pure-Python reference (torch copies + zlib.crc32).
  Throughput (GB/s of state) is in ``extra_info``. ``LIBRA_BENCH_PARAMS`` overrides the parameter count.
- ``test_snapshot_pack_checksum_unpack_in_memory``: the same without the socket (pack, CRC on both ends,
  unpack), which isolates what the extension changes.
- ``test_join_request_to_active``: one core replica (gloo world of one) steps while a hybrid thread joins over
  TCP: JOIN -> snapshot -> restore -> ATTACH -> one placeholder step -> active. Measured from the hybrid's
  ``join()`` call to its first ``ACTIVE`` step assignment, for a tiny model and a 10M-parameter MLP.

Nothing here asserts a time.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from libra.elastic import native  # noqa: E402
from libra.elastic.pack import checksum, layout_of, pack, unpack  # noqa: E402
from libra.elastic.wire import Kind, Message, SideChannelServer, TcpLink, free_port  # noqa: E402

NUM_PARAMS = int(os.environ.get("LIBRA_BENCH_PARAMS", 100_000_000))
NUM_TENSORS = 50


@pytest.fixture(scope="module")
def state():
    per = NUM_PARAMS // NUM_TENSORS
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(per, generator=gen) for _ in range(NUM_TENSORS)]
    moments = [torch.rand(per, generator=gen) for _ in range(2 * NUM_TENSORS)]
    tensors = params + moments
    return tensors, [torch.empty_like(t) for t in tensors]


def _transfer(tensors, outs, backend: str) -> None:
    server = SideChannelServer(host="127.0.0.1", port=0)
    try:
        sender = TcpLink.connect("127.0.0.1", server.port, timeout=10, backend=backend)
        (receiver,) = server.accept_ready() or _wait_accept(server)
        receiver.backend = backend
        layout = layout_of(tensors)
        got = {}

        def receive() -> None:
            got["msg"] = receiver.recv(timeout=600)

        thread = threading.Thread(target=receive)
        thread.start()
        buckets = pack(tensors, layout, backend=backend)
        sender.send(Message(kind=Kind.SNAPSHOT, step=0, version=0, blobs=tuple(buckets)), timeout=600)
        thread.join()
        unpack(got["msg"].blobs, outs, layout, backend=backend)
        sender.close()
        receiver.close()
    finally:
        server.close()


def _wait_accept(server):
    for _ in range(1000):
        links = server.accept_ready()
        if links:
            return links
        time.sleep(0.005)
    raise TimeoutError("no connection")


@pytest.mark.parametrize("backend", ["native", "python"])
def test_snapshot_pack_transfer_unpack(benchmark, state, backend):
    if backend == "native" and native.load() is None:
        pytest.skip(f"C++ extension not built: {native.load_error()}")
    tensors, outs = state
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    benchmark.pedantic(_transfer, args=(tensors, outs, backend), rounds=3, iterations=1, warmup_rounds=1)
    assert all(torch.equal(a, b) for a, b in zip(tensors[:3], outs[:3]))
    benchmark.extra_info.update(
        {
            "state_bytes": nbytes,
            "num_params": NUM_PARAMS,
            "gb_per_s_mean": nbytes / benchmark.stats.stats.mean / 1e9,
            "gb_per_s_best": nbytes / benchmark.stats.stats.min / 1e9,
        }
    )


def _in_memory(tensors, outs, backend: str) -> None:
    layout = layout_of(tensors)
    buckets = pack(tensors, layout, backend=backend)
    crcs = [checksum(b, backend=backend) for b in buckets]
    assert crcs == [checksum(b, backend=backend) for b in buckets]  # the receiver's check, same buffer
    unpack(buckets, outs, layout, backend=backend)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_snapshot_pack_checksum_unpack_in_memory(benchmark, state, backend):
    """The same state without the socket: what the extension itself changes (pack, 2x CRC, unpack)."""
    if backend == "native" and native.load() is None:
        pytest.skip(f"C++ extension not built: {native.load_error()}")
    tensors, outs = state
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    benchmark.pedantic(_in_memory, args=(tensors, outs, backend), rounds=3, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(
        {
            "state_bytes": nbytes,
            "num_params": NUM_PARAMS,
            "gb_per_s_mean": nbytes / benchmark.stats.stats.mean / 1e9,
            "gb_per_s_best": nbytes / benchmark.stats.stats.min / 1e9,
        }
    )


# -- join time ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    group = dist.new_group([0])
    yield group
    dist.destroy_process_group()


def _mlp(width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _join_once(group, width: int) -> float:
    from libra.elastic.core import CoreExchange
    from libra.elastic.grads import Mode, trainable
    from libra.elastic.hybrid import HybridReplica

    server = SideChannelServer(host="127.0.0.1", port=0)
    model, opt = _mlp(width)
    hmodel, hopt = _mlp(width)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=60, server=server
    )
    hybrid = HybridReplica(worker="h", model=hmodel, optimizer=hopt, timeout_s=60)
    x, y = torch.randn(8, width), torch.randn(8, 4)
    result = {}

    def hybrid_side() -> None:
        start = time.perf_counter()
        hybrid.join(TcpLink.connect("127.0.0.1", server.port, timeout=10))
        while True:
            a = hybrid.begin_step()
            if a is None:
                return
            if a.mode == Mode.ACTIVE and "t" not in result:
                result["t"] = time.perf_counter() - start
            for p in trainable(hmodel):
                p.grad = torch.zeros_like(p)
            hybrid.reduce(a.step, [p.grad for p in trainable(hmodel)])
            hopt.step()

    thread = threading.Thread(target=hybrid_side)
    thread.start()
    step = 0
    while "t" not in result:
        core.begin_step(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        core.reduce(step, [p.grad for p in trainable(model)])
        opt.step()
        step += 1
    core.close()
    thread.join()
    server.close()
    return result["t"]


@pytest.mark.parametrize("width", [8, 3162], ids=["tiny", "10M-params"])
def test_join_request_to_active(benchmark, world, width):
    times = []
    benchmark.pedantic(lambda: times.append(_join_once(world, width)), rounds=5, iterations=1)
    benchmark.extra_info.update({"join_s": times, "num_params": sum(p.numel() for p in _mlp(width)[0].parameters())})
