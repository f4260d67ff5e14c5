"""The `priced` rule of C-MLFQ after a tool return (the default preset's hot path), as a mixin of `CMLFQRouter`.

With bucket probabilities `P`, `T` the mean trajectory length (the prompt-agnostic root) and `price` the accuracy one
may give up per `T` tokens carried, a request moves to its likeliest bucket `b` at a tool return only when the gain
pays for the move (`P(b) - P(current) >= price * carried / T`) and it is sure enough or waiting is dear
(`P(b) >= confidence - price * tool_tokens / T`); at most once; an overflow is priced the same way, and with no
statistics at all (a cold tree) promoted (cmlfq.py's module docstring has the whole rule). The attributes read here
are set by `CMLFQRouter.__init__`. `_priced_call` is the rule in Python; ext/scheduling/priced_native.c runs its
inline path in C where the extension is built (`_priced_native`, the router's `on_tool_return`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from math import floor
from types import MethodType, ModuleType
from typing import TYPE_CHECKING, Any

from libra.scheduling.node import native
from libra.scheduling.router import Request, RouteDecision, Router
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.states import StateCodec
from libra.scheduling.tree import Node, PrefixTree
from libra.scheduling.walk import Walk
from libra.workloads.trace import TOOL_STATUSES

if TYPE_CHECKING:
    from libra.scheduling.shrinkage import ShrinkFit


# more than half of the (blended) shares: the likeliest bucket, whatever the others hold (they sum to at most 1; the
# margin covers the rounding of the shares, ~1e-15)
_MAJORITY = 0.5 + 1e-9


def _bind_native() -> ModuleType | None:
    """The C extension with `_priced_call`'s inline path (ext/scheduling/priced_native.c) bound to the classes it
    reads, or None where it is not built (or `LIBRA_PURE_PYTHON` is set)."""
    ext = native()
    if ext is not None:
        ext.bind_priced(Walk, Request, RouteDecision, StateCodec, QuantileStateCodec, TOOL_STATUSES, _MAJORITY)
    return ext


_bind_native()


class PricedRule:
    """`CMLFQRouter`'s tool-return path when the rule is `priced` (module docstring)."""

    # set by CMLFQRouter.__init__ (cmlfq.py) and Router.__init__ (router.py)
    tree: PrefixTree
    limits: tuple[float, ...]
    min_count: int
    fallback: str
    beyond: str
    cold: str
    overflow: bool
    confidence: float
    shrink: float
    budget: float | None
    ceiling: float | None
    repay: int | None
    _fit: ShrinkFit | None
    _inline: bool
    _blend: tuple[list[float], list[float], float] | None
    _floor_limits: tuple[int, ...]
    _finite_limits: tuple[float, ...]
    _ups_table: dict[int, tuple[list[int], float]]
    _ups_of: list[int] | None
    _ups_total: int
    _cold_carried: int
    _cold_finished: int
    _context_in_flight: int
    _requests: dict[Any, Request]

    if TYPE_CHECKING:

        def _book_tool_return(
            self, request_id: Any, tool: str, tool_tokens: int, status: str, context_tokens: int
        ) -> Request: ...

        def _move(self, req: Request, target: int, carried: int, reason: str) -> RouteDecision: ...

        def _probabilities(
            self, walk: Walk, ctx: int, min_count: int | None = None, record: bool = False
        ) -> list[float] | None: ...

        def _bucket_probs(self, node: Node, anchor: int, scale: float, ctx: int) -> list[float] | None: ...

        def bucket_for(self, length: float) -> int: ...

    @property
    def _priced_native(self) -> Callable[..., RouteDecision]:
        """The router's `on_tool_return` with the `priced` rule: `_priced_call`'s inline path in C, bound to this
        router (`_tree_native._priced_native`: the same decisions and writes; it hands every other case to
        `_priced_call`, tests/scheduling/test_priced_native.py), or `_priced_call` itself without the extension.
        (A pickled router's `on_tool_return` is found again by this name.)"""
        ext = native()
        if ext is None:
            return self._priced_call
        return MethodType(ext._priced_native, self)

    def _priced_call(
        self, request_id: Any, *, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> RouteDecision:
        """`on_tool_return` with the `priced` rule (module docstring): move once, when the gain pays for the carried
        context and the router is sure enough or waiting would carry the large return just received. The router's
        `on_tool_return` when the rule is `priced` and the C extension is not built, else the reference and the
        fallback of its C twin (`_priced_native`, which hands it every call it does not take): `Router.on_tool_return`'s
        checks and books, then the rule, written out (no `_tool_return` call, no (bucket, reason) pair).

        The hot path of the default preset (issue 14: under 10 us a call): the walk of `_tool_return`, `_select`,
        `_bucket_probs` (unscaled), the shrinkage blend of `_probabilities` and `_record` are written out here, each
        call costing about as much as the work it does; the same arithmetic in the same order, so the same decisions
        (test_golden.py, test_fast_paths.py). The `scaled` fallback and an empty window take the general path.

        Two exits decide "stay" before all the shares are found (issue 14, decisions identical): a request that
        already moved and keeps no decision points (no budget) stays whatever the shares, unless the shrinkage fit
        records this return; and when the bucket the request was admitted to (where it still is, or it moved and
        its decision points are kept relative to that bucket) holds more than half of the blended share, it is the
        likeliest bucket, so no move, no overflow move and no decision point follows: only that bucket's share is
        found (the fit's record, when it takes one, is made first, from the node's shares). Without an exit the
        shares are found and blended in one pass (two when the fit records: it keeps the node's shares)."""
        req = self._book_tool_return(request_id, tool, tool_tokens, status, context_tokens)
        ctx = context_tokens
        code = self.tree.codec.encode(tool, tool_tokens, status)
        walk: Walk = req.state
        m = self.min_count
        node = None
        if walk.p_exact:  # (`_tool_return`'s walk)
            child = walk.p_node.children.get(code)  # type: ignore[union-attr]
            if child is None or child.count < m:
                walk.p_exact = False
            else:
                walk.p_node, walk.p_ctx = child, ctx
                node = child  # on the prompt's path and seen: `_select`'s first choice
        if walk.a_exact:
            child = walk.a_node.children.get(code)
            if child is None or child.count < m:
                walk.a_exact = False
            else:
                walk.a_node, walk.a_ctx = child, ctx
        fit = self._fit
        record = fit is not None and fit.taken < fit.per_step and len(walk.calib) < fit.per_request
        if not record and req.migrations and walk.points is None and self._inline:
            # moved already (never twice) and no decision points to keep
            # (`Router._move`'s commonest case inline; a stay's first decision is made by `Router._move`, past
            # `CMLFQRouter._move`, which adds only the ceiling's books of a move)
            stay = req.stay
            if stay is not None and stay.bucket == req.bucket:
                return stay
            return Router._move(self, req, req.bucket, 0, "stay")  # type: ignore[arg-type]
        root = self.tree.agnostic
        # the node that stands for the request (`_select`, inline; no `scaled` fallback here, so no scale)
        if node is not None:
            anchor = ctx
        else:  # (the prompt's path left the tree: `_select`'s first choice is out)
            p_node = walk.p_node
            a_node = walk.a_node
            if walk.a_exact and self.fallback == "agnostic" and a_node.count >= m:
                node, anchor = a_node, walk.a_ctx
            elif p_node is not None and p_node.count >= m:
                node, anchor = p_node, walk.p_ctx
            elif a_node.count >= m:
                node, anchor = a_node, walk.a_ctx
        ordered = node.ordered if node is not None else None
        mean = None
        if not ordered or self.fallback == "scaled" or not self._inline:  # (no node, an empty window, or scaled)
            probs = self._probabilities(walk, ctx, record=record)
            blend = self._blend
        else:
            # `_bucket_probs(node, anchor, 1.0, ctx)`, inline (integer keys, see there)
            blend = probs = None
            n = len(ordered)
            i = bisect_right(ordered, ctx - anchor - 1)
            r_ordered = root.ordered
            if walk.ups_of is not r_ordered or walk.ups_total != root.total:
                self._root_ups(walk, root)  # (the root's window changed since they were found)
            mean = walk.mean
            if i < n:
                below = i / n
                alive = 1.0 - below
                shrink = self.shrink
                r_below = rn = -1  # no blend (`r_below < rn`: a blend)
                if shrink and node is not root:
                    rn = len(r_ordered)
                    r_below = bisect_right(r_ordered, ctx - walk.root_ctx - 1)  # (rn when none ran that long)
                    if r_below < rn:  # the blend's weights
                        survivors = alive * n
                        w = survivors / (survivors + shrink)
                        v = 1.0 - w
                t = walk.admitted
                early = req.migrations or t == req.bucket  # (the early exit may apply)
                if record:
                    # the node's shares, kept whole for the fit's record (blended below)
                    probs = []
                    for limit in self._floor_limits:
                        j = bisect_right(ordered, limit - anchor)
                        if j > i:
                            upto = j / n
                            probs.append((upto - below) / alive)
                            below, i = upto, j
                        else:
                            probs.append(0.0)
                    if len(probs) < len(self.limits):
                        probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
                    if r_below < rn:  # the fit's record: the root's shares are found at finish (`_resolved_calib`)
                        blend = (probs, ctx, survivors)  # type: ignore[assignment]
                    elif node is not root and not shrink and r_ordered and ctx - walk.root_ctx - 1 < r_ordered[-1]:
                        # the fit's record without a blend: its population shares are found when the request
                        # finishes (`_resolved_calib`), off this path. Whether there are any (a trajectory of the
                        # root's window ran longer than the request has) is one comparison: `_root_probs` is None
                        # otherwise.
                        blend = (probs, ctx, alive * n)  # type: ignore[assignment]
                    if blend is not None:
                        walk.calib.append(blend)
                        fit.taken += 1
                        blend = None  # (recorded)
                    x = probs[t]
                elif early:
                    # the node's share of the admission bucket `t` alone, by the arithmetic of the full pass (there
                    # `below` is the share under the last limit whose position passed the survivors', here that
                    # position `lo` directly: the positions grow with the limits)
                    limits = self._floor_limits
                    lo = i
                    if t:
                        j = bisect_right(ordered, limits[t - 1] - anchor)
                        if j > lo:
                            lo = j
                    if t < len(limits):
                        j = bisect_right(ordered, limits[t] - anchor)
                        x = (j / n - lo / n) / alive if j > lo else 0.0
                    else:  # the unbounded last bucket
                        x = (1.0 - lo / n) / alive if lo < n else 0.0
                if early:
                    # the early exit (docstring): bucket `t`'s blended share, as the blend below makes it
                    if r_below < rn:
                        ups = walk.ups
                        r_lo = r_below
                        if t and ups[t - 1] > r_lo:  # type: ignore[index]
                            r_lo = ups[t - 1]  # type: ignore[index]
                        if t < len(ups):  # type: ignore[arg-type]
                            up = ups[t]  # type: ignore[index]
                            if up > r_lo:
                                x = w * x + v * ((up - r_lo) / (rn - r_below))
                            else:
                                x = w * x + v * 0.0
                        else:
                            x = w * x + v * ((rn - r_lo) / (rn - r_below))
                    if x > _MAJORITY:  # bucket t is the likeliest (the shares sum to at most 1)
                        points = walk.points
                        if points and points[-1] is None:
                            points.pop()
                        stay = req.stay
                        if stay is not None and stay.bucket == req.bucket:
                            return stay
                        return Router._move(self, req, req.bucket, 0, "stay")  # type: ignore[arg-type]
                if record:
                    if r_below < rn:  # the blend with the population (`_probabilities`)
                        # `_root_probs(root, walk.root_ctx, ctx)`, inline; the bisections of the bucket limits
                        # depend only on the root's window and the request's anchor: made once per request and root
                        # window. Each bucket's mix made as its population share is found (no prior list, no copy)
                        r_alive = rn - r_below
                        mixed = []
                        k = 0
                        for upto in walk.ups:  # type: ignore[union-attr]
                            if upto > r_below:
                                mixed.append(w * probs[k] + v * ((upto - r_below) / r_alive))  # type: ignore[index]
                                r_below = upto
                            else:
                                mixed.append(w * probs[k] + v * 0.0)  # type: ignore[index]
                            k += 1
                        if k < len(probs):  # type: ignore[arg-type]
                            mixed.append(w * probs[k] + v * ((rn - r_below) / r_alive))  # type: ignore[index]
                        probs = mixed
                elif r_below < rn:
                    # no record to keep: the node's shares and their blend with the population's in one pass (the
                    # arithmetic of the two passes above)
                    r_alive = rn - r_below
                    probs = []
                    for limit, up in zip(self._floor_limits, walk.ups):  # type: ignore[arg-type]
                        j = bisect_right(ordered, limit - anchor)
                        if j > i:
                            upto = j / n
                            x = (upto - below) / alive
                            below, i = upto, j
                        else:
                            x = 0.0
                        if up > r_below:
                            probs.append(w * x + v * ((up - r_below) / r_alive))
                            r_below = up
                        else:
                            probs.append(w * x + v * 0.0)
                    if len(probs) < len(self.limits):
                        x = (1.0 - below) / alive if below < 1.0 else 0.0
                        probs.append(w * x + v * ((rn - r_below) / r_alive))
                else:  # no blend
                    probs = []
                    for limit in self._floor_limits:
                        j = bisect_right(ordered, limit - anchor)
                        if j > i:
                            upto = j / n
                            probs.append((upto - below) / alive)
                            below, i = upto, j
                        else:
                            probs.append(0.0)
                    if len(probs) < len(self.limits):
                        probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
            elif self.beyond == "root" and root.count:
                # the request outlived every observation at its node (`_probabilities`): the root's shares from the
                # context it had at admission (`_bucket_probs(root, walk.root_ctx, 1.0, ctx)`, inline: the limits'
                # positions are the walk's `ups`), or, if it outlived them all too, the bucket of its context
                rn = len(r_ordered)
                r_i = bisect_right(r_ordered, ctx - walk.root_ctx - 1)
                if r_i < rn:
                    below = r_i / rn
                    alive = 1.0 - below
                    ups = walk.ups
                    t = walk.admitted
                    if req.migrations or t == req.bucket:  # the early exit (docstring), as on the node's window
                        lo = r_i
                        if t and ups[t - 1] > lo:  # type: ignore[index]
                            lo = ups[t - 1]  # type: ignore[index]
                        if t < len(ups):  # type: ignore[arg-type]
                            j = ups[t]  # type: ignore[index]
                            x = (j / rn - lo / rn) / alive if j > lo else 0.0
                        else:  # the unbounded last bucket
                            x = (1.0 - lo / rn) / alive if lo < rn else 0.0
                        if x > _MAJORITY:
                            points = walk.points
                            if points and points[-1] is None:
                                points.pop()
                            stay = req.stay
                            if stay is not None and stay.bucket == req.bucket:
                                return stay
                            return Router._move(self, req, req.bucket, 0, "stay")  # type: ignore[arg-type]
                    probs = []
                    for j in ups:  # type: ignore[union-attr]
                        if j > r_i:
                            upto = j / rn
                            probs.append((upto - below) / alive)
                            below, r_i = upto, j
                        else:
                            probs.append(0.0)
                    if len(probs) < len(self.limits):
                        probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
                else:
                    probs = [0.0] * len(self.limits)
                    probs[self.bucket_for(ctx)] = 1.0
        if record and blend is not None:
            walk.calib.append(blend)
            fit.taken += 1  # type: ignore[union-attr]
        points = walk.points
        if points and points[-1] is None:
            points.pop()
        if probs is None:
            target, reason = self._priced_overflow(req, probs, carried=ctx - tool_tokens)
            return self._move(req, target, ctx - tool_tokens, reason)
        top = max(probs)
        best = probs.index(top)
        if mean is None:
            mean = max(1.0, root.mean + req.prompt_tokens)  # _mean_length, inline
        carried = ctx - tool_tokens
        if points is not None:
            # `_record`, inline: the price interval in which this return would move the request out of its
            # admission bucket (budget.py)
            a = walk.admitted
            if best != a:
                hi = (top - probs[a]) * mean / carried if carried > 0 else float("inf")
                need = self.confidence - top
                low = 0.0 if need <= 0 else (need * mean / tool_tokens if tool_tokens > 0 else float("inf"))
                if low <= hi:
                    points.append((low, hi, carried))
                if self.overflow and best > a and ctx > self.limits[a]:
                    points.append((0.0, top * mean / ctx, carried))
        if req.migrations == 0:
            current = req.bucket
            unit = walk.price / mean
            if (
                best != current
                and top - probs[current] >= unit * carried
                and top >= self.confidence - unit * tool_tokens
            ):
                return self._move(req, best, carried, "tool-return")
        if req.migrations or ctx <= self.limits[req.bucket] or not self.overflow:
            stay = req.stay
            if stay is not None and stay.bucket == req.bucket:
                return stay
            return Router._move(self, req, req.bucket, 0, "stay")  # type: ignore[arg-type]
        # `_priced_overflow`, inline: the context outgrew the bucket; move to the likeliest bucket if that pays for
        # carrying the whole context (`best` is its first likeliest bucket, `mean` its `_mean_length`)
        if best > req.bucket and top >= walk.price * ctx / mean:
            return self._move(req, best, carried, "overflow")
        stay = req.stay
        if stay is not None and stay.bucket == req.bucket:
            return stay
        return Router._move(self, req, req.bucket, 0, "stay")  # type: ignore[arg-type]

    def _root_ups(self, walk: Walk, root: Node) -> None:
        """The positions of the bucket limits in the agnostic root's window for the request's anchor (the keys of
        `_root_probs` and `_bucket_probs` at the root) and the request's mean trajectory length (`_mean_length`),
        kept on the walk with the window they were found in: a step end's refresh sorts the root's window in place
        (and then its total grew) or replaces it (and with it the root's mean). Requests with the same prompt length
        share them (a router-wide table for the current window; never modified)."""
        r_ordered = root.ordered
        total = root.total
        table = self._ups_table
        if self._ups_of is not r_ordered or self._ups_total != total:
            table = self._ups_table = {}
            self._ups_of, self._ups_total = r_ordered, total
        anchor = walk.root_ctx
        found = table.get(anchor)
        if found is None:
            ups = [bisect_right(r_ordered, floor(x - anchor)) for x in self._finite_limits]
            found = table[anchor] = (ups, max(1.0, root.mean + anchor))
        walk.ups, walk.mean = found
        walk.ups_of, walk.ups_total = r_ordered, total

    def _priced_overflow(self, req: Request, probs: list[float] | None, carried: int | None = None) -> tuple[int, str]:
        """Context beyond the bucket's limit: with no statistics, promote to the bucket of the context (a cold
        tree); else move to the likeliest bucket if that pays for carrying the whole context. Never a second move.
        `carried`: what a move here carries (at a tool return the context before the return, which is prefilled at
        the destination either way; default the whole context), booked against the cold budget."""
        if not self.overflow or req.migrations or req.context <= self.limits[req.bucket]:
            return req.bucket, "stay"
        if probs is None:
            cold = self.cold != "promote" and not self.tree.agnostic.count
            if cold and (self.cold == "stay" or not self._cold_affords(req.context if carried is None else carried)):
                return req.bucket, "stay"
            return self.bucket_for(req.context), "overflow"
        best = max(range(len(probs)), key=probs.__getitem__)
        if best > req.bucket and probs[best] >= req.state.price * req.context / self._mean_length(req):
            return best, "overflow"
        return req.bucket, "stay"

    def _cold_affords(self, carried: int) -> bool:
        """`cold="budget"`: whether a move carrying `carried` keeps this step's moves within the budget of the tokens
        seen so far in it (with `repay`, within the ceiling: the run's target pays the excess back in later steps);
        if so, the move is booked."""
        seen = self._cold_finished + self._context_in_flight
        share = self.ceiling if self.repay is not None and self.ceiling is not None else self.budget
        if self._cold_carried + carried > share * seen:  # type: ignore[operator]
            return False
        self._cold_carried += carried
        return True

    def _mean_length(self, req: Request) -> float:
        """Mean trajectory length, the unit migrated tokens are priced in: the prompt-agnostic root's mean
        remaining tokens at admission plus this request's prompt."""
        return max(1.0, self.tree.agnostic.mean + req.prompt_tokens)
