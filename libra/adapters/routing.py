"""Apply a router's `RouteDecision`s to a rollout backend, and run multi-turn trajectories with tools.

`RoutedRollout` maps each bucket index of the router to the rollout instances that serve it. A decision with
`migrate=True` becomes `backend.migrate(request, an instance of the new bucket)`; the instance within a bucket is
the one with the fewest requests. `run()` is the agentic loop: generate a turn, call the tool, report the tool
return to the router, migrate if told, append the tool output, generate the next turn, until the tool says the
trajectory is done or `max_turns` is reached. Every routing decision and migration is kept (`decisions`,
`migrations`) so that a test or a log can replay exactly what happened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from libra.adapters.errors import RequestFailedError, UnsupportedConfig
from libra.adapters.protocols import RolloutBackend
from libra.adapters.types import EventKind, Migration, Sampling, StreamEvent
from libra.spec import SpecError
from libra.workloads.trace import TOOL_STATUSES, Trajectory, Turn


@attrs.frozen(kw_only=True)
class ToolReturn:
    """What a tool call returned: the tool, its status (ok/error/timeout) and its output as token ids."""

    tool: str
    status: str
    output_token_ids: tuple[int, ...]

    def __attrs_post_init__(self) -> None:  # (refused here, in the tool that built it, not inside the rollout's loop)
        if not isinstance(self.tool, str) or not self.tool:
            raise SpecError(f"ToolReturn.tool must be a non-empty string, got {self.tool!r}")
        if not isinstance(self.status, str) or self.status not in TOOL_STATUSES:
            raise SpecError(f"ToolReturn.status must be one of {', '.join(TOOL_STATUSES)}, got {self.status!r}")


ToolFn = Callable[[str, tuple[int, ...], int], ToolReturn | None]
"""`tool(request_id, turn_token_ids, turn_index) -> ToolReturn`, or None when the trajectory ends here."""


@attrs.frozen(kw_only=True)
class RolloutResult:
    """One trajectory: its final context, its trajectory record (turns, for the router and profiles; None for a
    request that failed before its first turn ended), the instances it visited in order, and the error if it
    failed (the router was told to forget it: `abort`, not `finish`)."""

    request_id: str
    context: tuple[int, ...]
    trajectory: Trajectory | None
    instances: tuple[str, ...]
    error: str | None = None


class RoutedRollout:
    def __init__(self, *, backend: RolloutBackend, router: Any, bucket_instances: Mapping[int, Sequence[str]]):
        missing = [b for b in range(len(router.buckets)) if not bucket_instances.get(b)]
        if missing:
            raise ValueError(f"buckets {missing} have no instance; bucket_instances={dict(bucket_instances)}")
        self.backend, self.router = backend, router
        self.bucket_instances = {b: tuple(names) for b, names in bucket_instances.items()}
        self.decisions: list[Any] = []
        self.migrations: list[Migration] = []
        self.events: list[StreamEvent] = []

    def pick(self, bucket: int) -> str:
        """The instance of `bucket` with the fewest requests (ties: by name)."""
        if bucket not in self.bucket_instances:
            raise UnsupportedConfig(
                f"the router chose bucket {bucket!r}; instances serve {sorted(self.bucket_instances)}"
            )
        live = self.backend.instances()
        names = [n for n in self.bucket_instances[bucket] if n in live]
        if not names:
            raise RequestFailedError(
                "-",
                f"bucket {bucket}'s instances {list(self.bucket_instances[bucket])} are not live (live: {list(live)})",
            )
        load = getattr(self.backend, "num_requests", lambda n: 0)
        return min(names, key=lambda n: (load(n), n))

    def _pick_for(self, request_id: str, bucket: int) -> str:
        try:
            return self.pick(bucket)
        except RequestFailedError as exc:  # `pick` knows the bucket, not the request
            if exc.request_id != "-":
                raise
            raise RequestFailedError(request_id, exc.reason) from None

    def admit(self, request_id: str, *, prompt_id: str, prompt_token_ids: Sequence[int], sampling: Sampling) -> str:
        decision = self.router.admit(request_id, prompt_id=prompt_id, prompt_tokens=len(prompt_token_ids))
        self.decisions.append(decision)
        instance = self._pick_for(request_id, decision.bucket)
        self.backend.submit(request_id, instance, prompt_token_ids, sampling)
        return instance

    def tool_return(self, request_id: str, result: ToolReturn, sampling: Sampling) -> Migration | None:
        """Report a tool return, apply the decision (migrate before the tool output is prefilled), resume."""
        context = len(self.backend.context(request_id)) + len(result.output_token_ids)
        decision = self.router.on_tool_return(
            request_id,
            tool=result.tool,
            tool_tokens=len(result.output_token_ids),
            status=result.status,
            context_tokens=context,
        )
        self.decisions.append(decision)
        moved = self._apply(decision)
        self.backend.resume(request_id, result.output_token_ids, sampling)
        return moved

    def progress(self, request_id: str) -> Migration | None:
        decision = self.router.on_progress(request_id, context_tokens=len(self.backend.context(request_id)))
        self.decisions.append(decision)
        return self._apply(decision)

    def _apply(self, decision: Any) -> Migration | None:
        if not decision.migrate:
            return None
        request_id = str(decision.request_id)
        moved = self.backend.migrate(request_id, self._pick_for(request_id, decision.bucket))
        self.migrations.append(moved)
        return moved

    def run(
        self,
        prompts: Mapping[str, tuple[str, Sequence[int]]],
        *,
        sampling: Sampling,
        tool: ToolFn,
        max_turns: int,
        step: int = 0,
        max_polls: int = 100_000,
    ) -> dict[str, RolloutResult]:
        """Run every trajectory to its end; `prompts` maps request id -> (prompt id, prompt token ids).
        Returns one result per request: none is dropped (a failed one carries `error`)."""
        for name, value in (("max_turns", max_turns), ("max_polls", max_polls)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RoutedRollout.run: {name} must be a whole number >= 1, got {value!r}")
        turns: dict[str, list[Turn]] = {rid: [] for rid in prompts}
        visited: dict[str, list[str]] = {rid: [] for rid in prompts}
        turn_start: dict[str, int] = {}
        results: dict[str, RolloutResult] = {}
        submitted: set[str] = set()  # on the backend until closed: released if the loop stops early

        def close(rid: str, error: str | None) -> None:
            pid, ids = prompts[rid]
            done = tuple(turns[rid])
            # a request that failed before its first turn ended has no trajectory (the trace schema wants a turn)
            traj = Trajectory(prompt_id=pid, prompt_tokens=len(ids), turns=done, step=step) if done else None
            context: Sequence[int] = ()
            if rid in submitted:
                submitted.discard(rid)
                try:
                    context = self.backend.release(rid)
                except RequestFailedError as exc:
                    error = error or exc.reason
                except KeyError:  # it never reached the backend (no instance to submit it to)
                    pass
            if error is None and traj is not None:
                self.router.finish(rid, traj)
            else:  # a failed request teaches the router nothing (its partial turns are not how it would have gone)
                abort = getattr(self.router, "abort", None)
                if abort is not None:
                    abort(rid)
            results[rid] = RolloutResult(
                request_id=rid, context=tuple(context), trajectory=traj, instances=tuple(visited[rid]), error=error
            )

        try:
            for rid, (pid, ids) in prompts.items():
                turn_start[rid] = len(ids)
                try:
                    visited[rid].append(self.admit(rid, prompt_id=pid, prompt_token_ids=ids, sampling=sampling))
                    submitted.add(rid)
                except RequestFailedError as exc:  # no live instance, or the prompt does not fit the instance
                    submitted.add(rid)  # a failed submit stays on the backend until released
                    close(rid, exc.reason)
            self._loop(prompts, results, turns, visited, turn_start, sampling, tool, max_turns, max_polls, close)
        except BaseException:  # a failure or Ctrl-C: leave none of this rollout's requests behind on the engines
            for rid in list(submitted):
                with contextlib.suppress(Exception):
                    self.backend.release(rid)
            raise
        return results

    def _loop(self, prompts, results, turns, visited, turn_start, sampling, tool, max_turns, max_polls, close):
        for _ in range(max_polls):
            if len(results) == len(prompts):
                return
            for ev in self.backend.poll():
                self.events.append(ev)
                rid = ev.request_id
                if rid in results or rid not in prompts:
                    continue  # closed already (an event of a turn aborted on its way), or another caller's
                if ev.kind == EventKind.TOKENS:
                    try:  # the context grew: the router may promote it (overflow)
                        moved = self.progress(rid)
                    except RequestFailedError as exc:  # the target instance cannot take it
                        close(rid, exc.reason)
                        continue
                    if moved is not None and moved.to_instance != moved.from_instance:
                        visited[rid].append(moved.to_instance)
                elif ev.kind == EventKind.REQUEUED:
                    visited[rid].append(ev.instance)
                elif ev.kind == EventKind.FAILED:
                    close(rid, ev.error)
                elif ev.kind == EventKind.FINISHED:
                    self._end_turn(rid, turns, visited, turn_start, sampling, tool, max_turns, close)
        if len(results) < len(prompts):
            raise RuntimeError(f"rollout did not finish in {max_polls} polls: {sorted(set(prompts) - set(results))}")

    def _end_turn(self, rid, turns, visited, turn_start, sampling, tool, max_turns, close) -> None:
        context = self.backend.context(rid)
        generated = tuple(context[turn_start[rid] :])
        result = tool(rid, generated, len(turns[rid])) if len(turns[rid]) + 1 < max_turns else None
        if result is None:
            turns[rid].append(Turn(gen_tokens=len(generated)))
            close(rid, None)
            return
        turns[rid].append(
            Turn(
                gen_tokens=len(generated),
                tool=result.tool,
                tool_status=result.status,
                tool_tokens=len(result.output_token_ids),
            )
        )
        try:
            moved = self.tool_return(rid, result, sampling)
        except RequestFailedError as exc:  # e.g. the tool output does not fit the instance's context
            close(rid, exc.reason)
            return
        if moved is not None and moved.to_instance != moved.from_instance:
            visited[rid].append(moved.to_instance)
        turn_start[rid] = len(self.backend.context(rid))
