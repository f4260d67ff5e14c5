"""Where a C-MLFQ request stands: its walk down the prompt tree and the prompt-agnostic tree, and what the priced
rule keeps per request (cmlfq.py, priced.py)."""

from __future__ import annotations

from libra.scheduling.tree import Node


class Walk:
    """Where a request stands in the prompt tree and the agnostic tree: the deepest node reached on its path and
    the context when it got there; `exact` turns False once its path leaves the tree."""

    __slots__ = (
        "p_root",
        "p_node",
        "p_ctx",
        "p_exact",
        "a_node",
        "a_ctx",
        "a_exact",
        "root_ctx",
        "warm",
        "admitted",
        "points",
        "price",
        "calib",
        "guesses",
        "ups",
        "ups_of",
        "ups_total",
        "mean",
    )

    def __init__(self, p_node: Node | None, a_node: Node, ctx: int) -> None:
        self.p_root = p_node
        self.p_node, self.p_ctx, self.p_exact = p_node, ctx, p_node is not None
        self.a_node, self.a_ctx, self.a_exact = a_node, ctx, True
        self.root_ctx = ctx  # the context at admission, the anchor of the agnostic root's statistics
        self.warm = a_node.count > 0  # the tree had learnt something when the request arrived
        self.admitted = 0  # its bucket at admission
        self.points: list[tuple[float, float, int] | None] | None = None  # decision points, for the budget (budget.py)
        self.price = 0.0  # the price of a carried token for this request (the router's, or the budget's mix)
        # `shrink="auto"` records (shrinkage.py): (node shares, population shares, survivors); `_priced_call` leaves the
        # population shares for `_resolved_calib` (the context in their place)
        self.calib: list[tuple[list[float], list[float] | int, float]] = []
        self.guesses: tuple[int, ...] | None = None  # `admit_select` guesses of the admission experts (experts.py)
        # the agnostic root's window positions of the bucket limits for this request's anchor (`_priced_call`), the
        # request's mean trajectory length, and the root window (list, total) they were found in
        self.ups: list[int] | None = None
        self.ups_of: list[int] | None = None
        self.ups_total = 0
        self.mean = 1.0  # the request's mean trajectory length (`_mean_length`) as of that root window
