"""The run's checkpoint, `checkpoint/state.pt`: trainer + optimizer state, the router (pickled after the rollout
of the last completed step), plan, placement, step counter, the ids already trained, recent trajectories.

Written atomically (temporary file + rename) on a background thread from a copy taken at the step boundary, so a
crash at any moment leaves either the previous checkpoint or the new one."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libra.runtime.config import RunConfigError
from libra.runtime.records import RUN_FILE
from libra.spec.files import write_whole

DIR, FILE = "checkpoint", "state.pt"
# what a resume reads from the checkpoint
KEYS = frozenset({"next_step", "trainer", "router", "plan", "placement", "history", "trained", "losses"})


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (a full disk, a folder that is not writable): the run stops, since a later
    resume would go back to the last checkpoint that was written."""


def save_in_background(out: Path, state: dict[str, Any], errors: list[BaseException] | None = None) -> threading.Thread:
    """Serialise and write `state` on a new thread (join it before the next save and before exiting); a failure of
    the write is appended to `errors`."""
    import torch

    def write() -> None:
        try:
            buf = io.BytesIO()
            torch.save(state, buf)
            (out / DIR).mkdir(exist_ok=True)
            write_whole(out / DIR / FILE, buf.getvalue())
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits for the write
            if errors is None:
                raise
            errors.append(exc)

    thread = threading.Thread(target=write, name="libra-checkpoint", daemon=False)
    thread.start()
    return thread


class BackgroundWriter:
    """One checkpoint write at a time: `save` waits for the previous write to end, then starts the next; `wait`
    before exiting. A write that failed raises `CheckpointError` from the next `save` or `wait` (it was lost on
    the writer's thread: the run went on and reported steps that no checkpoint held)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._thread: threading.Thread | None = None
        self._step: Any = None
        self._errors: list[BaseException] = []

    def save(self, state: dict[str, Any]) -> None:
        self.wait()
        self._step = state.get("next_step")
        self._thread = save_in_background(self.out, state, self._errors)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._errors:
            exc, self._errors = self._errors[0], []
            why = (str(exc).strip().splitlines() or [""])[0][:200]
            done = "" if self._step is None else f" after step {self._step - 1}"
            raise CheckpointError(
                f"the checkpoint{done} was not written to {self.out / DIR / FILE} ({type(exc).__name__}: {why}); "
                "the run stops: a resume continues from the last checkpoint written"
            ) from exc


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
    step = state["next_step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise RunConfigError(
            f"cannot resume from {path}: its next_step must be a whole number >= 1, got {step!r}; nothing was changed"
        )
    return state


# settings a resume may change (the CLI's --steps, --max-staleness and --ray; the bounded waits): any other
# difference would continue the run with another job than the one its checkpoint holds
RESUMABLE = frozenset({"steps", "max_staleness", "ray", "waits"})


def check_same_run(state: dict[str, Any], config: dict[str, Any], out: Path) -> None:
    """Refuse (one line) to resume with a configuration whose settings outside `RESUMABLE` differ from those the
    checkpoint was written with (a checkpoint without them, from before they were kept, is not checked)."""
    saved = state.get("config")
    if not isinstance(saved, dict):
        return
    old, new = _flat(saved), _flat(config)
    changed = sorted(
        k for k in old.keys() | new.keys() if k.split(".")[0] not in RESUMABLE and old.get(k) != new.get(k)
    )
    if changed:
        shown = ", ".join(f"{k}={old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise RunConfigError(
            f"cannot resume {str(out)!r} with another configuration: {shown}{more} (only "
            f"{', '.join(sorted(RESUMABLE))} may change on a resume); nothing was changed"
        )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def refuse_overwrite(out: Path) -> None:
    """A new run (not a resume) into a folder that holds a run's records or checkpoint would overwrite them."""
    held = [f for f in (RUN_FILE, f"{DIR}/{FILE}") if (out / f).is_file()]
    if held:
        raise RunConfigError(
            f"{str(out)!r} already holds a run ({', '.join(held)}): resume=True continues it, or give "
            "another out_dir; nothing was changed"
        )


def check_plan_and_placement(state: dict[str, Any]) -> None:
    """The checkpoint's plan and placement are a `Plan` and a `Placement` (TypeError otherwise, for `restoring`)."""
    from libra.spec import Placement, Plan

    if not isinstance(state["plan"], Plan) or not isinstance(state["placement"], Placement):
        kinds = f"{type(state['plan']).__name__}, {type(state['placement']).__name__}"
        raise TypeError(f"plan and placement must be a Plan and a Placement, got {kinds}")


@contextlib.contextmanager
def restoring(out: Path) -> Iterator[None]:
    """Whatever fails while a run takes its checkpoint's state in (it does not fit the run: another model, a router
    pickled by another version) is one `RunConfigError` line, raised before any engine starts."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever does not fit: one line, nothing changed
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        raise RunConfigError(
            f"cannot resume from {out / DIR / FILE}: its state does not fit this run "
            f"({type(exc).__name__}: {why}); nothing was changed"
        ) from None
