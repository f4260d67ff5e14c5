"""A core replica (world of one) against a scripted peer that speaks the side-channel protocol badly on purpose.

Each step the peer does one thing; the core must accept only a real gradient for the current step, computed on
the current state version, sent by an active replica, of the right size; anything else is skipped (or, for a
protocol violation, the peer is detached) and the reduced gradient is exactly the core's own. A gradient that
comes late (after the core's timeout) is a miss: the step goes on without it, the peer stays attached, and its
late gradient is dropped as stale the next step.
"""

from __future__ import annotations

import threading

import elastic_harness as H

from tests.limits import scaled

# what the peer sends in each step after it attached (the first STEP after ATTACH is a placeholder step)
SCRIPT = [
    "grad_while_placeholder",
    "wrong_version",
    "stale_then_good",
    "wrong_size",
    "late",
    "good",
    "future_step",
]


CORE_TIMEOUT_S = scaled(1.0)  # the core's receive timeout; "late" sends 1.3 of it after the STEP


def _peer(port: int, log: list) -> None:
    import time

    import torch

    from libra.elastic.wire import Kind, Message, TcpLink, as_bytes

    link = TcpLink.connect("127.0.0.1", port, timeout=scaled(10))
    link.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": "mallory"}), timeout=scaled(10))
    snap = link.recv(timeout=scaled(10))
    link.send(Message(kind=Kind.ATTACH, step=snap.version, version=snap.version), timeout=scaled(10))
    n = sum(p.numel() for p in H.make_model()[0].parameters())
    info = {"dtype": "torch.float32"}
    for action in SCRIPT:
        step_msg = link.recv(timeout=scaled(10))
        assert step_msg.kind == Kind.STEP, step_msg.kind
        t = step_msg.step
        g = torch.full((n,), 0.5)

        def grad(step, version, blob=g):
            return Message(kind=Kind.GRAD, step=step, version=version, info=info, blobs=(as_bytes(blob),))

        if action == "grad_while_placeholder":
            link.send(grad(t, t), timeout=scaled(10))
        elif action == "wrong_version":
            link.send(grad(t, t - 1), timeout=scaled(10))
        elif action == "stale_then_good":
            link.send(grad(t - 1, t - 1), timeout=scaled(10))
            link.send(grad(t, t), timeout=scaled(10))
        elif action == "wrong_size":
            link.send(grad(t, t, torch.full((n + 1,), 0.5)), timeout=scaled(10))
        elif action == "late":
            time.sleep(1.3 * CORE_TIMEOUT_S)
            link.send(grad(t, t), timeout=scaled(10))
        elif action == "good":
            link.send(grad(t, t), timeout=scaled(10))
        elif action == "future_step":
            link.send(grad(t + 1, t + 1), timeout=scaled(10))
            log.append((action, t, step_msg.info["mode"]))
            break
        reduced = link.recv(timeout=scaled(10))
        log.append((action, t, step_msg.info["mode"], reduced.kind.name))
    link.close()


def adversary() -> dict:
    import torch
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.grads import flatten
    from libra.elastic.wire import SideChannelServer, free_port

    H.init_gloo(0, 1, free_port())
    group = dist.new_group([0])
    server = SideChannelServer(host="127.0.0.1", port=0)  # the kernel picks a free port, atomically
    port = server.port
    model, opt = H.make_model()
    ex = CoreExchange(
        core_group=group,
        core_rank=0,
        num_core_replicas=1,
        model=model,
        optimizer=opt,
        timeout_s=CORE_TIMEOUT_S,
        server=server,
        min_placeholder_steps=1,
    )
    log: list = []
    peer = threading.Thread(target=_peer, args=(port, log))
    peer.start()
    results = []
    t = 0
    while peer.is_alive() or ex.workers():
        while ex.joining and not ex.join_message_waiting():
            threading.Event().wait(0.001)
        a = ex.begin_step(t)
        own = flatten(H.local_grads(model, t, a.shard(H.GLOBAL_BATCH))).clone()
        grads = H.local_grads(model, t, a.shard(H.GLOBAL_BATCH))
        ex.reduce(t, grads)
        reduced = flatten(grads)
        rec = ex.records[-1]
        results.append(
            {
                "step": t,
                "num_replicas": rec.num_replicas,
                "contributed": rec.num_contributed,
                "equals_own": bool(torch.equal(reduced, own)),
                "equals_mean_with_peer": bool(torch.equal(reduced, (own + 0.5) / 2)),
            }
        )
        opt.step()
        t += 1
        if t > 40:
            break
    peer.join()
    out = {
        "results": results,
        "peer_log": log,
        "stats": [ex.stats.accepted, ex.stats.placeholders, ex.stats.skipped, ex.stats.failures, ex.stats.missed],
        "states": [(tr.step, tr.event.value, tr.dst.value, tr.why) for tr in ex.states.log],
    }
    ex.close()
    server.close()
    dist.destroy_process_group()
    return out
