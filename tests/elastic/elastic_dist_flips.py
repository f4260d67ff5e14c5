"""A flipped bit in a frame sent over a real gloo link (`DistLink`), run inside spawned processes (importable by
the children). Rank 0 is a core replica (a core group of itself, created once); rank 1 plays a hybrid message by
message over `DistLink`: it joins, attaches, and sends its first active gradient with one bit flipped. Each trial
runs on a link of its own tag, so that the parts of a refused frame that are never received (gloo sends only into
a posted receive) stay on that tag and never meet the next trial.
"""

from __future__ import annotations

import datetime

import elastic_harness as H

from tests.limits import scaled

HYBRID = "h"
FIRST_TAG = 100
MAX_STEPS_PER_TRIAL = 4


def frame(step: int) -> tuple[bytes, list[int]]:
    """The bytes of the GRAD frame the hybrid sends at ``step`` (a gradient of the harness model, every element
    ``step + 0.5``) as DistLink puts them on the wire, and the sizes of its parts (head, meta, blob)."""
    import torch

    from libra.elastic.wire import Kind, Message, _encode_head, _encode_meta, as_bytes

    model, _ = H.make_model()
    size = sum(p.numel() for p in model.parameters())
    blob = as_bytes(torch.full((size,), step + 0.5, dtype=torch.float32))
    msg = Message(kind=Kind.GRAD, step=step, version=step, info={"dtype": "torch.float32"}, blobs=(blob,))
    meta = _encode_meta(msg)
    head = _encode_head(int(msg.kind), step, step, meta)
    raw = head + meta + bytes(blob.numpy())
    return raw, [len(head), len(meta), blob.numel()]


def flipped(raw: bytes, bit: int) -> bytes:
    out = bytearray(raw)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def bits_to_flip() -> list[list[int]]:
    """The flips, each [part, byte offset in it (negative: from its end), bit]: one bit in every byte of the head
    (a different bit position in each), and a few in the meta and the blob. A frame's meta is 69-71 bytes long
    depending on its step, so a flip names its place in a part, not in the frame (`bit_in`)."""
    _, (head, meta, blob) = frame(1)
    in_head = [[0, b, b % 8] for b in range(head)]
    in_meta = [[1, b, 3] for b in (0, 2, meta // 3, meta // 2, -2, -1)]
    in_blob = [[2, b, 6] for b in (0, 1, blob // 2, -1)]
    return in_head + in_meta + in_blob


def bit_in(flip: list[int], sizes: list[int]) -> int:
    """The bit of a frame whose parts have `sizes` that `flip` names."""
    part, offset, bit = flip
    return 8 * (sum(sizes[:part]) + offset % sizes[part]) + bit


def tcp_error(raw: bytes) -> str:
    """The one line a TcpLink gives for these bytes (a socketpair, the sender kept open)."""
    import socket
    import threading

    from libra.elastic.wire import LinkCorrupt, TcpLink

    ours, theirs = socket.socketpair()
    link = TcpLink.__new__(TcpLink)
    link._sock, link._fault, link._send_lock, link.backend = theirs, (lambda _: None), threading.Lock(), "auto"
    try:
        ours.sendall(raw)
        link.recv(timeout=scaled(5))
    except LinkCorrupt as exc:
        return str(exc)
    finally:
        ours.close()
        theirs.close()
    raise AssertionError("TcpLink accepted a frame with a flipped bit")


def _core(bits: list[list[int]]) -> dict:
    import torch.distributed as dist

    from libra.elastic.core import CoreExchange
    from libra.elastic.dist_link import DistLink

    core_group = dist.new_group([0])
    model, opt = H.make_model()
    ex = CoreExchange(
        core_group=core_group, core_rank=0, num_core_replicas=1, model=model, optimizer=opt, timeout_s=scaled(30)
    )
    shards, states, outcomes = [], [], []
    steps = iter(range(10**6))
    for i, bit in enumerate(bits):
        ex.admit(DistLink(1, tag=FIRST_TAG + i))
        failures = ex.stats.failures
        for _ in range(MAX_STEPS_PER_TRIAL):  # a join, then its first active step (the same boundary, when fast)
            t = next(steps)
            _wait_for_joiner(ex)
            a = ex.begin_step(t)
            own = H.local_grads(model, t, a.shard(H.GLOBAL_BATCH))
            mine = [g.clone() for g in own]
            got = ex.reduce(t, own)
            opt.step()
            shards.append((t, a.shard(H.GLOBAL_BATCH)))
            states.append(H.state_bytes(model, opt).hex())
            if ex.stats.failures > failures:
                break
        else:
            raise AssertionError(f"bit {bit}: the hybrid was not failed in {MAX_STEPS_PER_TRIAL} steps")
        raw, sizes = frame(t)
        outcomes.append(
            {
                "bit": bit,
                "step": t,
                "own_bitwise": all(g.equal(m) for g, m in zip(got, mine, strict=True)),
                "why": ex.states.log[-1].why,
                "tcp": tcp_error(flipped(raw, bit_in(bit, sizes))),
                "workers": list(ex.workers()),
                "failures": ex.stats.failures,
                "accepted": ex.stats.accepted,
            }
        )
    ex.close()
    reference, ref_opt = H.make_model()  # a core alone, trained on the same shards
    ref_states = []
    for t, shard in shards:
        H.local_grads(reference, t, shard)
        ref_opt.step()
        ref_states.append(H.state_bytes(reference, ref_opt).hex())
    return {"outcomes": outcomes, "bitwise_steps": [s == r for s, r in zip(states, ref_states, strict=True)]}


def _wait_for_joiner(ex) -> None:
    """Hold the step until the joiner's next message is there (test steps take a millisecond; see `pace`)."""
    import time

    deadline = time.monotonic() + scaled(60)
    while ex.joining and not ex.join_message_waiting():
        if time.monotonic() > deadline:
            raise AssertionError("the hand-played hybrid sent nothing for 60 s")
        time.sleep(0.0005)


def _hybrid(bits: list[list[int]]) -> dict:
    import torch
    import torch.distributed as dist

    from libra.elastic.dist_link import DistLink
    from libra.elastic.wire import Kind, Message

    unmatched = []  # the parts after the flipped one, which a refusing core never receives: never waited for
    modes = []
    for i, bit in enumerate(bits):
        tag = FIRST_TAG + i
        link = DistLink(0, tag=tag)
        link.send(Message(kind=Kind.JOIN, step=-1, version=-1, info={"worker": HYBRID}), timeout=scaled(60))
        snapshot = link.recv(timeout=scaled(60))
        assert snapshot.kind == Kind.SNAPSHOT, snapshot.kind
        link.send(Message(kind=Kind.ATTACH, step=snapshot.version, version=snapshot.version), timeout=scaled(60))
        step = link.recv(timeout=scaled(60))
        assert step.kind == Kind.STEP, step.kind
        modes.append(step.info["mode"])
        raw, sizes = frame(step.step)
        at_bit = bit_in(bit, sizes)
        bad, at, works = flipped(raw, at_bit), 0, []
        for n in sizes:
            part = torch.frombuffer(bytearray(bad[at : at + n]), dtype=torch.uint8)
            works.append((dist.isend(part, dst=0, tag=tag), part))
            at += n
        # gloo moves a send's bytes only once the receiver posts its receive, and here only while the sender waits:
        # wait for the parts up to the flipped one, which the core must receive to find the flip; it posts no
        # receive for the rest (a wait for them would time out and tear the pair down)
        flipped_part = bit[0]
        for work, _ in works[: flipped_part + 1]:
            work.wait(datetime.timedelta(seconds=scaled(60)))
        unmatched += works[flipped_part + 1 :]
    return {"modes": modes}


def flips_over_gloo(rank: int, port: int) -> dict:
    """Entry point of both processes of a gloo world of two."""
    import torch.distributed as dist

    H.init_gloo(rank, 2, port)
    bits = bits_to_flip()
    if rank == 0:
        out = _core(bits)
    else:
        dist.new_group([0])  # every rank of the world takes part in making a group
        out = _hybrid(bits)
    dist.barrier()
    return out
