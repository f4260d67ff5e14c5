"""Executors carry out controller decisions. The controller never acts; it only returns decisions as data.

An executor is anything with ``execute(decision)``. :class:`DispatchExecutor` maps each decision type to a
handler (the adapters register theirs: stop a vLLM instance, start the join of a trainer replica, ...) and raises
on a decision type that has no handler, so a forgotten case is loud.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from libra.elastic.decisions import Decision


class Executor(Protocol):
    def execute(self, decision: Decision) -> None:
        """Carry out one decision. Raise if it cannot be carried out; the caller turns that into a FAIL event."""


class UnhandledDecision(LookupError):
    """A decision type with no registered handler."""


class DispatchExecutor:
    """Runs each decision through the handler registered for its type, in order, and keeps what it ran."""

    def __init__(self, handlers: Mapping[type, Callable[[Any], None]]) -> None:
        self._handlers = dict(handlers)
        self.done: list[Decision] = []

    def execute(self, decision: Decision) -> None:
        handler = self._handlers.get(type(decision))
        if handler is None:
            known = sorted(t.__name__ for t in self._handlers)
            raise UnhandledDecision(f"no handler for decision {type(decision).__name__}; handlers exist for {known}")
        handler(decision)
        self.done.append(decision)

    def execute_all(self, decisions: Iterable[Decision]) -> None:
        for decision in decisions:
            self.execute(decision)
