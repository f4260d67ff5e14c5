"""The request book of a rollout backend: the driver-side record of every request and instance, shared by the
local vLLM backend (`vllm_backend`) and the Ray backend (`ray_rollout`).

The driver keeps each request's whole context (prompt, generated tokens, tool outputs), so resuming after a tool
call, migrating and re-queueing after an instance's death are all "start a turn of that context on an instance"
(re-prefill). The book does everything that is the same for both: submit / resume / migrate / release, the
queries (`context`, `instance_of`, `is_running`, `num_requests`), the failover of a dead instance's requests to the
least-loaded live one, and the lookups with their errors. A backend subclasses `RequestBook` and supplies how a
turn starts and aborts on its instances (`_start_turn`, `_abort`) and how a dead instance is taken away
(`_remove_dead`); its instances carry `spec` and `asleep`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from libra.adapters.errors import (
    EngineDiedError,
    InstanceAsleep,
    InstanceNotFound,
    RequestFailedError,
    RequestNotFound,
)
from libra.adapters.types import EventKind, InstanceSpec, Migration, Sampling, StreamEvent, WeightUpdate

Failover = Callable[[str, tuple[str, ...], str], str | None]


@attrs.define(eq=False)
class BookRequest:
    """One request: its whole context, the instance it is on, the current turn's sampling and engine id."""

    request_id: str
    instance: str
    context: list[int]
    sampling: Sampling
    running: bool = False
    engine_id: str = ""
    turn_tokens: int = 0  # generated in the current turn
    failed: str | None = None


class RequestBook:
    """The bookkeeping both rollout backends share (see the module doc). `failover(dead_instance, live_instances,
    request_id)` picks where a dead instance's request goes (None: fail it); the default picks the live awake
    instance with the fewest requests. `died_note` and `requeued_note` word the errors of a death's events."""

    died_note = "instance {name!r} died ({cause}) and no instance is live"
    requeued_note = "instance {name!r} died: {cause}"

    def __init__(self, failover: Failover | None = None) -> None:
        self.failover: Failover = failover or self._least_loaded
        self._instances: dict[str, Any] = {}
        self._requests: dict[str, BookRequest] = {}
        self._latest: WeightUpdate | None = None
        self._ids = itertools.count()
        self.deaths: list[EngineDiedError] = []

    # -- what a backend supplies --------------------------------------------------------------------------------

    def _start_turn(self, req: BookRequest, max_tokens: int) -> None:
        """Start a turn of `req.context` on `req.instance` (at most `max_tokens` new tokens); set `engine_id`
        and `running`; raise `RequestFailedError` (with `req.failed` set) if the context does not fit."""
        raise NotImplementedError

    def _abort(self, inst: Any, req: BookRequest) -> None:
        """Abort `req`'s running turn on `inst` (if it runs) and mark it not running."""
        raise NotImplementedError

    def _remove_dead(self, name: str) -> None:
        """Take the dead instance `name` out of `_instances` and release what it holds."""
        raise NotImplementedError

    # -- instances ----------------------------------------------------------------------------------------------

    def instances(self) -> tuple[str, ...]:
        return tuple(sorted(self._instances))

    def spec(self, name: str) -> InstanceSpec:
        return self._get(name).spec

    def is_asleep(self, name: str) -> bool:
        return self._get(name).asleep

    def num_requests(self, name: str) -> int:
        return sum(1 for r in self._requests.values() if r.instance == name and r.failed is None)

    def _move_off(self, name: str, migrate_to: str | None) -> tuple[Migration, ...]:
        """Before instance `name` stops: migrate its requests to `migrate_to`, or abort and fail them (None)."""
        inst = self._get(name)
        if migrate_to == name:
            raise ValueError(f"instance {name!r} cannot hand its requests to itself: it is the one that stops")
        if migrate_to is not None:
            self._awake(migrate_to)  # checked before any request moves
        moved = []
        for req in [r for r in self._requests.values() if r.instance == name and r.failed is None]:
            if migrate_to is None:
                self._abort(inst, req)
                req.failed = f"instance {name!r} was stopped"
            else:
                moved.append(self.migrate(req.request_id, migrate_to))
        return tuple(moved)

    # -- requests -----------------------------------------------------------------------------------------------

    def submit(self, request_id: str, instance: str, prompt_token_ids: Sequence[int], sampling: Sampling) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already exists; release it first")
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt; an engine needs at least one token")
        self._awake(instance)
        req = BookRequest(request_id=request_id, instance=instance, context=list(prompt_token_ids), sampling=sampling)
        self._requests[request_id] = req
        try:
            self._start_turn(req, sampling.max_tokens)
        except RequestFailedError:
            raise  # kept, failed: `release` reports it
        except BaseException:  # refused by the engine (e.g. a token id out of its vocabulary): not submitted
            del self._requests[request_id]
            raise

    def resume(self, request_id: str, appended_token_ids: Sequence[int], sampling: Sampling) -> None:
        req = self._live_request(request_id)
        if req.running:
            raise ValueError(f"request {request_id!r} is generating; resume it after its turn FINISHED")
        self._awake(req.instance)
        before = (len(req.context), req.sampling, req.turn_tokens)
        req.context.extend(appended_token_ids)
        req.sampling, req.turn_tokens = sampling, 0
        try:
            self._start_turn(req, sampling.max_tokens)
        except RequestFailedError:
            raise
        except BaseException:  # refused by the engine: the request stays between turns, as it was
            del req.context[before[0] :]
            req.sampling, req.turn_tokens = before[1], before[2]
            raise

    def migrate(self, request_id: str, to_instance: str) -> Migration:
        req = self._live_request(request_id)
        self._awake(to_instance)
        source, running = req.instance, req.running
        if source == to_instance:
            return Migration(
                request_id=request_id, from_instance=source, to_instance=source, migrated_tokens=0, running=running
            )
        if running:
            self._abort(self._instances[source], req)
        req.instance = to_instance
        if running:
            self._start_turn(req, req.sampling.max_tokens - req.turn_tokens)
        return Migration(
            request_id=request_id,
            from_instance=source,
            to_instance=to_instance,
            migrated_tokens=len(req.context),
            running=running,
        )

    def context(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._get_request(request_id).context)

    def instance_of(self, request_id: str) -> str:
        return self._get_request(request_id).instance

    def is_running(self, request_id: str) -> bool:
        return self._get_request(request_id).running

    def release(self, request_id: str) -> tuple[int, ...]:
        req = self._get_request(request_id)
        if req.running and req.instance in self._instances:
            self._abort(self._instances[req.instance], req)
        del self._requests[request_id]
        if req.failed is not None:
            raise RequestFailedError(request_id, req.failed)
        return tuple(req.context)

    def has_running(self) -> bool:
        return any(r.running for r in self._requests.values())

    def _running_on(self, name: str) -> bool:
        return any(r.running and r.instance == name for r in self._requests.values())

    # -- deaths -------------------------------------------------------------------------------------------------

    def _on_death(self, name: str, cause: str) -> list[StreamEvent]:
        """Instance `name` died: take it away, re-queue each of its requests on a live instance (`REQUEUED`
        events; a running turn continues there from the kept context) or fail it (`FAILED`), record the death."""
        self._remove_dead(name)
        events, requeued, failed = [], {}, []
        for req in [r for r in self._requests.values() if r.instance == name and r.failed is None]:
            live = tuple(n for n, i in sorted(self._instances.items()) if not i.asleep)
            target = self.failover(name, live, req.request_id) if live else None
            if target is None or target not in live:  # a policy naming an unknown or sleeping instance fails it
                req.running, req.failed = False, self.died_note.format(name=name, cause=cause)
                if target is not None:
                    req.failed = (
                        f"instance {name!r} died ({cause}); the failover policy chose {target!r}, which is not a "
                        f"live awake instance (live: {list(live)})"
                    )
                failed.append(req.request_id)
                events.append(
                    StreamEvent(request_id=req.request_id, instance=name, kind=EventKind.FAILED, error=req.failed)
                )
                continue
            was_running, req.instance = req.running, target
            if was_running:
                try:
                    self._start_turn(req, req.sampling.max_tokens - req.turn_tokens)
                except RequestFailedError as exc:  # the target cannot hold the context: fail it, keep going
                    req.running = False
                    failed.append(req.request_id)
                    events.append(
                        StreamEvent(request_id=req.request_id, instance=name, kind=EventKind.FAILED, error=exc.reason)
                    )
                    continue
            requeued[req.request_id] = target
            events.append(
                StreamEvent(
                    request_id=req.request_id,
                    instance=target,
                    kind=EventKind.REQUEUED,
                    error=self.requeued_note.format(name=name, cause=cause),
                )
            )
        self.deaths.append(EngineDiedError(name, cause, requeued=requeued, failed=tuple(failed)))
        return events

    def _least_loaded(self, dead: str, live: tuple[str, ...], request_id: str) -> str | None:
        return min(live, key=lambda n: (self.num_requests(n), n)) if live else None

    # -- lookups ------------------------------------------------------------------------------------------------

    def _get(self, name: str) -> Any:
        inst = self._instances.get(name)
        if inst is None:
            raise InstanceNotFound(f"no live instance {name!r}; live: {sorted(self._instances)}")
        return inst

    def _awake(self, name: str) -> Any:
        inst = self._get(name)
        if inst.asleep:
            raise InstanceAsleep(f"instance {name!r} sleeps (lent to training); wake it first")
        return inst

    def _get_request(self, request_id: str) -> BookRequest:
        req = self._requests.get(request_id)
        if req is None:
            raise RequestNotFound(f"unknown request {request_id!r}; it was never submitted or is released")
        return req

    def _live_request(self, request_id: str) -> BookRequest:
        req = self._get_request(request_id)
        if req.failed is not None:
            raise RequestFailedError(request_id, req.failed)
        return req


__all__ = ["BookRequest", "Failover", "RequestBook"]
