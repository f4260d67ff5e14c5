"""The run's checkpoint, `checkpoint/state.pt`: trainer + optimizer state, the router (pickled after the rollout
of the last completed step), plan, placement, step counter, the ids already trained, recent trajectories.

Written atomically (temporary file + rename) on a background thread from a copy taken at the step boundary, so a
crash at any moment leaves either the previous checkpoint or the new one."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

from libra.runtime.config import RunConfigError
from libra.spec.files import write_whole

DIR, FILE = "checkpoint", "state.pt"
# what a resume reads from the checkpoint
KEYS = frozenset({"next_step", "trainer", "router", "plan", "placement", "history", "trained", "losses"})


def save_in_background(out: Path, state: dict[str, Any]) -> threading.Thread:
    """Serialise and write `state` on a new thread (join it before the next save and before exiting)."""
    import torch

    def write() -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        (out / DIR).mkdir(exist_ok=True)
        write_whole(out / DIR / FILE, buf.getvalue())

    thread = threading.Thread(target=write, name="libra-checkpoint", daemon=False)
    thread.start()
    return thread


class BackgroundWriter:
    """One checkpoint write at a time: `save` waits for the previous write to end, then starts the next; `wait`
    before exiting."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._thread: threading.Thread | None = None

    def save(self, state: dict[str, Any]) -> None:
        self.wait()
        self._thread = save_in_background(self.out, state)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def exists(out: Path) -> bool:
    return (out / DIR / FILE).is_file()


def load(out: Path) -> dict[str, Any]:
    import torch

    path = out / DIR / FILE
    if not path.is_file():
        raise RunConfigError(f"nothing to resume in {str(out)!r}: no {DIR}/{FILE}")
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - truncated, overwritten or not a checkpoint at all: one line
        why = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:200]  # torch's first sentence
        raise RunConfigError(
            f"cannot resume from {path}: the checkpoint is unreadable ({type(exc).__name__}: {why}); nothing was "
            "changed"
        ) from None
    missing = sorted(KEYS - set(state)) if isinstance(state, dict) else sorted(KEYS)
    if missing:
        raise RunConfigError(f"cannot resume from {path}: not a checkpoint of a run (no {', '.join(missing)})")
    return state
