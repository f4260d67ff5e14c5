"""The `probability` rule of C-MLFQ after a tool return (the `accuracy` and `budget` presets), as a mixin of
`CMLFQRouter`: the router's own `on_tool_return` when the rule reads the node's shares alone (no shrinkage blend, no
beyond-root fallback), with `Router.on_tool_return`'s checks and books, the walk, `_select`, `_bucket_probs`,
`_likeliest`, `_predict` (`Node.beyond`) and `_overflow` written out (issue 16: every preset under 5 us a call). The
same arithmetic in the same order, so the same decisions (test_golden.py, test_published_path.py). When the
request's bucket holds more than half of the shares it is the likeliest (the shares sum to at most 1), so the rule
does not move it: only that bucket's share is found. The `scaled` fallback, and `_inline=False` (the reference), take
the general path (`CMLFQRouter._tool_return`). The attributes read here are set by `CMLFQRouter.__init__`.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from typing import TYPE_CHECKING, Any

from libra.scheduling.router import Request, RouteDecision, Router

if TYPE_CHECKING:
    from libra.scheduling.tree import PrefixTree
    from libra.scheduling.walk import Walk

# more than half of the shares: the likeliest bucket (the margin covers the rounding of the shares, ~1e-15)
_MAJORITY = 0.5 + 1e-9


class ProbabilityRule:
    """`CMLFQRouter`'s `on_tool_return` for the `probability` rule on the node's shares alone (module docstring)."""

    # set by CMLFQRouter.__init__ (cmlfq.py) and Router.__init__ (router.py)
    tree: PrefixTree
    limits: tuple[float, ...]
    min_count: int
    fallback: str
    overflow: bool
    cost_ratio: float
    confidence: float
    _floor_limits: tuple[int, ...]
    _inline: bool
    _context_in_flight: int
    _requests: dict[Any, Request]

    if TYPE_CHECKING:

        def _book_tool_return(
            self, request_id: Any, tool: str, tool_tokens: int, status: str, context_tokens: int
        ) -> Request: ...

        def _move(self, req: Request, target: int, carried: int, reason: str) -> RouteDecision: ...

        def _tool_return(self, req: Request, tool: str, tool_tokens: int, status: str) -> tuple[int, str]: ...

        def bucket_for(self, length: float) -> int: ...

    def _probability_call(
        self, request_id: Any, *, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> RouteDecision:
        """`on_tool_return` with the `probability` rule (module docstring; cmlfq.py has the rule)."""
        req = self._book_tool_return(request_id, tool, tool_tokens, status, context_tokens)
        ctx = context_tokens
        carried = ctx - tool_tokens
        if not self._inline or self.fallback == "scaled":  # the general path (the reference)
            target, reason = self._tool_return(req, tool, tool_tokens, status)
            return self._move(req, target, carried, reason)
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
        # `_select`, inline (no `scaled` fallback here, so no scale)
        if node is not None:
            anchor = ctx
        else:
            p_node = walk.p_node
            a_node = walk.a_node
            if walk.a_exact and self.fallback == "agnostic" and a_node.count >= m:
                node, anchor = a_node, walk.a_ctx
            elif p_node is not None and p_node.count >= m:
                node, anchor = p_node, walk.p_ctx
            elif a_node.count >= m:
                node, anchor = a_node, walk.a_ctx
        bucket = req.bucket
        if node is not None:
            ordered = node.ordered
            n = len(ordered)
            i = bisect_right(ordered, ctx - anchor - 1)  # ended before the current context
            if i < n:
                # `_bucket_probs(node, anchor, 1.0, ctx)` and `_likeliest`, inline
                below = i / n
                alive = 1.0 - below
                limits = self._floor_limits
                lo = i  # the majority exit: the request's bucket's share alone (the positions grow with the limits)
                if bucket:
                    j = bisect_right(ordered, limits[bucket - 1] - anchor)
                    if j > lo:
                        lo = j
                if bucket < len(limits):
                    j = bisect_right(ordered, limits[bucket] - anchor)
                    x = (j / n - lo / n) / alive if j > lo else 0.0
                else:  # the unbounded last bucket
                    x = (1.0 - lo / n) / alive if lo < n else 0.0
                if x <= _MAJORITY:
                    probs = []
                    for limit in limits:
                        j = bisect_right(ordered, limit - anchor)
                        if j > i:
                            upto = j / n
                            probs.append((upto - below) / alive)
                            below, i = upto, j
                        else:
                            probs.append(0.0)
                    if len(probs) < len(self.limits):  # the unbounded last bucket takes the rest
                        probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
                    top = max(probs)
                    best = probs.index(top)
                    if best != bucket and top >= self.confidence:
                        mean = self._beyond_mean(node, anchor, ctx)
                        if mean is not None and mean - ctx >= self.cost_ratio * carried:
                            return self._move(req, best, carried, "tool-return")
            elif not n:  # (an empty window: `_bucket_probs`'s old answer, all on the unbounded last bucket)
                last = len(self.limits) - 1
                if self.limits[-1] == float("inf") and last != bucket:  # (a share of 1 is sure enough)
                    mean = self._beyond_mean(node, anchor, ctx)
                    if mean is not None and mean - ctx >= self.cost_ratio * carried:
                        return self._move(req, last, carried, "tool-return")
        if not self.overflow or ctx <= self.limits[bucket]:  # (`_overflow`'s first test, inline)
            stay = req.stay
            if stay is not None and stay.bucket == bucket:
                return stay
            return Router._move(self, req, bucket, 0, "stay")  # type: ignore[arg-type]
        # `_overflow`, inline, with `_predict`'s mean
        mean = None if node is None else self._beyond_mean(node, anchor, ctx)
        target = self.bucket_for(ctx)
        if mean is not None:
            target = max(target, self.bucket_for(mean))
            if mean - ctx < self.cost_ratio * carried:
                return self._move(req, bucket, carried, "stay")
        return self._move(req, target, carried, "overflow")

    @staticmethod
    def _beyond_mean(node: Any, anchor: int, ctx: int) -> float | None:
        """`_predict`'s mean (unscaled): `anchor` plus the mean remaining tokens of the node's trajectories that ran
        longer than the request has (`Node.beyond(ctx - anchor - 1)`), None when none did."""
        ordered = node.ordered
        n = len(ordered)
        i = bisect_right(ordered, ctx - anchor - 1)
        k = n - i
        if k <= 0:
            return None
        prefix = node.prefix
        if prefix is None:  # (as of the last refresh: made once, on first need)
            prefix = node.prefix = list(itertools.accumulate(ordered, initial=0))
        return anchor + (prefix[n] - prefix[i]) / k
