"""One step's rollout: every trajectory driven turn by turn through the router on the rollout backend.

`RoutedRollout` (libra.adapters.routing) applies the router's decisions (admission bucket, migrations on tool
returns and on growth); this loop adds what a runtime needs around it: the weight version of every turn (the
oldest version that produced any of its tokens), a callback between engine polls (the orchestrator pushes new
weights and starts training there, so rollout and training overlap), re-queues after engine deaths, retries of a
trajectory that failed outright (a new request id, counted), and the time spent inside engines and tools.

Lengths: a turn never asks for more tokens than its instance's `max_model_len` leaves (its `max_tokens` is clamped to
the room, as vLLM stops a turn at the length), and a trajectory whose context fills `max_model_len` ends there,
recorded as `truncated` (its tool is not called: no turn could follow it).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from libra.adapters.errors import RequestFailedError
from libra.adapters.routing import RoutedRollout
from libra.adapters.types import EventKind, Sampling
from libra.runtime.agent import Agent
from libra.runtime.clock import Clock
from libra.runtime.config import RunConfigError
from libra.spec import checks
from libra.workloads.trace import Trajectory, Turn

# Longer than the backends' own bounds (a hung engine is killed after `waits.engine_check_s` x
# `waits.engine_missed_checks`, 180 s by default; a silent Ray actor is dead after its grace, 600 s), so that a slow
# engine is a death first and this bound only ends a rollout that is stuck with nothing declared dead.
MAX_IDLE_S = 1800.0


class LiveRoutedRollout(RoutedRollout):
    """Routes to a bucket's live instances; when none of a bucket's instances is alive (its engine died), to the
    least-loaded live instance of any bucket (the request still runs; the router keeps its bucket). When no
    instance at all is alive (the only engine died mid-rollout), `revive()` restarts the placement's instances
    first, so the failed requests are retried there instead of the rollout failing."""

    def __init__(self, *, revive: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.revive = revive

    def pick(self, bucket: int) -> str:
        live = set(self.backend.instances())
        if not live and self.revive is not None:
            self.revive()
            live = set(self.backend.instances())
        names = [n for n in self.bucket_instances.get(bucket, ()) if n in live]
        if not names:
            names = sorted(live)
        if not names:
            raise RequestFailedError("-", "no live rollout instance")
        load = getattr(self.backend, "num_requests", lambda n: 0)
        return min(names, key=lambda n: (load(n), n))


@attrs.define(eq=False)
class TrajectoryRecord:
    """One finished trajectory of step `step`: the token context, the loss mask (1 on generated tokens), its turns
    with the weight version of each, the instances it visited, its reward."""

    request_id: str
    prompt_id: str
    sample: int
    step: int
    prompt_tokens: int
    context: tuple[int, ...] = ()
    mask: tuple[int, ...] = ()
    turns: list[Turn] = attrs.field(factory=list)
    turn_versions: list[int] = attrs.field(factory=list)
    instances: list[str] = attrs.field(factory=list)
    tool_latency_s: list[float] = attrs.field(factory=list)
    reward: float = 0.0
    attempts: int = 1
    requeues: int = 0
    truncated: str | None = None  # why the trajectory ended before its agent ended it (its context filled)

    def trajectory(self) -> Trajectory:
        turns = tuple(
            attrs.evolve(t, extra={"weight_version": v, **({"tool_latency_s": lat} if t.tool else {})})
            for t, v, lat in zip(self.turns, self.turn_versions, self.tool_latency_s + [0.0] * len(self.turns))
        )
        return Trajectory(
            prompt_id=self.prompt_id,
            prompt_tokens=self.prompt_tokens,
            turns=turns,
            sample=self.sample,
            step=self.step,
            reward=self.reward,
            extra={
                "request_id": self.request_id,
                "instances": list(self.instances),
                **({"truncated": self.truncated} if self.truncated is not None else {}),
            },
        )


@attrs.define(eq=False)
class _Live:
    rec: TrajectoryRecord
    rid: str  # the backend request id of the current attempt
    turn_start: int
    turn_version: int | None = None
    mask: list[int] = attrs.field(factory=list)


def run_rollout(
    routed: RoutedRollout,
    prompts: Mapping[str, tuple[str, int, Sequence[int]]],
    *,
    agent: Agent,
    sampling: Callable[[str, int], Sampling],
    max_turns: int,
    step: int,
    clock: Clock,
    on_poll: Callable[[], Any] | None = None,
    max_attempts: int = 3,
    max_idle_s: float = MAX_IDLE_S,
    max_idle_polls: int | None = None,
) -> dict[str, TrajectoryRecord]:
    """Run every trajectory of `prompts` (request id -> (prompt id, sample, prompt token ids)) to its end.
    `sampling(request_id, turn_index)` gives each turn's sampling settings. Returns one record per request id;
    a trajectory that fails is retried from its prompt (up to `max_attempts`), so none is dropped silently: if
    it still fails, `RolloutLost` is raised. `RolloutStalled` when no engine event came for `max_idle_s` seconds
    of `clock` while requests were running (`max_idle_polls`, a count of polls, is deprecated: how long a poll
    takes depends on the backend and on the machine's load)."""
    _check_idle_bound(max_idle_s)
    if max_idle_polls is not None:
        warnings.warn(
            "run_rollout(max_idle_polls=...) is deprecated and will be removed in the next release: the bound is a "
            f"time now, pass max_idle_s (seconds; default {MAX_IDLE_S:g})",
            DeprecationWarning,
            stacklevel=2,
        )
    backend = routed.backend
    live: dict[str, _Live] = {}
    done: dict[str, TrajectoryRecord] = {}

    def start(rid: str, attempt: int, requeues: int = 0) -> None:
        pid, sample, ids = prompts[rid]
        backend_id = rid if attempt == 1 else f"{rid}~{attempt}"
        rec = TrajectoryRecord(request_id=rid, prompt_id=pid, sample=sample, step=step, prompt_tokens=len(ids))
        rec.attempts, rec.requeues = attempt, requeues  # the re-queues of failed attempts stay counted
        first = _fit_turn(sampling(rid, 0), _smallest_limit(backend), len(ids))
        with clock.span("engine"):
            inst = routed.admit(backend_id, prompt_id=pid, prompt_token_ids=ids, sampling=first)
        rec.instances.append(inst)
        live[backend_id] = _Live(rec=rec, rid=backend_id, turn_start=len(ids), mask=[0] * len(ids))

    def close(st: _Live, error: str | None) -> None:
        rec = st.rec
        with clock.span("engine"):
            try:
                context = backend.release(st.rid)
            except RequestFailedError as exc:
                context, error = (), error or exc.reason
            except KeyError:
                context, error = (), error or "request vanished"
        del live[st.rid]
        if error is not None:
            routed.router.abort(st.rid)  # a failed attempt teaches the router nothing: its retry is the trajectory
            if rec.attempts >= max_attempts:
                raise RolloutLost(f"trajectory {rec.request_id} failed {rec.attempts} times; last error: {error}")
            start(rec.request_id, rec.attempts + 1, rec.requeues)
            return
        traj = Trajectory(prompt_id=rec.prompt_id, prompt_tokens=rec.prompt_tokens, turns=tuple(rec.turns), step=step)
        routed.router.finish(st.rid, traj)
        rec.context = tuple(context)
        rec.mask = tuple(st.mask[: len(context)])
        rec.reward = float(agent.reward(st.rid if st.rid == rec.request_id else rec.request_id))
        done[rec.request_id] = rec

    try:
        for rid in prompts:
            start(rid, 1)
        idle, idle_since = 0, clock.now()
        while live:
            if on_poll is not None:
                on_poll()
            with clock.span("engine"):
                events = backend.poll()
            if not events:
                idle += 1
                if not getattr(backend, "has_running", lambda: True)():
                    for st in list(live.values()):
                        close(st, "no running request and no event: the engine lost it")
                    continue
                waited = clock.now() - idle_since
                if waited > max_idle_s or (max_idle_polls is not None and idle > max_idle_polls):
                    raise RolloutStalled(
                        f"rollout of step {step} made no progress for {waited:.1f} s ({idle} polls without an "
                        f"event; the bound is {max_idle_s:g} s"
                        + (f" or {max_idle_polls} polls)" if max_idle_polls is not None else ")")
                    )
                continue
            idle, idle_since = 0, clock.now()
            for ev in events:
                routed.events.append(ev)
                found = live.get(ev.request_id)
                if found is None:
                    continue
                st = found
                if ev.kind in (EventKind.TOKENS, EventKind.FINISHED) and ev.weight_version is not None:
                    v = ev.weight_version
                    st.turn_version = v if st.turn_version is None else min(st.turn_version, v)
                if ev.kind == EventKind.TOKENS:
                    with clock.span("routing"):  # the router's decision (a migration, rare, is engine time in it)
                        moved = routed.progress(st.rid)
                    if moved is not None and moved.to_instance != moved.from_instance:
                        st.rec.instances.append(moved.to_instance)
                elif ev.kind == EventKind.REQUEUED:
                    st.rec.requeues += 1
                    st.rec.instances.append(ev.instance)
                elif ev.kind == EventKind.FAILED:
                    close(st, ev.error or "failed")
                elif ev.kind == EventKind.FINISHED:
                    _end_turn(routed, st, agent, sampling, max_turns, clock, close)
    except BaseException:  # Ctrl-C or a failure: leave no request of this rollout behind on the engines
        for st in list(live.values()):  # nor in the router's books
            with contextlib.suppress(Exception):
                backend.release(st.rid)
            with contextlib.suppress(Exception):
                routed.router.abort(st.rid)
        raise
    return done


class RolloutLost(RuntimeError):
    """A trajectory failed on every attempt (no live instance could serve it)."""


class RolloutStalled(RuntimeError):
    """No engine event for `max_idle_s` seconds while requests were running, and no engine was declared dead."""


def check_prompts_fit(prompts: Sequence[str], prompt_ids: Sequence[Sequence[int]], max_model_len: int) -> None:
    """Refuse a prompt that alone fills the engines' `max_model_len` (`RunConfigError`, one line): a turn's
    `max_tokens` is clamped to the room left and a full context ends a trajectory, but a trajectory needs a turn."""
    for i, (text, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        if len(ids) >= max_model_len:
            raise RunConfigError(
                f"prompts[{i}] ({text[:40]!r}) is {len(ids)} tokens: engine.max_model_len {max_model_len} leaves no "
                f"room to generate; raise engine.max_model_len above {len(ids)} or shorten the prompt"
            )


def _check_idle_bound(max_idle_s: object) -> None:
    if not 0 < checks.as_float(max_idle_s) < math.inf:  # a bool or a string: as_float is NaN
        raise ValueError(f"max_idle_s must be finite seconds > 0, got {max_idle_s!r}")


def _limit(backend: Any, instance: str) -> int | None:
    """The `max_model_len` of `instance` (None: the backend does not say)."""
    spec = getattr(backend, "spec", None)
    return None if spec is None else int(spec(instance).max_model_len)


def _smallest_limit(backend: Any) -> int | None:
    """The smallest `max_model_len` of the live instances (a request is admitted before the router picks one)."""
    limits = [_limit(backend, name) for name in backend.instances()]
    known = [x for x in limits if x is not None]
    return min(known) if known else None


def _fit_turn(sampling: Sampling, limit: int | None, context: int) -> Sampling:
    """`sampling` with `max_tokens` clamped to the room `limit - context` leaves (at least 1: a context that fills
    the limit is the backend's to refuse); unchanged where it fits or the limit is unknown."""
    if limit is None or sampling.max_tokens <= limit - context:
        return sampling
    return attrs.evolve(sampling, max_tokens=max(1, limit - context))


def _end_turn(routed, st: _Live, agent, sampling, max_turns, clock: Clock, close) -> None:
    backend = routed.backend
    with clock.span("engine"):
        context = backend.context(st.rid)
    generated = tuple(context[st.turn_start :])
    st.mask.extend([1] * len(generated))
    rec = st.rec
    version = st.turn_version if st.turn_version is not None else -1
    st.turn_version = None
    index = len(rec.turns)
    result = None
    limit = _limit(backend, backend.instance_of(st.rid)) if hasattr(backend, "spec") else None
    if limit is not None and len(context) >= limit:  # no room for another turn: the trajectory ends here
        rec.truncated = f"its context of {len(context)} tokens fills max_model_len {limit}"
    elif index + 1 < max_turns:
        t0 = time.perf_counter()
        with clock.span("tools"):
            result = agent.tool(st.rid if st.rid == rec.request_id else rec.request_id, generated, index)
        latency = time.perf_counter() - t0
    if result is None:
        rec.turns.append(Turn(gen_tokens=len(generated)))
        rec.turn_versions.append(version)
        close(st, None)
        return
    following = sampling(rec.request_id, index + 1)
    output = result.output_token_ids
    if limit is not None:  # never let a tool output fill the context: the next turn needs room to generate
        output = output[: max(0, limit - len(context) - 2 - following.max_tokens)]
        result = attrs.evolve(result, output_token_ids=tuple(output))
        following = _fit_turn(following, limit, len(context) + len(output))
    rec.turns.append(
        Turn(gen_tokens=len(generated), tool=result.tool, tool_status=result.status, tool_tokens=len(output))
    )
    rec.turn_versions.append(version)
    rec.tool_latency_s.append(latency)
    st.mask.extend([0] * len(output))
    try:
        with clock.span("engine"):
            moved = routed.tool_return(st.rid, result, following)
    except RequestFailedError as exc:
        close(st, exc.reason)
        return
    if moved is not None and moved.to_instance != moved.from_instance:
        rec.instances.append(moved.to_instance)
    with clock.span("engine"):
        st.turn_start = len(backend.context(st.rid))


def worker_loads(records: Mapping[str, TrajectoryRecord]) -> dict[str, dict[str, float]]:
    """Per instance: the trajectories that ran on it (any of their turns) and their tokens."""
    workers: dict[str, dict[str, float]] = {}
    for r in records.values():
        for name in dict.fromkeys(r.instances):
            w = workers.setdefault(name, {"trajectories": 0, "tokens": 0})
            w["trajectories"] += 1
            w["tokens"] += len(r.context)
    return workers


def routing_decision(
    routed: RoutedRollout, step: int, router: str, first_migration: int, first_decision: int
) -> dict[str, Any]:
    """The router's decisions of one step (those after the given indices), as one record (source `router`)."""
    moved = routed.migrations[first_migration:]
    return {
        "source": "router",
        "kind": "routing",
        "step": step,
        "router": router,
        "decisions": len(routed.decisions) - first_decision,
        "migrations": len(moved),
        "migrated_tokens": sum(m.migrated_tokens for m in moved),
        "moves": [
            {"request": m.request_id, "from": m.from_instance, "to": m.to_instance, "tokens": m.migrated_tokens}
            for m in moved[:50]
        ],
    }
