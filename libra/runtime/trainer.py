"""The core trainer, driven from a background thread so that training of step k overlaps rollout of step k+1.

One job at a time: `start(step, batch)` trains one GRPO step (one optimizer step, the trainer's version becomes
`step + 1`), exports the new weights and copies its state for the checkpoint (trainer work, off the orchestrator's
thread, overlapping the rollout); `poll()` returns the finished job (or None) and re-raises its error. The
orchestrator's thread pushes the weights to the engines (every engine call stays on one thread)."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs

from libra.adapters.types import WeightUpdate


@attrs.frozen(kw_only=True)
class TrainResult:
    step: int
    version: int  # the trainer's version after the optimizer step
    loss: float
    update: WeightUpdate
    start: float
    end: float
    state: Any = None  # the trainer's snapshot after the step (model, optimizer, version)
    hybrids: tuple[str, ...] = ()  # hybrid replicas whose gradients went into the step


class TrainerHung(RuntimeError):
    """A training step exceeded its bounded wait (`waits.trainer_check_s` x `waits.trainer_missed_checks`)."""


class TrainerThread:
    """`step_fn(batch, step) -> (loss, hybrids)` replaces `trainer.train_step` (the core step of a
    `HybridPool`); None trains the trainer alone."""

    def __init__(self, trainer: Any, *, clock_t0: float, step_fn: Any = None) -> None:
        self.trainer = trainer
        self.step_fn = step_fn
        self.started: float | None = None  # time.monotonic() when the running step started
        self.t0 = clock_t0
        self._thread: threading.Thread | None = None
        self._result: TrainResult | None = None
        self._error: BaseException | None = None
        self.step: int | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, step: int, batch: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError(f"trainer is busy with step {self.step}")
        if self.trainer.version != step:
            raise RuntimeError(f"trainer at version {self.trainer.version} cannot train step {step} (one step each)")
        self.step = step
        self.started = time.monotonic()

        def work() -> None:
            try:
                start = time.perf_counter() - self.t0
                hybrids: tuple[str, ...] = ()
                if self.step_fn is None:
                    loss = self.trainer.train_step(batch, step=step)
                else:
                    loss, hybrids = self.step_fn(batch, step)
                update = self.trainer.export_weights(bucket_bytes=1 << 20)
                state = self.trainer.snapshot()
                self._result = TrainResult(
                    step=step,
                    version=self.trainer.version,
                    loss=loss,
                    update=update,
                    start=start,
                    end=time.perf_counter() - self.t0,
                    state=state,
                    hybrids=hybrids,
                )
            except BaseException as exc:  # noqa: BLE001 - handed to the orchestrator's thread
                self._error = exc

        self._thread = threading.Thread(target=work, name=f"libra-train-{step}", daemon=True)
        self._thread.start()

    def overdue(self, check_s: float, missed_checks: int) -> str | None:
        """Why the running step counts as hung: still running after `missed_checks` consecutive progress checks
        of `check_s` seconds (a step either finishes or misses a check); None while within the bound."""
        if self._thread is None or self.started is None:
            return None
        elapsed = time.monotonic() - self.started
        missed = int(elapsed // check_s)
        if missed < missed_checks:
            return None
        return (
            f"training step {self.step} made no progress for {missed} consecutive checks of {check_s:g} s "
            f"({elapsed:.0f} s)"
        )

    def poll(self, timeout: float | None = 0.0) -> TrainResult | None:
        if self._thread is None:
            return None
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        result, self._result = self._result, None
        return result
