"""C-MLFQ: causality-driven multi-level feedback queue (PAPER.md, mechanism 3).

A request starts in the smallest bucket (`admit="smallest"`, the published rule) or, as an option, straight in a
larger one when the root statistics of its prompt (or of the prompt-agnostic tree, for an unseen prompt) put both
the mean and the P90 of its final length there (`admit="predicted"`).

After each tool return the router steps down the prefix tree by the return's state and predicts the final length
as `context + remaining` with the node's mean and P90. It moves the request only when the bucket of the mean and
the bucket of the P90 agree and differ from the current one, and only when the move pays: the predicted remaining
tokens must be at least `cost_ratio` times the tokens the move carries (the context already in KV cache, which the
destination re-prefills or receives). A node seen fewer than `min_count` times counts as unseen: the request falls
back to the nearest ancestor in the prompt's tree (`fallback="parent"`) or first to the same path in the
prompt-agnostic tree (`fallback="agnostic"`); a prompt never seen uses the prompt-agnostic tree. From an ancestor
the prediction is the ancestor's context plus its remaining tokens, never less than the current context.

When the context outgrows the current bucket's range (`on_progress` or a large tool return) the request is
promoted to the bucket of its context, or further if the prediction's mean points there ("overflow").

The tree learns only in `end_step`, from trajectories finished by then: routing never reads the future.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from libra.scheduling.router import Request, Router, register_router
from libra.scheduling.states import DEFAULT_SIZE_EDGES
from libra.scheduling.tree import Node, PrefixTree
from libra.spec import Bucket, SpecError
from libra.workloads.trace import Trajectory


class _Walk:
    """Where a request stands in the prompt tree and the agnostic tree: the deepest node reached on its path and
    the context when it got there; `exact` turns False once its path leaves the tree."""

    __slots__ = ("p_node", "p_ctx", "p_exact", "a_node", "a_ctx", "a_exact")

    def __init__(self, p_node: Node | None, a_node: Node, ctx: int) -> None:
        self.p_node, self.p_ctx, self.p_exact = p_node, ctx, p_node is not None
        self.a_node, self.a_ctx, self.a_exact = a_node, ctx, True


@register_router
class CMLFQRouter(Router):
    """The C-MLFQ router; see the module docstring. `tree` may be given (e.g. loaded or merged from other ranks);
    otherwise one is built from `window`, `max_nodes`, `max_depth`, `size_edges`, `tools`."""

    name = "cmlfq"

    def __init__(self, buckets: Sequence[Bucket], *, tree: PrefixTree | None = None, admit: str = "smallest",
                 fallback: str = "parent", min_count: int = 2, cost_ratio: float = 0.1, window: int = 200,
                 max_nodes: int = 200_000, max_depth: int = 32, size_edges: Sequence[int] = DEFAULT_SIZE_EDGES,
                 tools: Iterable[str] | None = None) -> None:
        super().__init__(buckets)
        if admit not in ("smallest", "predicted"):
            raise SpecError(f"cmlfq: admit must be 'smallest' or 'predicted', got {admit!r}")
        if fallback not in ("parent", "agnostic"):
            raise SpecError(f"cmlfq: fallback must be 'parent' or 'agnostic', got {fallback!r}")
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise SpecError(f"cmlfq: min_count must be an integer >= 1, got {min_count!r}")
        if not cost_ratio >= 0:
            raise SpecError(f"cmlfq: cost_ratio must be >= 0, got {cost_ratio!r}")
        self.tree = tree if tree is not None else PrefixTree(window=window, max_nodes=max_nodes, max_depth=max_depth,
                                                             size_edges=size_edges, tools=tools)
        self.admit_mode = admit
        self.fallback = fallback
        self.min_count = min_count
        self.cost_ratio = float(cost_ratio)

    def _admit(self, req: Request) -> int:
        root = self.tree.prompts.get(req.prompt_id)
        req.state = _Walk(root, self.tree.agnostic, req.prompt_tokens)
        if self.admit_mode == "smallest":
            return 0
        node = root if root is not None and root.count >= self.min_count else self.tree.agnostic
        if node.count < self.min_count:
            return 0
        lo = self.bucket_for(req.prompt_tokens + node.mean)
        return lo if lo == self.bucket_for(req.prompt_tokens + node.p90) else 0

    def _tool_return(self, req: Request, tool: str, tool_tokens: int, status: str) -> tuple[int, str]:
        code = self.tree.codec.encode(tool, tool_tokens, status)
        walk: _Walk = req.state
        ctx = req.context
        m = self.min_count
        if walk.p_exact:
            child = walk.p_node.children.get(code)  # type: ignore[union-attr]
            if child is None or child.count < m:
                walk.p_exact = False
            else:
                walk.p_node, walk.p_ctx = child, ctx
        if walk.a_exact:
            child = walk.a_node.children.get(code)
            if child is None or child.count < m:
                walk.a_exact = False
            else:
                walk.a_node, walk.a_ctx = child, ctx
        node, anchor = self._pick(walk)
        if node is None:
            return self._overflow(req, None)
        mean = max(ctx, anchor + node.mean)
        b_mean = self.bucket_for(mean)
        if b_mean != req.bucket and b_mean == self.bucket_for(max(ctx, anchor + node.p90)):
            carried = ctx - tool_tokens
            if mean - ctx >= self.cost_ratio * carried:
                return b_mean, "tool-return"
        return self._overflow(req, mean)

    def _pick(self, walk: _Walk) -> tuple[Node | None, int]:
        """The node whose statistics stand for the request now, and the context at that node."""
        m = self.min_count
        p_ok = walk.p_node is not None and walk.p_node.count >= m
        if p_ok and walk.p_exact:
            return walk.p_node, walk.p_ctx
        a_ok = walk.a_node.count >= m
        if self.fallback == "agnostic" and a_ok and walk.a_exact:
            return walk.a_node, walk.a_ctx
        if p_ok:
            return walk.p_node, walk.p_ctx
        if a_ok:
            return walk.a_node, walk.a_ctx
        return None, 0

    def _overflow(self, req: Request, predicted_mean: float | None) -> tuple[int, str]:
        if req.context <= self.limits[req.bucket]:
            return req.bucket, "stay"
        target = self.bucket_for(req.context)
        if predicted_mean is not None:
            target = max(target, self.bucket_for(predicted_mean))
        return target, "overflow"

    def _progress(self, req: Request) -> tuple[int, str]:
        if req.context <= self.limits[req.bucket]:
            return req.bucket, "stay"
        node, anchor = self._pick(req.state)
        return self._overflow(req, None if node is None else max(req.context, anchor + node.mean))

    def _learn(self, finished: list[Trajectory]) -> None:
        self.tree.update(finished)
