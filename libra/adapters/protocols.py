"""The two contracts every engine adapter implements: a rollout backend and a trainer backend.

Request life cycle on a rollout backend (one agentic trajectory)::

    submit(rid, instance, prompt_ids, sampling)   -> poll() streams TOKENS, then FINISHED at a stop condition
    (the turn ended at a tool call: the caller runs the tool)
    resume(rid, tool_output_ids, sampling)       -> the context grows by the tool output; the next turn streams
    migrate(rid, to_instance)                    -> between turns or mid-generation; the target re-prefills
    release(rid)                                 -> the trajectory is done; the backend forgets it

A backend never loses a request silently: if an engine dies, each of its requests is either REQUEUED on a live
instance (re-prefilled from the context the backend keeps) or ends with a FAILED event and `release()` raises
`RequestFailedError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from libra.adapters.types import InstanceSpec, Migration, Sampling, StreamEvent, WeightUpdate

GradHook = Callable[[int, Sequence[Any]], Sequence[Any]]
"""`hook(step, grads) -> grads`: called by a trainer with this replica's local (not yet data-parallel-reduced)
gradients of `step`, in `[p.grad for p in model.parameters() if p.requires_grad]` order; returns the gradients
averaged over every replica that contributed (in place, or as new tensors of the same shapes that the trainer
copies back: `run_grad_hook`). It replaces the data-parallel all-reduce, which is where the side channel of
`libra.elastic` (`CoreExchange.reduce`) adds hybrid contributions."""


def run_grad_hook(hook: GradHook, step: int, grads: Sequence[Any]) -> None:
    """Call `hook(step, grads)` and make its result this replica's gradients: a hook that returns new tensors
    (`[g / n for g in grads]`) instead of changing them in place must not be ignored silently. A result of another
    count or shape is a `StateMismatch`; None means the hook worked in place."""
    from libra.adapters.errors import StateMismatch

    out = hook(step, grads)
    if out is None or out is grads:
        return
    out = list(out)
    if len(out) != len(grads):
        raise StateMismatch(f"grad_hook returned {len(out)} gradients for step {step}; the model has {len(grads)}")
    for i, (mine, theirs) in enumerate(zip(grads, out, strict=True)):
        if theirs is mine:
            continue
        if tuple(getattr(theirs, "shape", ())) != tuple(mine.shape):
            raise StateMismatch(
                f"grad_hook returned shape {tuple(getattr(theirs, 'shape', ()))} for gradient {i} of step {step}; "
                f"the parameter has {tuple(mine.shape)}"
            )
        mine.copy_(theirs)


@runtime_checkable
class RolloutBackend(Protocol):
    """Inference instances that generate trajectories turn by turn."""

    def start_instance(self, spec: InstanceSpec) -> None:
        """Start an instance (blocking until it serves). A name that is already running is an error."""

    def stop_instance(self, name: str, *, migrate_to: str | None = None) -> tuple[Migration, ...]:
        """Stop an instance; its requests move to `migrate_to` (returned) or, with None, fail with a typed error."""

    def instances(self) -> tuple[str, ...]:
        """Names of live instances, sorted."""

    def prompt_ids(self, prompt: str | Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a text prompt or of a chat (list of role/content messages, chat template applied)."""

    def submit(self, request_id: str, instance: str, prompt_token_ids: Sequence[int], sampling: Sampling) -> None:
        """Start the first turn of a request on `instance` (token ids; see `prompt_ids` for text and chats)."""

    def resume(self, request_id: str, appended_token_ids: Sequence[int], sampling: Sampling) -> None:
        """Start the next turn with the tool output appended to the context (the request must be between turns)."""

    def migrate(self, request_id: str, to_instance: str) -> Migration:
        """Move a request; a running turn continues on the target from exactly the tokens generated so far."""

    def poll(self) -> list[StreamEvent]:
        """Advance every awake instance by one engine step and return what happened (possibly nothing)."""

    def context(self, request_id: str) -> tuple[int, ...]:
        """The request's whole context so far: prompt, generated tokens and tool outputs."""

    def instance_of(self, request_id: str) -> str:
        """Where the request lives now."""

    def release(self, request_id: str) -> tuple[int, ...]:
        """Forget a finished or failed request; returns its context. Raises `RequestFailedError` if it failed."""

    def load_weights(self, update: WeightUpdate, *, instances: Sequence[str] | None = None) -> int:
        """Load new policy weights into the given (default: all) instances; returns the version now served.
        Turns that start after this call use the new weights."""

    def sleep(self, name: str) -> None:
        """Stop scheduling on an instance and free what the platform can (hybrid worker lent to training)."""

    def wake(self, name: str) -> None:
        """Undo `sleep`; the instance serves again with the newest loaded weights."""

    def shutdown(self) -> None:
        """Stop every instance."""


@runtime_checkable
class TrainerBackend(Protocol):
    """One data-parallel replica set of the policy model (built from a plan's `TrainConfig`)."""

    @property
    def version(self) -> int:
        """Number of optimizer steps applied so far."""

    def train_step(
        self, batch: Mapping[str, Any], *, grad_hook: GradHook | None = None, step: int | None = None
    ) -> float:
        """Forward + backward on this replica's shard of `batch`, reduce the gradients (through `grad_hook` when
        given, called as `grad_hook(step, grads)` with `step` defaulting to `version`; else the engine's own
        data-parallel all-reduce), optimizer step. Returns the local loss."""

    def snapshot(self) -> Mapping[str, Any]:
        """Model + optimizer state at `version` (CPU tensors), enough for a joining replica to become equal."""

    def restore(self, state: Mapping[str, Any]) -> None:
        """Load a `snapshot()`; afterwards this replica is equal to the one that took it."""

    def export_weights(self, *, bucket_bytes: int = 64 << 20) -> WeightUpdate:
        """The full policy weights (Hugging Face names) for the rollout side, versioned with `version`."""
