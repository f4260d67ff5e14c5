"""States of a request in the timed rollout, and what work-conserving admission may take from other instances."""

from __future__ import annotations

from libra.spec import SpecError

WAIT, RUN, TOOL, DONE = 0, 1, 2, 3  # queued for admission, decoding, in a tool call (off the GPU), finished
STEAL_MODES = ("new", "all", "off")  # what an idle instance may take from other instances' queues


def check_steal(mode: str) -> None:
    if mode not in STEAL_MODES:
        raise SpecError(f"steal must be one of {', '.join(STEAL_MODES)}, got {mode!r}")
