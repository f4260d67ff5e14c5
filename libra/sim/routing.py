"""Routing of one step's requests to buckets, segment by segment, computed before the timed simulation.

Routing decisions depend only on the order of a request's own events (admission, then each tool return) and on
what the router learned at earlier step boundaries, never on simulated time: the C-MLFQ prefix tree changes only at
`end_step`. So the simulator replays each step's trajectories through the router once per bucket set and hands the
timed rollout two arrays: `bucket[i, t]`, the bucket that serves segment t of request i, and `carried[i, t]`, the
context a migration before segment t carries (0 when the request stays).

Modes: `single` (one bucket, nothing moves), `overflow` (start in the smallest bucket, move to the bucket of the
context once it outgrows its bucket: length-bucketed serving without prediction), `cmlfq` (the real
`libra.scheduling.CMLFQRouter`, sharing one prefix tree that learns every step's finished trajectories, so all
policies see the same tree at step s), `final` (perfect routing: every segment of a request is served by the bucket
of its final context from admission on and nothing moves; it reads each request's future, so it is no router but the
routing the planner's `final-length` model assumes, and the upper bound of what routing can gain).
"""

from __future__ import annotations

import attrs
import numpy as np

from libra.scheduling import CMLFQRouter, PrefixTree
from libra.scheduling.node import native as node_native
from libra.scheduling.states import StateCodec
from libra.sim.workload import StepWork
from libra.spec import Bucket, SpecError
from libra.workloads.trace import TOOL_STATUSES

ROUTING_MODES = ("single", "overflow", "cmlfq", "final")


@attrs.frozen(kw_only=True, eq=False)
class Routes:
    bucket: np.ndarray  # (n, S) int, bucket of each decode segment
    carried: np.ndarray  # (n, S) int, tokens moved before segment s

    @property
    def migrations(self) -> int:
        return int((self.carried > 0).sum())


def _contexts(work: StepWork) -> tuple[np.ndarray, np.ndarray]:
    """Context after each turn's generation, and after its tool return."""
    per_turn = work.gen + work.tool_tokens
    after_turn = work.prompt_tokens[:, None] + np.cumsum(per_turn, axis=1)
    return after_turn - work.tool_tokens, after_turn


def overflow_routes(work: StepWork, buckets: tuple[Bucket, ...]) -> Routes:
    n, width = work.gen.shape
    limits = np.array([b.max_tokens for b in buckets[:-1]], float)
    bucket = np.zeros((n, width), np.int64)
    carried = np.zeros((n, width), np.int64)
    if len(buckets) == 1:
        return Routes(bucket=bucket, carried=carried)
    _, after_tool = _contexts(work)
    current = np.zeros(n, np.int64)
    for t in range(1, width):
        ctx = after_tool[:, t - 1]
        need = np.searchsorted(limits, ctx, side="left")  # first bucket whose max_tokens >= ctx
        move = (need > current) & (t < work.num_segments)
        carried[move, t] = ctx[move] - work.tool_tokens[move, t - 1]
        current = np.where(move, need, current)
        bucket[:, t] = current
    return Routes(bucket=bucket, carried=carried)


def final_routes(work: StepWork, buckets: tuple[Bucket, ...]) -> Routes:
    """Perfect routing: each request's every segment on the smallest bucket whose `max_tokens` holds its final
    context (prompt, decoded and tool tokens: `StepWork.total_tokens`, the length the planner's `final-length`
    model places a request by, with its edge: a request of exactly `max_tokens` stays in that bucket), nothing
    carried."""
    limits = np.array([b.max_tokens for b in buckets[:-1]], float)
    home = np.searchsorted(limits, work.total_tokens, side="left")  # as `GlobalPlanner.rollout_time` places it
    bucket = np.broadcast_to(home.astype(np.int64)[:, None], work.gen.shape).copy()
    return Routes(bucket=bucket, carried=np.zeros(work.gen.shape, np.int64))


class CausalRouting:
    """C-MLFQ decisions for every step with one shared prefix tree (`learn` after each step)."""

    def __init__(self, **router_options) -> None:
        self.tree = PrefixTree()
        self.options = router_options
        self._cache: dict[tuple[int, tuple[Bucket, ...], str], Routes] = {}
        self._learned = -1

    def learn(self, work: StepWork) -> None:
        """Step boundary: the tree learns this step's finished trajectories (call once per step, in order)."""
        if work.step <= self._learned:
            raise SpecError(f"step {work.step} already learned (the tree learns each step once, in order)")
        self.tree.update(work.trajectories)
        self._learned = work.step
        self._cache = {k: v for k, v in self._cache.items() if k[0] > work.step}

    def routes(self, work: StepWork, buckets: tuple[Bucket, ...], *, admit: str = "smallest") -> Routes:
        """`admit`: where a new request starts, `smallest` (published) or `predicted` (the CMLFQRouter option)."""
        if work.step <= self._learned:
            raise SpecError(f"routing step {work.step} with a tree that has learned it (that reads the future)")
        key = (work.step, buckets, admit)
        if key not in self._cache:
            self._cache[key] = self._replay(work, buckets, admit)
        return self._cache[key]

    def _replay(self, work: StepWork, buckets: tuple[Bucket, ...], admit: str) -> Routes:
        n, width = work.gen.shape
        bucket = np.zeros((n, width), np.int64)
        carried = np.zeros((n, width), np.int64)
        if len(buckets) == 1:
            return Routes(bucket=bucket, carried=carried)
        router = CMLFQRouter(buckets, tree=self.tree, admit=admit, **self.options)
        limits = router.limits
        after_gen, after_tool = _contexts(work)
        # only the segments that can move a request (all but each request's last), flattened row by row: python
        # lists of the padded (n, S) arrays would convert mostly padding
        used = np.arange(width) < (work.num_segments - 1)[:, None]
        gen_used, tool_used = after_gen[used], after_tool[used]
        if _replay_native(router, work, gen_used, tool_used, used, bucket, carried):
            return Routes(bucket=bucket, carried=carried)
        nseg = work.num_segments.tolist()
        gen_ctx, tool_ctx = gen_used.tolist(), tool_used.tolist()
        tool_end, turn_of = work.tool_end[used].tolist(), work.turn_of[used].tolist()
        o = 0
        for i, traj in enumerate(work.trajectories):
            b = router.admit(i, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens).bucket
            row_b, row_c = bucket[i], carried[i]
            for s in range(nseg[i] - 1):
                moved = 0
                if gen_ctx[o] > limits[b]:
                    d = router.on_progress(i, context_tokens=gen_ctx[o])
                    b, moved = d.bucket, d.migrated_tokens
                if tool_end[o]:
                    turn = traj.turns[turn_of[o]]
                    d = router.on_tool_return(
                        i,
                        tool=turn.tool,
                        tool_tokens=turn.tool_tokens,
                        status=turn.tool_status,
                        context_tokens=tool_ctx[o],
                    )
                    if d.migrate:
                        b, moved = d.bucket, d.migrated_tokens
                row_b[s + 1] = b
                row_c[s + 1] = moved
                o += 1
        return Routes(bucket=bucket, carried=carried)


def _replay_native(
    router: CMLFQRouter,
    work: StepWork,
    gen_ctx: np.ndarray,
    tool_ctx: np.ndarray,
    used: np.ndarray,
    bucket: np.ndarray,
    carried: np.ndarray,
) -> bool:
    """`_replay`'s loop in C (`libra.scheduling._tree_native.replay`, ext/scheduling/replay_native.c) for a
    router with the published rule on its inline path, a plain size-class codec and no ceiling or repay: the same
    buckets and carried tokens, written into `bucket` and `carried`; False (both left zero) where the Python loop
    must run: the extension not built (or `LIBRA_PURE_PYTHON`), another rule or option, or a value only the
    router's own checks may judge. tests/sim/test_replay_native.py compares the two."""
    native = node_native()
    tree = router.tree
    if (
        native is None
        or type(router) is not CMLFQRouter
        or router.rule != "mean-p90"
        or not router._inline
        or router.fallback == "scaled"
        or router.ceiling is not None
        or router.repay is not None
        or type(tree.codec) is not StateCodec
        or len(work.gen) == 0
    ):
        return False
    got = native.replay(
        work.trajectories, tree.agnostic, tree.prompts, tree.codec, TOOL_STATUSES, router.limits,
        int(router.min_count), router.fallback == "agnostic", router.overflow, router.admit_mode == "predicted",
        router.cost_ratio, np.ascontiguousarray(work.num_segments, np.int64), np.ascontiguousarray(gen_ctx, np.int64),
        np.ascontiguousarray(tool_ctx, np.int64), np.ascontiguousarray(work.tool_end[used], bool),
        np.ascontiguousarray(work.turn_of[used], np.int64), bucket, carried,
    )  # fmt: skip
    if got is NotImplemented:
        bucket[:] = 0
        carried[:] = 0
        return False
    return True


_last_stay: list[tuple[StepWork, Routes]] = []  # the last step's: every one-bucket policy of that step shares it


def _stay(work: StepWork) -> Routes:
    """Every segment in bucket 0, nothing carried: one read-only zero array, shared by the policies that route a
    step to one bucket (a step's (n, S) array is tens of MB at 65,536 requests; zeroing it was 12 ms a policy)."""
    if _last_stay and _last_stay[0][0] is work:
        return _last_stay[0][1]
    zeros = np.zeros(work.gen.shape, np.int64)
    zeros.flags.writeable = False
    routes = Routes(bucket=zeros, carried=zeros)
    _last_stay[:] = [(work, routes)]
    return routes


def routes_for(
    mode: str, work: StepWork, buckets: tuple[Bucket, ...], causal: CausalRouting | None, *, admit: str = "smallest"
) -> Routes:
    if mode == "single" or len(buckets) == 1:
        return _stay(work)
    if mode == "overflow":
        return overflow_routes(work, buckets)
    if mode == "final":
        return final_routes(work, buckets)
    if mode == "cmlfq":
        if causal is None:
            raise SpecError("cmlfq routing needs the shared CausalRouting")
        return causal.routes(work, buckets, admit=admit)
    raise SpecError(f"unknown routing mode {mode!r}; expected one of {', '.join(ROUTING_MODES)}")
