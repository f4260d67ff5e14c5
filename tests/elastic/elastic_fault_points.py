"""Processes of `test_elastic_fault_points.py`: a hybrid that SIGKILLs itself at one named point, and a core that
SIGKILLs itself while a joiner's snapshot is on its way. The state is large enough (1M parameters plus Adam's two
moments: 12 MB of snapshot, a 4 MB gradient) that a snapshot or a gradient is still in the socket when the process
dies, so the peer sees a frame cut off in the middle, not a whole one followed by a close."""

from __future__ import annotations

import json
import os
import signal

WIDTH, LAYERS, BATCH = 512, 4, 8
#: the snapshot point: die after this many bytes of the snapshot have been received (or sent, on the core)
CUT_BYTES = 1 << 20


def net(warm: bool = True):
    """The model and its Adam; ``warm``: one step taken, so Adam's state exists (the snapshot's layout)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if warm:
        grads(model, -1, slice(0, BATCH))
        opt.step()
    return model, opt


def grads(model, t: int, part: slice) -> list:
    """The gradient of step ``t``'s batch on ``part`` of it (into ``p.grad``)."""
    import torch

    g = torch.Generator().manual_seed(t + 10)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    for p in model.parameters():
        p.grad = None
    torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
    return [p.grad for p in model.parameters()]


def _note(path: str, event: str, **fields) -> None:
    """One unbuffered JSON line (it survives the SIGKILL that follows)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps({"event": event, **fields}) + "\n").encode())
    finally:
        os.close(fd)


def witness(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _die(path: str, point: str) -> None:
    _note(path, "fault", point=point)
    os.kill(os.getpid(), signal.SIGKILL)


def hybrid_child(port: int, point: str, path: str, timeout_s: float) -> None:
    """Join the core on ``port`` and train until detached; SIGKILL at ``point``: "snapshot" (part way through
    receiving it), or a fault point of `HybridReplica`/`TcpLink` ("placeholder", "active", "mid_send:GRAD"), the
    first time it comes. Notes each STEP and each gradient sent in full in ``path``."""
    import torch

    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import Kind, TcpLink

    torch.set_num_threads(1)

    def fault(name: str) -> None:
        if name == point:
            _die(path, name)

    class Link(TcpLink):
        received = 0

        def _recv_into(self, view, deadline: float, part) -> None:
            super()._recv_into(view, deadline, part)
            Link.received += len(view)
            if point == "snapshot" and Link.received > CUT_BYTES:
                _die(path, point)

        def send(self, msg, *, timeout: float) -> None:
            super().send(msg, timeout=timeout)
            if msg.kind == Kind.GRAD:
                _note(path, "grad", step=msg.step)

    model, opt = net(warm=False)  # other values than the core's until the snapshot replaces them
    hy = HybridReplica(worker="h", model=model, optimizer=opt, timeout_s=timeout_s, fault=fault)
    hy.join(Link.connect("127.0.0.1", port, timeout=timeout_s, fault=fault), snapshot_timeout_s=timeout_s)
    train_hybrid(
        hy, model, opt, before=lambda a: _note(path, "step", step=a.step, mode=a.mode.value, replicas=a.num_replicas)
    )
    _note(path, "exit")


def train_hybrid(hy, model, opt, *, before=None, after=None) -> None:
    """A joined hybrid's steps until the core lets it go: its shard's gradients once active, zeros (as its grads)
    while a placeholder; `before(assignment)` and `after(assignment)` around each step."""
    import torch

    from libra.elastic.grads import Mode

    while (a := hy.begin_step()) is not None:
        if before is not None:
            before(a)
        if a.mode == Mode.ACTIVE:
            g = grads(model, a.step, a.shard(BATCH))
        else:
            g = [torch.zeros_like(p) for p in model.parameters()]
            for p, z in zip(model.parameters(), g, strict=True):
                p.grad = z
        hy.reduce(a.step, g)
        opt.step()
        if after is not None:
            after(a)


def core_child(world_port: int, ports, steps: int, timeout_s: float) -> None:
    """A core replica (a world of one) that SIGKILLs itself once it has sent ``CUT_BYTES`` of a joiner's snapshot."""
    import time

    import torch
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.wire import SideChannelServer, TcpLink
    from tests.elastic.elastic_harness import init_gloo

    torch.set_num_threads(1)
    init_gloo(0, 1, world_port)
    group = dist.new_group([0])
    sent = {"bytes": 0}
    plain_sendall = TcpLink._sendall

    def sendall(self, data, deadline: float) -> None:
        sent["bytes"] += len(data)
        if sent["bytes"] > CUT_BYTES:
            os.kill(os.getpid(), signal.SIGKILL)
        plain_sendall(self, data, deadline)

    TcpLink._sendall = sendall  # type: ignore[method-assign]
    model, opt = net()
    server = SideChannelServer(host="127.0.0.1", port=0)
    core = CoreExchange(
        core_group=group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=timeout_s,
        server=server,
    )  # fmt: skip
    ports.put(server.port)
    deadline = time.monotonic() + timeout_s
    while not core.joining and time.monotonic() < deadline:  # the joiner's connection, before step 0
        for link in server.accept_ready():
            core.admit(link)
        time.sleep(0.001)
    for t in range(steps):
        a = core.begin_step(t)
        core.reduce(t, grads(model, t, a.shard(BATCH)))
        opt.step()
