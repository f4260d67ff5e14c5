"""Elastic state transfer at the hardware limit (pytest-benchmark). Each benchmark measures its physical baseline in
the same run, round by round (in pytest-benchmark's untimed ``setup``, just before each timed round), and puts the
ratio in ``extra_info``; a summary line per benchmark is printed (run with ``-s`` to see it).

    python -m pytest benchmarks/bench_elastic.py --benchmark-only -p no:cacheprovider -s
    LIBRA_BENCH_PARAMS=10000000 python -m pytest benchmarks/bench_elastic.py ...   # quick: 10M parameters

The state is ``LIBRA_BENCH_PARAMS`` fp32 parameters (default 100M) plus Adam's two moments: 1.2 GB in 150 tensors.
``test_join`` steps both replicas with torch's fused Adam (``LIBRA_BENCH_ADAM=fused``, the default since 2026-12-04;
``foreach`` or ``for-loop``, torch's default for CPU tensors and the setting of every earlier result, are the others).
``THP_MEM_ALLOC_ENABLE=1`` (torch's switch, inherited by the spawned processes) backs every large CPU tensor with
transparent huge pages; the summary line then says "huge pages".
The machine is shared: run these one at a time (``-k``), and read ratios, not absolute times.

- ``test_pack_checksum_unpack`` (issue 16, target 1): ``pack_checksummed`` + ``unpack`` of the state against a
  memcpy of the same bytes (numpy, tensor by tensor into memory already touched; the best of one thread and the
  pack pool's threads, i.e. this machine's copy bandwidth). ``fresh`` packs into new buckets (what a first join
  does: the kernel zero-fills every new page), ``reused`` into buckets kept from the previous round, ``verify``
  (reused buckets) adds the receiver's checksum pass (needed in memory; over TCP it is fused with the receive),
  ``python`` and ``native`` are the reference and the C++ extension (both allocate new buckets, and hash in a
  separate pass). Pack and unpack each copy the state once, so the ceiling of
  the ratio against one memcpy is 0.5; ``ratio_per_copy`` divides by the two copies.
- ``test_pack_checksum_adopt`` (target 1 as a receiver does it): ``pack_checksummed`` + ``adopt``, the unpack that
  rebinds each tensor to its slot instead of copying (what ``restore(share_buckets=True)`` does with a received
  snapshot), into two sets of buckets in turn: one copy, so the ratio's ceiling is 1.
- ``test_tcp_transfer`` (target 2): ``TcpLink.send`` of the packed buckets with their checksums to a receiver
  process whose ``TcpLink.recv`` verifies every window as it lands, into preallocated buckets, against a plain
  ``sendall`` / ``recv_into`` loop of the same bytes between the same two processes on 127.0.0.1.
- ``test_join`` (targets 3 and 4): a core replica (gloo world of one, this process) trains an MLP of about
  ``LIBRA_BENCH_PARAMS`` parameters with Adam while a hybrid replica in another process joins over TCP: JOIN ->
  snapshot (packed on a background thread during the core's forward/backward, sent as soon as it is packed) -> restore
  -> ATTACH -> ACTIVE (at the boundary that reads the ATTACH). ``join_s`` is the hybrid's ``join()`` call to its first
  ACTIVE step; the core's step times without a join and during each phase of the join are in ``extra_info``. A step
  "during a join" is one from the step whose boundary reads the JOIN to the one whose boundary makes the hybrid active
  (until 2026-12-03 17:40 UTC the steps before the core read the JOIN counted too, which pulled the median towards the
  quiet steps). ``[shared]``: both processes may use both CPUs (the core with torch's default threads);
  ``[separate]``: one CPU each, as replicas on their own devices have (the core's background pack and sends stay on
  the core's CPU). ``[new]``: a new hybrid process for each join (its first join: the snapshot arrives in new memory);
  ``[prepared]``: the same, but the process lays its state out in buckets at start (``HybridReplica.prepare``, not
  timed) and receives into them; ``[kept]``: one hybrid process joins, leaves and joins again, as a worker borrowed
  again (from its second join on the snapshot arrives in the memory its state lives in). One core serves every join of
  a run. ``[separate]`` also measures target 3's ceiling here (``step_ratio_floor``): the CPU a plain ``sendall`` of
  one gradient's bytes costs the core's CPU, to a process on the hybrid's, over a quiet core step. Every step of a
  join sends the joiner at least that much (the state, or a step's gradient to replay), so no join over loopback
  from the core's one CPU has a smaller step ratio.

Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from libra.elastic import native  # noqa: E402
from libra.elastic import pack as pack_mod  # noqa: E402
from libra.elastic.core import CoreExchange  # noqa: E402
from libra.elastic.grads import trainable  # noqa: E402
from libra.elastic.pack import adopt, checksums, layout_of, pack_checksummed, unpack  # noqa: E402
from libra.elastic.states import JoinState  # noqa: E402
from libra.elastic.wire import Kind, Message, SideChannelServer, TcpLink  # noqa: E402

NUM_PARAMS = int(os.environ.get("LIBRA_BENCH_PARAMS", 100_000_000))
NUM_TENSORS = 50
ROUNDS = int(os.environ.get("LIBRA_BENCH_ROUNDS", 3))
#: Target 1's rounds take a tenth of a second each: ten of them find the machine's good moments as well.
MEMORY_ROUNDS = int(os.environ.get("LIBRA_BENCH_ROUNDS", 10))
#: Core steps measured without a join before each join (the hybrid process started and waiting).
QUIET_STEPS = 5
#: torch's Adam in ``test_join``, core and hybrid alike: ``fused`` (one kernel over all tensors, on the CPU since
#: torch 2.4; 0.07 s a step at 100M parameters here), ``foreach`` (0.36 s) or ``for-loop`` (what
#: ``torch.optim.Adam(params)`` picks for CPU tensors, 0.53 s; every result in benchmarks/README.md before
#: 2026-12-04 20:30 UTC).
ADAM_OPTIONS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
ADAM = os.environ.get("LIBRA_BENCH_ADAM", "fused")
if ADAM not in ADAM_OPTIONS:
    raise SystemExit(f"LIBRA_BENCH_ADAM={ADAM!r}: expected one of {', '.join(ADAM_OPTIONS)}")
#: ``test_join``'s core calls ``CoreExchange.prepare()`` after its first step (since 2026-12-04 21:00 UTC), so its
#: first join packs into memory already touched; ``LIBRA_BENCH_PREPARE_CORE=0``: as before, into new memory.
PREPARE_CORE = os.environ.get("LIBRA_BENCH_PREPARE_CORE", "1") != "0"
#: torch's own switch (read by every process at its first allocation): its CPU allocations of 2 MiB and more are
#: 2 MiB aligned and advised as transparent huge pages (docs/elastic.md, "Transparent huge pages").
THP = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") not in ("", "0")


def _timed(fn, cpu: list[float] | None = None) -> float:
    """Wall seconds of ``fn()``; its CPU seconds (this process, all threads) are appended to ``cpu``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    if cpu is not None:
        cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def _cpu_timed(fn, cpu: list[float]):
    """``fn`` wrapped to record its CPU seconds: on a shared machine CPU time is the work done, wall time also
    counts the other jobs' share of the cores."""
    return lambda: _timed(fn, cpu)


def _report(
    benchmark,
    name: str,
    baseline_name: str,
    baseline_s: list[float],
    nbytes: int,
    cpu: tuple[list[float], list[float]] | None = None,
    **extra,
) -> None:
    """extra_info: both sides' best and median, the ratio of bests (baseline time / measured time) and, where
    ``cpu`` (baseline's, measured's CPU seconds) is given, the ratio of their best CPU times."""
    stats = benchmark.stats.stats
    ratio = min(baseline_s) / stats.min
    if cpu is not None:
        extra = {"cpu_ratio": min(cpu[0]) / min(cpu[1]), "cpu_s": min(cpu[1]), "baseline_cpu_s": min(cpu[0]), **extra}
    info = {
        "state_bytes": nbytes,
        "gb_per_s_best": nbytes / stats.min / 1e9,
        "baseline": baseline_name,
        "baseline_s": baseline_s,
        "baseline_gb_per_s_best": nbytes / min(baseline_s) / 1e9,
        "ratio": ratio,
        "ratio_median": statistics.median(baseline_s) / stats.median,
        **extra,
    }
    benchmark.extra_info.update(info)
    more = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
    print(
        f"\n[{name}] {nbytes / 1e9:.2f} GB: best {stats.min:.3f} s ({info['gb_per_s_best']:.2f} GB/s); "
        f"{baseline_name} best {min(baseline_s):.3f} s ({info['baseline_gb_per_s_best']:.2f} GB/s); "
        f"ratio {ratio:.2f} (medians {info['ratio_median']:.2f}) {more}"
    )


@pytest.fixture(scope="module")
def state():
    per = NUM_PARAMS // NUM_TENSORS
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(per, generator=gen) for _ in range(NUM_TENSORS)]
    moments = [torch.rand(per, generator=gen) for _ in range(2 * NUM_TENSORS)]
    tensors = params + moments
    outs = [torch.zeros_like(t) for t in tensors]  # touched: unpack writes into memory that is already mapped
    return tensors, outs, layout_of(tensors)


# -- target 1: pack + checksum + unpack in memory ---------------------------------------------------------------


def _memcpy_baseline(tensors, outs, cpu: list[float]) -> float:
    """This machine's copy bandwidth for these bytes: the faster of one thread and the pack pool's threads (the
    single-threaded copy's CPU time goes to ``cpu``)."""
    srcs = [t.numpy() for t in tensors]
    dsts = [t.numpy() for t in outs]

    def single():
        for s, d in zip(srcs, dsts, strict=True):
            np.copyto(d, s)

    def pooled():
        pack_mod._run([lambda s=s, d=d: np.copyto(d, s) for s, d in zip(srcs, dsts, strict=True)], 1 << 40)

    return min(_timed(single, cpu), _timed(pooled))


def _rounds_against_memcpy(benchmark, one_round, tensors, outs) -> tuple[list[float], tuple[list[float], list[float]]]:
    """Time ``one_round`` for ``MEMORY_ROUNDS`` rounds, each after a memcpy baseline of the same bytes (untimed
    setup). Returns the baseline's wall seconds and (baseline's, measured's) CPU seconds."""
    baseline: list[float] = []
    cpu: tuple[list[float], list[float]] = ([], [])
    benchmark.pedantic(
        _cpu_timed(one_round, cpu[1]),
        setup=lambda: baseline.append(_memcpy_baseline(tensors, outs, cpu[0])),
        rounds=MEMORY_ROUNDS,
        iterations=1,
    )
    return baseline, cpu


@pytest.mark.parametrize("variant", ["fresh", "reused", "verify", "native", "python"])
def test_pack_checksum_unpack(benchmark, state, variant):
    if variant == "native" and native.load() is None:
        pytest.skip(f"C++ extension not built: {native.load_error()}")
    tensors, outs, layout = state
    nbytes = layout.total_bytes
    backend = variant if variant in ("native", "python") else "auto"
    kept: list = []

    def one_round():
        buckets, sums = pack_checksummed(tensors, layout, backend=backend, out=kept[0] if kept else None)
        if variant == "verify":
            assert checksums(buckets) == sums
        unpack(buckets, outs, layout, backend=backend)
        if variant in ("reused", "verify") and not kept:
            kept.append(buckets)

    if variant in ("reused", "verify"):
        one_round()  # the buckets every timed round reuses
    baseline, cpu = _rounds_against_memcpy(benchmark, one_round, tensors, outs)
    one_round()
    assert all(torch.equal(a, b) for a, b in zip(tensors, outs, strict=True))
    _report(
        benchmark,
        f"pack_checksum_unpack[{variant}]",
        "memcpy",
        baseline,
        nbytes,
        cpu,
        ratio_per_copy=2 * min(baseline) / benchmark.stats.stats.min,
        threads=pack_mod.workers(),
    )


def test_pack_checksum_adopt(benchmark, state):
    """Target 1 with the unpack a receiver makes (``restore(share_buckets=True)``): no copy, the state's tensors
    are rebound to their slots (:func:`~libra.elastic.pack.adopt`). Two sets of buckets take turns, as a replica
    that receives snapshot after snapshot would: each round packs into the set the state does not hold (so, from
    the third round, into memory already mapped), then the state adopts it and lets go of the other."""
    tensors, outs, layout = state
    held = [torch.empty_like(t) for t in tensors]  # the receiving state (its memory is released by the first adopt)
    sets: list = []  # [free, held]

    def one_round():
        buckets, _ = pack_checksummed(tensors, layout, out=sets[0] if len(sets) == 2 else None)
        adopt(buckets, held, layout)
        sets[:] = [sets[-1], buckets] if sets else [buckets]

    one_round()
    one_round()  # both sets exist and have been written: every timed round packs into mapped memory
    baseline, cpu = _rounds_against_memcpy(benchmark, one_round, tensors, outs)
    assert all(torch.equal(a, b) for a, b in zip(tensors, held, strict=True))
    lo_hi = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in sets[1]]
    assert all(any(lo <= t.data_ptr() < hi for lo, hi in lo_hi) for t in held)  # zero-copy: in the held buckets
    _report(benchmark, "pack_checksum_adopt", "memcpy", baseline, layout.total_bytes, cpu, threads=pack_mod.workers())


# -- target 2: transfer over TCP between two processes ----------------------------------------------------------


def _receiver(port: int, sizes: list[int], control) -> None:
    """The receiving process: one raw socket and one TcpLink, preallocated (touched) buffers, one reply per round."""
    import numpy as np  # noqa: F811 - a spawned process
    import torch  # noqa: F811

    from libra.elastic.wire import TcpLink  # noqa: F811

    raw = socket.create_connection(("127.0.0.1", port))
    link = TcpLink.connect("127.0.0.1", port, timeout=30)
    bufs = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    views = [memoryview(b.numpy()).cast("B") for b in bufs]
    control.send("ready")
    while True:
        cmd = control.recv()
        if cmd == "raw":
            for view in views:  # the plain loop: recv_into until the buffer is full
                got = 0
                while got < len(view):
                    n = raw.recv_into(view[got:])
                    if n == 0:
                        raise ConnectionError("sender closed")
                    got += n
            control.send("done")
        elif cmd == "link":
            msg = link.recv(timeout=600, into=lambda i, n: bufs[i])
            control.send(("done", list(msg.checksums)))
        else:
            raw.close()
            link.close()
            del np
            return


@pytest.fixture(scope="module")
def peer(state):
    tensors, _, layout = state
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    ctx = mp.get_context("spawn")
    control, child_end = ctx.Pipe()
    proc = ctx.Process(
        target=_receiver, args=(listener.getsockname()[1], list(layout.bucket_sizes), child_end), daemon=True
    )
    proc.start()
    raw, _ = listener.accept()
    link_sock, _ = listener.accept()
    assert control.poll(300) and control.recv() == "ready"
    buckets, sums = pack_checksummed(tensors, layout)
    yield raw, TcpLink(link_sock), control, buckets, sums
    control.send("stop")
    proc.join(30)
    listener.close()


def test_tcp_transfer(benchmark, peer, state):
    raw, link, control, buckets, sums = peer
    nbytes = state[2].total_bytes
    views = [memoryview(b.numpy()).cast("B") for b in buckets]
    baseline: list[float] = []

    def raw_round():
        control.send("raw")
        for view in views:
            raw.sendall(view)
        assert control.recv() == "done"

    def link_round():
        control.send("link")
        link.send(
            Message(kind=Kind.SNAPSHOT, step=0, version=0, blobs=tuple(buckets), checksums=tuple(sums)), timeout=600
        )
        reply, got = control.recv()
        assert reply == "done" and got == sums

    raw_round()  # warm both connections (TCP windows)
    link_round()
    benchmark.pedantic(link_round, setup=lambda: baseline.append(_timed(raw_round)), rounds=ROUNDS, iterations=1)
    _report(benchmark, "tcp_transfer", "raw sendall/recv_into", baseline, nbytes)


# -- targets 3 and 4: a join while the core trains ----------------------------------------------------------------


def NUM_PARAMS_OF(width: int) -> int:  # noqa: N802
    return width * width + width + 4 * width + 4


def _width(num_params: int) -> int:
    return max(8, int(round(num_params**0.5)))


def _mlp(width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3, **ADAM_OPTIONS[ADAM])


def _hybrid(port: int, width: int, worker: str, control, cpus: set[int] | None, prepare: bool) -> None:
    """The hybrid process: build the model (and ``prepare`` its state's buckets), then for each "go": join, step
    until ACTIVE, report, leave (until "stop"). ``cpus``: the CPUs it may run on (None: any)."""
    import torch  # noqa: F811

    from libra.elastic.grads import Mode, trainable
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import TcpLink  # noqa: F811

    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(1)
    model, opt = _mlp(width)
    for p in trainable(model):  # Adam state exists, as on the core (restore replaces it)
        p.grad = torch.zeros_like(p)
    opt.step()
    hybrid = HybridReplica(worker=worker, model=model, optimizer=opt, timeout_s=600)
    if prepare:
        hybrid.prepare()
    control.send("ready")
    while control.recv() == "go":
        start = time.perf_counter()
        hybrid.join(TcpLink.connect("127.0.0.1", port, timeout=30), snapshot_timeout_s=600)
        restored = time.perf_counter() - start
        while True:
            a = hybrid.begin_step()
            if a is None:
                control.send(("left", None, None))
                break
            if a.mode == Mode.ACTIVE:
                control.send(("active", time.perf_counter() - start, restored))
                hybrid.leave("benchmark done")
                break
            grads = [torch.zeros_like(p) for p in trainable(model)]
            hybrid.reduce(a.step, grads)
            for p, g in zip(trainable(model), grads, strict=True):
                p.grad = g
            opt.step()


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    from libra.elastic.wire import free_port

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    group = dist.new_group([0])
    yield group
    dist.destroy_process_group()


class _Core:
    """The core replica of ``test_join``: one model, optimizer and ``CoreExchange`` for every join of a run, as a
    long-running core serves join after join (its first join packs into new buckets; later ones reuse them)."""

    def __init__(self, group, width: int) -> None:
        self.server = SideChannelServer(host="127.0.0.1", port=0)
        self.model, self.opt = _mlp(width)
        self.exchange = CoreExchange(
            core_group=group,
            core_rank=0,
            num_core_replicas=1,
            model=self.model,
            optimizer=self.opt,
            timeout_s=600,
            snapshot_timeout_s=600,
            server=self.server,
        )
        self.x, self.y = torch.randn(8, width), torch.randn(8, 4)
        self.next_step = 0
        if PREPARE_CORE:  # after one step, so that Adam's state exists and the sizes are the snapshots'
            self.step()
            self.exchange.prepare()

    def step(self) -> tuple[float, float]:
        """One training step: (wall seconds, CPU seconds of this process, every thread: the background pack and
        sends included)."""
        step, self.next_step = self.next_step, self.next_step + 1
        start, start_cpu = time.perf_counter(), time.process_time()
        self.exchange.begin_step(step)
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.exchange.reduce(step, [p.grad for p in trainable(self.model)])
        self.opt.step()
        return time.perf_counter() - start, time.process_time() - start_cpu

    def close(self) -> None:
        self.exchange.close()
        self.server.close()


def _start_hybrid(core: _Core, width: int, worker: str, hybrid_cpus: set[int] | None, prepare: bool = False):
    """Start a hybrid process; the core steps while it starts (imports, builds its model): steps not counted."""
    ctx = mp.get_context("spawn")
    control, child_end = ctx.Pipe()
    args = (core.server.port, width, worker, child_end, hybrid_cpus, prepare)
    proc = ctx.Process(target=_hybrid, args=args, daemon=True)
    proc.start()
    while not control.poll():
        core.step()
    assert control.recv() == "ready"
    return proc, control


def _stop_hybrid(proc, control) -> None:
    control.send("stop")
    proc.join(60)


def _join_once(core: _Core, control, out: dict) -> None:
    """One join of the hybrid behind ``control``, which is waiting for "go"."""
    quiet, quiet_cpu, during_cpu = [], [], []
    for _ in range(QUIET_STEPS):  # steps without a join, the hybrid waiting
        wall, cpu = core.step()
        quiet.append(wall)
        quiet_cpu.append(cpu)
    control.send("go")
    # each step by where the join stands at its end: "requested", the core has not read the JOIN yet (it did nothing
    # for the join: not a step with a join in progress); "fetching", it read the JOIN in this step or before and
    # the ATTACH not yet; then "placeholder" or "active" (the hybrid promoted at this step's boundary; the benchmark's
    # hybrid leaves as soon as it is active, so its LEAVE may end that step without it)
    phases: dict[str, list[float]] = {"requested": [], "fetching": [], "placeholder": [], "active": []}
    states = (
        (JoinState.FETCHING_STATE, "fetching"),
        (JoinState.PLACEHOLDER, "placeholder"),
        (JoinState.ACTIVE, "active"),
    )
    read = False  # the core has read the JOIN
    while not control.poll():
        wall, cpu = core.step()
        phase = next((name for state, name in states if core.exchange.workers(state)), None)
        if phase is None:  # no JOIN read yet; or promoted at this boundary and gone already (it leaves once active)
            phase = "active" if read else "requested"
        read = phase != "requested"
        phases[phase].append(wall)
        if phase != "requested":
            during_cpu.append(cpu)
    status, join_s, restored_s = control.recv()
    assert status == "active", status
    out.update(
        quiet=quiet,
        quiet_cpu=quiet_cpu,
        during_cpu=during_cpu,
        phases=phases,
        join_s=join_s,
        restored_s=restored_s,
    )


def _raw_sink(port: int, cpus: set[int], nbytes: int) -> None:
    """The receiving end of ``_send_floor``: on ``cpus``, ``recv_into`` one preallocated buffer until ``nbytes``
    arrived, a one-byte reply, again until the sender closes."""
    os.sched_setaffinity(0, cpus)
    sock = socket.create_connection(("127.0.0.1", port))
    view = memoryview(bytearray(nbytes))
    while True:
        got = 0
        while got < nbytes:
            n = sock.recv_into(view[got:])
            if n == 0:
                sock.close()
                return
            got += n
        sock.sendall(b"k")


def _send_floor(hybrid_cpus: set[int], sizes: dict[str, int], rounds: int = 3) -> dict[str, float]:
    """The least CPU time this process spends to move ``sizes[name]`` bytes to a process on ``hybrid_cpus`` over
    loopback: a plain ``sendall`` from memory already touched (no pack, no hash, no protocol), the best of
    ``rounds``. Run with the core's CPU pinning (``_cpus("separate")``)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    out = {}
    for name, nbytes in sizes.items():
        proc = mp.get_context("spawn").Process(
            target=_raw_sink, args=(listener.getsockname()[1], hybrid_cpus, nbytes), daemon=True
        )
        proc.start()
        conn, _ = listener.accept()
        data = memoryview(np.ones(nbytes, dtype=np.uint8)).cast("B")
        cpu: list[float] = []
        for _ in range(rounds + 1):  # (the first round warms the connection)
            start = time.process_time()
            conn.sendall(data)
            conn.recv(1)
            cpu.append(time.process_time() - start)
        conn.close()
        proc.join(60)
        out[name] = min(cpu[1:])
    listener.close()
    return out


@contextlib.contextmanager
def _cpus(layout: str):
    """``shared``: both replicas may run anywhere, the core with torch's default threads (on two cores, the hybrid's
    work during a join takes one of the core's). ``separate``: one CPU each, as replicas on their own devices
    would have: this process (the core's training, and its background pack and sends) on the first CPU with one
    torch thread and one pack thread, the hybrid process on the second. Yields the hybrid's CPUs."""
    if layout == "shared":
        yield None
        return
    first, second, *_ = sorted(os.sched_getaffinity(0))
    before = (os.sched_getaffinity(0), torch.get_num_threads(), os.environ.get("LIBRA_PACK_THREADS"))
    os.sched_setaffinity(0, {first})
    torch.set_num_threads(1)
    os.environ["LIBRA_PACK_THREADS"] = "1"
    try:
        yield {second}
    finally:
        os.sched_setaffinity(0, before[0])
        torch.set_num_threads(before[1])
        if before[2] is None:
            os.environ.pop("LIBRA_PACK_THREADS")
        else:
            os.environ["LIBRA_PACK_THREADS"] = before[2]


@pytest.mark.parametrize("hybrid", ["new", "prepared", "kept"])
@pytest.mark.parametrize("cpus", ["shared", "separate"])
def test_join(benchmark, world, cpus, hybrid):
    if cpus == "separate" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the separate layout needs two CPUs")
    width = _width(NUM_PARAMS)
    runs: list[dict] = []

    core = _Core(world, width)
    kept: list = []  # the one hybrid process of hybrid="kept"

    def one():
        out: dict = {}
        with _cpus(cpus) as hybrid_cpus:
            if hybrid != "kept":
                proc, control = _start_hybrid(core, width, f"h{len(runs)}", hybrid_cpus, hybrid == "prepared")
                _join_once(core, control, out)
                _stop_hybrid(proc, control)
            else:
                if not kept:
                    kept.extend(_start_hybrid(core, width, "h", hybrid_cpus))
                _join_once(core, kept[1], out)
        runs.append(out)

    try:
        benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    finally:
        if kept:
            _stop_hybrid(*kept)
        core.close()
    floor: dict[str, float] = {}
    if cpus == "separate":  # the ceiling of target 3 on this machine, measured in the same run (docs/elastic.md)
        num_params = NUM_PARAMS_OF(width)
        with _cpus(cpus) as hybrid_cpus:
            floor = _send_floor(hybrid_cpus, {"gradient": 4 * num_params, "state": 12 * num_params})
    quiet = [t for r in runs for t in r["quiet"]]
    during = [t for r in runs for p, ts in r["phases"].items() if p != "requested" for t in ts]
    fetching = [t for r in runs for t in r["phases"]["fetching"]]
    joins = [r["join_s"] for r in runs]
    info = {
        "num_params": NUM_PARAMS_OF(width),
        "adam": ADAM,
        "core_prepared": PREPARE_CORE,
        "transparent_huge_pages": THP,
        "join_s": joins,
        "restored_s": [r["restored_s"] for r in runs],
        "core_step_s_without_join_median": statistics.median(quiet),
        "core_step_s_during_join_median": statistics.median(during),
        "core_step_s_while_fetching_median": statistics.median(fetching) if fetching else None,
        "step_ratio_during_join": statistics.median(during) / statistics.median(quiet),
        "core_step_cpu_s_without_join_median": statistics.median(c for r in runs for c in r["quiet_cpu"]),
        "core_step_cpu_s_during_join_median": statistics.median(c for r in runs for c in r["during_cpu"]),
        "join_in_core_steps": [r["join_s"] / statistics.median(r["quiet"]) for r in runs],
        "phases": [{k: v for k, v in r["phases"].items()} for r in runs],
        "quiet": [r["quiet"] for r in runs],
    }
    if floor:
        # every step from the one that reads the JOIN to the one that makes the hybrid active costs the core at
        # least one gradient's send (the replay, or the state itself, three gradients' worth with Adam), so no
        # join that replays gradients over loopback from the core's one CPU has a smaller step ratio than this
        info["send_cpu_s_floor"] = floor
        info["step_ratio_floor"] = 1 + floor["gradient"] / info["core_step_s_without_join_median"]
    later = [t for r in runs[1:] for p, ts in r["phases"].items() if p != "requested" for t in ts]  # buckets reused
    if later:
        info["step_ratio_during_later_joins"] = statistics.median(later) / statistics.median(quiet)
    benchmark.extra_info.update(info)
    cpu_quiet, cpu_during = info["core_step_cpu_s_without_join_median"], info["core_step_cpu_s_during_join_median"]
    print(
        f"\n[join, {cpus} CPUs, {hybrid} hybrid, {ADAM} Adam, core {'prepared' if PREPARE_CORE else 'not prepared'}"
        f"{', huge pages' if THP else ''}] "
        f"{info['num_params']:,} params: "
        f"join_s median {statistics.median(joins):.2f} (min {min(joins):.2f}; each {[round(v, 2) for v in joins]}); "
        f"restored_s {[round(v, 2) for v in info['restored_s']]}; "
        f"core step median {info['core_step_s_without_join_median']:.3f} s "
        f"without a join, {info['core_step_s_during_join_median']:.3f} s during one "
        f"(ratio {info['step_ratio_during_join']:.2f}; joins after the first "
        f"{info.get('step_ratio_during_later_joins', float('nan')):.2f}); "
        f"CPU per core step median {cpu_quiet:.3f} s without, "
        f"{cpu_during:.3f} s during (ratio {cpu_during / cpu_quiet:.2f}); "
        f"join in core steps {[round(v, 1) for v in info['join_in_core_steps']]}; phases {info['phases']}"
        + (
            f"; floor: a raw send from the core's CPU takes {floor['gradient']:.3f} s of CPU for one gradient, "
            f"{floor['state']:.3f} s for the state, so the step ratio is at least {info['step_ratio_floor']:.2f}"
            if floor
            else ""
        )
    )
