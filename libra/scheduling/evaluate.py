"""Replay a trace through a router in time order and score its routing.

Steps are replayed in order (a trace without `step` labels is cut into `num_chunks` consecutive chunks of file
order). Within a step every trajectory is admitted, driven turn by turn (`on_progress` every `progress_every`
generated tokens and at the end of each generation, `on_tool_return` after each tool call) and finished; then
`end_step()` lets the router learn. So routing of step s uses only trajectories of earlier steps. A tool call
without a status is replayed as "ok".

Metrics (over all replayed trajectories):
- `routing_accuracy` (single-shot): the trajectory ends in the bucket its final length belongs to, reached with
  at most one migration;
- `final_bucket_accuracy`: ends in the right bucket, however many migrations it took;
- `migrated_token_fraction`: tokens of context carried by migrations / all tokens of all trajectories;
- `migrations_per_trajectory`; `confusion[i][j]`: trajectories whose final length is in bucket i that ended in j.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from libra.scheduling.router import Router
from libra.spec import Bucket, SpecError, format_buckets
from libra.workloads.trace import Trajectory, group_by_step


@attrs.frozen(kw_only=True)
class RouteEvalResult:
    policy: str
    buckets: str
    trajectories: int
    steps: int
    routing_accuracy: float
    final_bucket_accuracy: float
    migrated_token_fraction: float
    migrations_per_trajectory: float
    migrated_tokens: int
    total_tokens: int
    confusion: tuple[tuple[int, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["confusion"] = [list(row) for row in self.confusion]
        return out


def replay(
    router: Router,
    trajectories: Sequence[Trajectory],
    *,
    policy: str | None = None,
    num_chunks: int = 10,
    progress_every: int = 512,
    warmup_steps: int = 0,
) -> RouteEvalResult:
    """Drive `router` with `trajectories` (see the module docstring) and score it. The first `warmup_steps` steps
    are replayed (the router learns from them) but not scored."""
    if not isinstance(router, Router):
        raise SpecError(f"replay needs a Router (see make_router), got {type(router).__name__}")
    if not trajectories:
        raise SpecError("route evaluation needs at least one trajectory")
    for name, value in (("num_chunks", num_chunks), ("progress_every", progress_every), ("warmup_steps", warmup_steps)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{name} must be an integer, got {value!r}")
        if value < 1 and name != "warmup_steps":
            raise SpecError(f"{name} must be >= 1, got {value!r}")
    steps = group_by_step([_with_status(t) for t in trajectories], steps_without_label=num_chunks)
    if not 0 <= warmup_steps < len(steps):
        raise SpecError(
            f"warmup_steps must be in 0..{len(steps) - 1} for a trace of {len(steps)} steps, got {warmup_steps!r}"
        )
    buckets: tuple[Bucket, ...] = router.buckets
    k = len(buckets)
    confusion = [[0] * k for _ in range(k)]
    single_shot = right = migrations = migrated = total = 0
    rid = n = 0
    for index, step in enumerate(steps):
        for traj in step:
            rid += 1
            moved, carried, final = _drive(router, rid, traj, progress_every)
            if index < warmup_steps:
                continue
            n += 1
            truth = router.bucket_for(traj.total_tokens)
            confusion[truth][final] += 1
            right += final == truth
            single_shot += final == truth and moved <= 1
            migrations += moved
            migrated += carried
            total += traj.total_tokens
        router.end_step()
    if router.num_active:
        raise SpecError(f"{router.num_active} requests were admitted but never finished")
    return RouteEvalResult(
        policy=policy or router.name,
        buckets=format_buckets(buckets),
        trajectories=n,
        steps=len(steps) - warmup_steps,
        routing_accuracy=single_shot / n,
        final_bucket_accuracy=right / n,
        migrated_token_fraction=migrated / max(1, total),
        migrations_per_trajectory=migrations / n,
        migrated_tokens=migrated,
        total_tokens=total,
        confusion=tuple(tuple(row) for row in confusion),
    )


def _with_status(traj: Trajectory) -> Trajectory:
    """The trajectory with "ok" for the status of a tool call that has none (a `Turn` built in code may leave it
    out; a trace file may not), so the router's tool return and what it learns at the step's end agree."""
    if all(turn.tool is None or turn.tool_status is not None for turn in traj.turns):
        return traj
    turns = tuple(
        attrs.evolve(turn, tool_status="ok") if turn.tool is not None and turn.tool_status is None else turn
        for turn in traj.turns
    )
    return attrs.evolve(traj, turns=turns)


def _drive(router: Router, rid: int, traj: Trajectory, progress_every: int) -> tuple[int, int, int]:
    """One request from admission to finish; returns (migrations, migrated tokens, final bucket)."""
    d = router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens, final_tokens=traj.total_tokens)
    bucket, moved, carried = d.bucket, 0, 0
    context = traj.prompt_tokens

    def note(decision) -> None:
        nonlocal bucket, moved, carried
        if decision.migrate:
            moved += 1
            carried += decision.migrated_tokens
        bucket = decision.bucket

    for turn in traj.turns:
        end = context + turn.gen_tokens
        for c in range(context + progress_every, end, progress_every):
            note(router.on_progress(rid, context_tokens=c))
        note(router.on_progress(rid, context_tokens=end))
        context = end + turn.tool_tokens
        if turn.tool is not None:
            assert turn.tool_status is not None  # (`_with_status` set every missing one)
            note(
                router.on_tool_return(
                    rid,
                    tool=turn.tool,
                    tool_tokens=turn.tool_tokens,
                    status=turn.tool_status,
                    context_tokens=context,
                )
            )
    router.finish(rid, traj)
    return moved, carried, bucket


def compare(
    make: Callable[[str], Router], policies: Sequence[str], trajectories: Sequence[Trajectory], **kw: Any
) -> list[RouteEvalResult]:
    """`replay` for several policies on the same trajectories; `make(policy)` builds a fresh router."""
    return [replay(make(p), trajectories, policy=p, **kw) for p in policies]


def as_agent_log(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The same trajectories as a real agent log usually is: one run per task (every prompt id unique), no step
    and no sample labels, file order as time order. Routing then has no per-prompt history to lean on."""
    return [attrs.evolve(t, prompt_id=f"task-{i}", step=None, sample=None) for i, t in enumerate(trajectories)]
