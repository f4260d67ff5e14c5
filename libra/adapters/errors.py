"""Typed errors of the adapters. Every failure that reaches a caller names the instance, replica or request."""

from __future__ import annotations


class AdapterError(RuntimeError):
    """Base class of adapter errors."""


class UnknownBackend(AdapterError, LookupError):
    """A backend name that is not registered; the message lists the registered names."""


class BackendUnavailable(AdapterError, ImportError):
    """A registered backend whose engine package is not installed (e.g. `pip install libra[vllm]`)."""


class InstanceNotFound(AdapterError, LookupError):
    """A rollout instance name that the backend does not hold (never started, stopped, or dead)."""


class InstanceAsleep(AdapterError):
    """A request was sent to an instance that sleeps (a hybrid worker lent to training); wake it first."""


class EngineDiedError(AdapterError):
    """A rollout instance's engine died. `requeued` maps request id -> the instance that took it over;
    `failed` lists the request ids that no live instance could take (each also ends as a `RequestFailedError`)."""

    def __init__(self, instance: str, cause: str, *, requeued: dict[str, str], failed: tuple[str, ...]) -> None:
        super().__init__(
            f"engine of instance {instance!r} died ({cause}); requeued {sorted(requeued)}, failed {sorted(failed)}"
        )
        self.instance, self.cause, self.requeued, self.failed = instance, cause, dict(requeued), tuple(failed)


class RequestFailedError(AdapterError):
    """A request ended without a result (its engine died and nothing could take it over, or it was rejected)."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"request {request_id!r} failed: {reason}")
        self.request_id, self.reason = request_id, reason


class ReplicaDiedError(AdapterError):
    """A trainer replica (process or actor) died; the elastic controller removes it (see `report_replica_death`)."""

    def __init__(self, replica: str, cause: str) -> None:
        super().__init__(f"trainer replica {replica!r} died: {cause}")
        self.replica, self.cause = replica, cause


class UnsupportedConfig(AdapterError, ValueError):
    """A plan or option the engine cannot run (names the field, the value and what would be valid)."""


class StateMismatch(AdapterError, ValueError):
    """A snapshot or weight set whose parameter names or shapes do not match the model it is loaded into (names
    the first differing parameter)."""


class WorkerNotFound(AdapterError, KeyError):
    """A decision names a worker that the placement does not hold."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class RequestNotFound(AdapterError, KeyError):
    """A request id that the backend does not hold (never submitted, or released)."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""
