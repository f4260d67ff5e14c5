"""A flipped bit in a frame over a real gloo link (`DistLink`, docs/elastic.md "Failures"): the receiver checks a
frame's head, meta and blobs as a `TcpLink` does, so a gradient with one bit flipped in its head, its meta or its
payload is refused with the very line TCP gives, the core fails that hybrid and applies nothing of it, and every
byte of the core's state after every step is that of a core alone trained on the same shards."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import elastic_dist_flips as F  # noqa: E402
import elastic_harness as H  # noqa: E402

from libra.elastic.wire import free_port  # noqa: E402
from tests.limits import scaled  # noqa: E402


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_a_gradient_with_a_flipped_bit_over_gloo_is_refused_as_over_tcp_and_never_applied(tmp_path):
    port = free_port()
    core, hybrid = H.run_processes(
        [(F.flips_over_gloo, (r, port)) for r in range(2)], tmp=tmp_path, timeout_s=scaled(240)
    )
    bits = F.bits_to_flip()
    assert hybrid["modes"] == ["active"] * len(bits)  # each flipped frame was a contribution the core would add
    outcomes = core["outcomes"]
    assert [o["bit"] for o in outcomes] == bits
    for n, o in enumerate(outcomes, start=1):
        where = f"flip {o['bit']} (part, byte offset, bit)"
        assert o["why"] == f"no contribution for step {o['step']}: {o['tcp']}", where
        assert "\n" not in o["why"], where
        assert o["own_bitwise"], f"{where}: the core's reduced gradient is not its own"
        assert o["workers"] == [] and o["failures"] == n and o["accepted"] == 0, (where, o)
    assert all(core["bitwise_steps"]) and len(core["bitwise_steps"]) >= len(bits)


def test_every_flip_lands_in_its_part_whatever_the_step():
    """A frame's meta is 69-71 bytes long depending on its step, and the trial's step depends on timing: each flip
    must name a bit of its own part in every frame (an absolute bit taken from step 1's frame ran past the end of
    step 9's, 349 bytes, once the core was there)."""
    for step in range(0, 40):
        raw, sizes = F.frame(step)
        ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        for flip in F.bits_to_flip():
            byte = F.bit_in(flip, sizes) // 8
            assert byte < len(raw) and sum(byte >= end for end in ends) == flip[0], (step, flip)
