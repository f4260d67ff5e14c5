"""States of a request in the timed rollout, and what work-conserving admission may take from other instances."""

from __future__ import annotations

from libra.spec import SpecError

WAIT, RUN, TOOL, DONE = 0, 1, 2, 3  # queued for admission, decoding, in a tool call (off the GPU), finished
STEAL_MODES = ("new", "all", "off")  # what an idle instance may take from other instances' queues
DISPATCH_MODES = ("blocks", "interleaved")  # how a step's requests are first spread over a bucket's instances


def check_steal(mode: str) -> None:
    if mode not in STEAL_MODES:
        raise SpecError(f"steal must be one of {', '.join(STEAL_MODES)}, got {mode!r}")


def check_dispatch(mode: str) -> None:
    if mode not in DISPATCH_MODES:
        raise SpecError(f"dispatch must be one of {', '.join(DISPATCH_MODES)}, got {mode!r}")
