"""The published rule of C-MLFQ after a tool return (`rule="mean-p90"`), as a mixin of `CMLFQRouter`: the router's own
`on_tool_return`, with `Router.on_tool_return`'s checks and books, the walk, `_select`, `_predict` (`Node.beyond`),
`_decide` and `_overflow` written out (issue 16: every preset under 5 us a call). The same arithmetic in the same
order, so the same decisions (test_golden.py, test_published_path.py). The prediction's mean decides first: a
request stays when the predicted remaining tokens do not pay for the move (neither a move by the rule nor one on an
overflow, whose cost test is the same), before the P90 and the buckets are looked at. The `scaled` fallback, and
`_inline=False` (the reference), take the general path (`CMLFQRouter._tool_return`). The attributes read here are
set by `CMLFQRouter.__init__`.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from math import ceil
from typing import TYPE_CHECKING, Any

from libra.scheduling.router import Request, RouteDecision, Router

if TYPE_CHECKING:
    from libra.scheduling.tree import PrefixTree
    from libra.scheduling.walk import Walk


class MeanP90Rule:
    """`CMLFQRouter`'s `on_tool_return` when the rule is `mean-p90` (module docstring)."""

    # set by CMLFQRouter.__init__ (cmlfq.py) and Router.__init__ (router.py)
    tree: PrefixTree
    limits: tuple[float, ...]
    min_count: int
    fallback: str
    overflow: bool
    cost_ratio: float
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

    def _published_call(
        self, request_id: Any, *, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> RouteDecision:
        """`on_tool_return` with the published rule (module docstring; cmlfq.py has the rule)."""
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
        mean = None  # the predicted final length (`_predict`'s mean), None without a prediction
        if node is not None:
            # `Node.beyond(ctx - anchor - 1)`, inline: the window's trajectories that ran longer than the request has
            ordered = node.ordered
            n = len(ordered)
            i = bisect_right(ordered, ctx - anchor - 1)
            k = n - i
            if k > 0:
                prefix = node.prefix
                if prefix is None:  # (as of the last refresh: made once, on first need)
                    prefix = node.prefix = list(itertools.accumulate(ordered, initial=0))
                mean = anchor + (prefix[n] - prefix[i]) / k
                bucket = req.bucket
                # `_decide` and the cost test of `_tool_return`: a move to the bucket of the mean when the P90's
                # agrees and the predicted remaining tokens pay for the carried context
                if mean - ctx >= self.cost_ratio * carried:
                    target = self.bucket_for(mean)
                    if target != bucket and target == self.bucket_for(anchor + float(ordered[i + ceil(0.9 * k) - 1])):
                        return self._move(req, target, carried, "tool-return")
                else:  # no move, and `_overflow` stays too (its cost test is the same)
                    stay = req.stay
                    if stay is not None and stay.bucket == bucket:
                        return stay
                    return Router._move(self, req, bucket, 0, "stay")  # type: ignore[arg-type]
        # `_overflow`, inline
        bucket = req.bucket
        if not self.overflow or ctx <= self.limits[bucket]:
            stay = req.stay
            if stay is not None and stay.bucket == bucket:
                return stay
            return Router._move(self, req, bucket, 0, "stay")  # type: ignore[arg-type]
        target = self.bucket_for(ctx)
        if mean is not None:
            target = max(target, self.bucket_for(mean))
            if mean - ctx < self.cost_ratio * carried:
                return self._move(req, bucket, carried, "stay")
        return self._move(req, target, carried, "overflow")
