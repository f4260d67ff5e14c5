"""C-MLFQ: causality-driven multi-level feedback queue (docs/paper.md, mechanism 3).

Admission: a request starts in the smallest bucket (`admit="smallest"`, the published rule) or, as an option, in
the bucket the decision rule picks from the root statistics of its prompt (the prompt-agnostic root for an unseen
prompt) when the rule is sure (`admit="predicted"`; with `rule="priced"`, the likeliest bucket when it is at least
`admit_margin` likelier than the smallest). With `admit_select`, that guess is one of three (the tree's, the
predictor baseline's, the population's most common bucket) and the router admits on the one that named the final
bucket of the last steps' requests most often (experts.py); `recent_expert=K` (K > 0) adds a fourth, the most common
final bucket of the last K steps' requests, admitted on only when it beats the best of the three in a paired test.

After each tool return the router steps down the prefix tree by the return's state. The node's window predicts
the final length as `anchor + remaining`, where `anchor` is the context when the request reached the node, over
the window's trajectories that ran at least as long as the request has (conditioning on survival). Decision
rules: `mean-p90` (published) moves only when the buckets of the predicted mean and P90 agree; `median` moves to
the bucket of the predicted P50; `probability` moves to the likeliest bucket when it is at least `confidence`
likely. Any move must pay: the predicted remaining tokens must be at least `cost_ratio` times the tokens the move
carries (the context already in KV cache, which the destination re-prefills or receives).

`priced` (its tool-return path in priced.py) weighs single-shot accuracy against migrated tokens directly. With
bucket probabilities `P` (as for `probability`), `T` the mean trajectory length (the prompt-agnostic root) and
`price` the accuracy one may give up per `T` tokens carried, a request moves to its likeliest bucket `b` at a tool
return only when
- the gain pays for the move: `P(b) - P(current) >= price * carried / T`, and
- it is sure enough, or waiting is dear: `P(b) >= confidence - price * tool_tokens / T`. A later move would carry
  the return just received, so after a large return the router acts on less certainty; after a small one it waits
  for the next return, which tells more for little extra carried context.
A request moves at most once: a second move can no longer make it single-shot right. Its context outgrowing the
bucket (overflow) is priced the same way (gain `P(b)`, as the current bucket is now surely wrong, against the whole
context); with no statistics at all (a cold tree) it is promoted to the bucket of its context, as classic MLFQ
would. As in the published rule, a bucket's limit is a routing target, not a hard cap: a request the price does not
move finishes where it is, counted wrong.

Nodes seen fewer than `min_count` times count as unseen. Fallback (`fallback`): `parent` uses the nearest seen
ancestor in the prompt's tree, then the agnostic tree; `agnostic` prefers the same path in the prompt-agnostic
tree over the prompt's ancestor; `scaled` uses that agnostic node with its remaining tokens scaled by how long
this prompt runs relative to all prompts. A prompt never seen uses the prompt-agnostic tree.

With the other rules, when the context outgrows the current bucket's range (`on_progress` or a large tool return)
the request is promoted to the bucket of its context, or further if the predicted mean points there ("overflow"),
under the same cost test. `overflow=False` never chases an overflow (any rule).

The tree learns only in `end_step`, from trajectories finished by then: routing never reads the future.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from math import floor
from typing import Any

from libra.scheduling.budget import MigrationBudget
from libra.scheduling.experts import AdmitExperts
from libra.scheduling.presets import CMLFQ_PRESETS, DEFAULT_PRESET, RULES
from libra.scheduling.priced import PricedRule
from libra.scheduling.probability import ProbabilityRule
from libra.scheduling.published import MeanP90Rule
from libra.scheduling.router import Request, RouteDecision, Router, register_router
from libra.scheduling.shrinkage import ShrinkFit
from libra.scheduling.states import DEFAULT_SIZE_EDGES
from libra.scheduling.tree import Node, PrefixTree
from libra.scheduling.walk import Walk
from libra.spec import Bucket, SpecError, checks
from libra.workloads.trace import Trajectory

_OWNER = "cmlfq"
_FLAGS = ("overflow", "budget_mix", "admit_select", "hold_first")


def _check_numbers(options: dict[str, Any]) -> None:
    """SpecError naming the first number or flag of the wrong type or out of range, before anything is built: a
    bool or a string for a number (`True` would pass as 1), NaN, a non-integer count, or anything but True/False for
    a flag (`"false"` would pass as true). `price`, `cost_ratio` and `shrink` may be inf (nothing ever pays)."""
    o = options
    checks.number(_OWNER, "ceiling", o["ceiling"], 0.0, 1.0, above=True, none=True)
    checks.whole(_OWNER, "repay", o["repay"], 1, none=True)
    checks.number(_OWNER, "confidence", o["confidence"], 0.0, 1.0, above=True)
    checks.limit(_OWNER, "price", o["price"], 0.0, above=False)
    checks.fraction(_OWNER, "admit_margin", o["admit_margin"])
    checks.limit(_OWNER, "cost_ratio", o["cost_ratio"], 0.0, above=False)
    checks.whole(_OWNER, "min_count", o["min_count"], 1)
    checks.whole(_OWNER, "admit_min_count", o["admit_min_count"], 1, none=True)
    checks.whole(_OWNER, "recent_expert", o["recent_expert"], 0)
    checks.number(_OWNER, "budget", o["budget"], 0.0, 1.0, above=True, below=True, none=True)
    shrink = o["shrink"]
    if not (shrink == "auto" if isinstance(shrink, str) else checks.as_float(shrink) >= 0):  # (NaN fails)
        checks.fail(_OWNER, "shrink", "a number >= 0 or 'auto'", shrink)
    if not checks.is_whole(o["seed"]):
        checks.fail(_OWNER, "seed", "an integer", o["seed"])
    for name in _FLAGS:
        checks.flag(_OWNER, name, o[name])


def _choice(name: str, value: object, known: tuple[str, ...]) -> None:
    if value not in known:
        checks.fail(_OWNER, name, "one of " + ", ".join(map(repr, known)), value)


@register_router
class CMLFQRouter(PricedRule, MeanP90Rule, ProbabilityRule, Router):
    """The C-MLFQ router; see the module docstring. `tree` may be given (e.g. loaded or merged from other ranks),
    and then its own window, size-class edges and tool set apply; otherwise one is built from `window`,
    `max_nodes`, `max_depth`, `size_edges`, `tools`."""

    name = "cmlfq"

    def __init__(
        self,
        buckets: Sequence[Bucket],
        *,
        tree: PrefixTree | None = None,
        admit: str = "smallest",
        rule: str = "mean-p90",
        confidence: float = 0.5,
        fallback: str = "parent",
        min_count: int = 2,
        cost_ratio: float = 0.5,
        price: float = 0.7,
        admit_margin: float = 0.0,
        overflow: bool = True,
        window: int = 200,
        max_nodes: int = 200_000,
        max_depth: int = 32,
        size_edges: Sequence[int] | str = DEFAULT_SIZE_EDGES,
        tools: Iterable[str] | None = None,
        budget: float | None = None,
        beyond: str = "promote",
        cold: str = "promote",
        admit_min_count: int | None = None,
        shrink: float | str = 0.0,
        budget_mix: bool = False,
        admit_select: bool = False,
        ceiling: float | None = None,
        repay: int | None = None,
        hold_first: bool = False,
        recent_expert: int = 0,
        seed: int = 0,
    ) -> None:
        _check_numbers(locals())
        super().__init__(buckets)
        # `ceiling`: every move of the run together carries at most this share of the tokens seen so far (so never
        # more than it of the run's tokens), whatever the budget's price does when the workload drifts; a move past
        # it is declined (the request stays, as if the price had said no)
        self.ceiling = None if ceiling is None else float(ceiling)
        self._carried_total = 0
        self._finished_total = 0
        # `repay`: the budget targets the run's migrated-token share, not each step's: at a step end the next step's
        # target is the budget plus the run's shortfall (budget x tokens finished so far - tokens carried so far)
        # spread over `repay` steps of the last step's size, within [0, ceiling]; early under-spending is spent
        # later, over-spending (the cold step may then carry up to the ceiling) is paid back
        self.repay = None if repay is None else int(repay)
        self._step_start_total = 0
        # `hold_first`: the first warm step's records (every request routed on a tree learnt from the cold step
        # alone) neither set the price nor stay in the budget's window: the next step keeps the initial price
        self.hold_first = bool(hold_first)
        self._held = False
        # `admit_select`: admit on the evidence (tree, prompt history, population) that would have named
        # the final bucket of the last steps' requests most often (experts.py); it acts where the priced rule admits
        # (rule="priced", admit="predicted") and is inert otherwise, as the budget options are for the other rules
        use = admit_select and rule == "priced" and admit == "predicted"
        # `recent_expert` K > 0: a fourth admission expert, the most common final bucket of the last K steps'
        # requests, admitted on only when it beats the best other expert by more than chance (experts.py)
        self._experts = AdmitExperts(recent=recent_expert) if use else None
        # `budget_mix`: requests draw the budget's lower price with probability q (budget.py, choose_mix), from a
        # generator seeded by `seed` (a replay is reproducible)
        self.budget_mix = bool(budget_mix)
        self._mix_price = float(price)
        self._mix_q = 0.0
        self._rng = random.Random(int(seed))
        if shrink == "auto":
            self._fit: ShrinkFit | None = ShrinkFit()
            shrink = 0.0
        else:
            self._fit = None
        self.shrink = float(shrink)
        self._blend: tuple[list[float], list[float], float] | None = None  # the last blend's parts, for the fit
        self._survivors = 0.0  # survivors in the window of the last `_bucket_probs` call
        _choice("cold", cold, ("promote", "stay", "budget"))
        if cold == "budget" and budget is None:
            raise SpecError("cmlfq: cold='budget' needs a budget")
        self.cold = cold
        # `cold="budget"`: with nothing learnt, overflows are promoted while the moves of this step carry at most
        # `budget` of the tokens seen in it (those of the finished requests and the contexts of those in flight)
        self._cold_carried = 0
        self._cold_finished = 0
        self.admit_min_count = None if admit_min_count is None else int(admit_min_count)
        _choice("beyond", beyond, ("promote", "root"))
        self._finite_limits = tuple(x for x in self.limits if x != float("inf"))
        self._floor_limits = tuple(floor(x) for x in self._finite_limits)
        self.budget = None if budget is None else float(budget)
        self.beyond = beyond
        self._budget = None if budget is None else MigrationBudget(budget)
        _choice("rule", rule, tuple(RULES))
        self.price = float(price)
        self.admit_margin = float(admit_margin)
        self.rule = rule
        if rule == "priced":  # its own `on_tool_return`: the books, the walk and the rule inline (priced.py), in C
            self.on_tool_return = self._priced_native  # type: ignore[method-assign]
        elif rule == "mean-p90":  # the same for the published rule (published.py)
            self.on_tool_return = self._published_call  # type: ignore[method-assign]
        elif rule == "probability" and self._fit is None and not self.shrink and beyond == "promote":
            # ... and for the `probability` rule on the node's shares alone (probability.py)
            self.on_tool_return = self._probability_call  # type: ignore[method-assign]
        # False: `_priced_call` finds the bucket shares by the general `_probabilities` and `_published_call` takes
        # `_tool_return` (the references their inline computations are tested against, test_fast_paths.py,
        # test_priced_exits.py)
        self._inline = True
        # `_root_ups`: per prompt length, the limits' positions in the agnostic root's window and the mean length
        self._ups_table: dict[int, tuple[list[int], float]] = {}
        self._ups_of: list[int] | None = None
        self._ups_total = -1
        self.overflow = bool(overflow)
        self.confidence = float(confidence)
        _choice("admit", admit, ("smallest", "predicted"))
        _choice("fallback", fallback, ("parent", "agnostic", "scaled"))
        self.tree = (
            tree
            if tree is not None
            else PrefixTree(window=window, max_nodes=max_nodes, max_depth=max_depth, size_edges=size_edges, tools=tools)
        )
        self.admit_mode = admit
        self.fallback = fallback
        self.min_count = int(min_count)
        self.cost_ratio = float(cost_ratio)

    @classmethod
    def create(cls, buckets: Sequence[Bucket], *, preset: str = DEFAULT_PRESET, **options: Any) -> CMLFQRouter:
        """The options of `preset` (CMLFQ_PRESETS; default the adaptive one), overridden by `options`. Note that
        the constructor's own defaults are the published rule (`preset="published"`)."""
        if preset not in CMLFQ_PRESETS:
            raise SpecError(f"cmlfq: unknown preset {preset!r}; expected one of {', '.join(CMLFQ_PRESETS)}")
        return cls(buckets, **{**CMLFQ_PRESETS[preset], **options})

    def _admit(self, req: Request) -> int:
        bucket = self._admit_bucket(req)
        walk: Walk = req.state
        walk.admitted = bucket
        walk.price = self.price
        if self._mix_q > 0.0 and self._rng.random() < self._mix_q:
            walk.price = self._mix_price
        if self._budget is not None and walk.warm:
            walk.points = []
        if walk.warm and self.rule == "priced":
            # the limits' positions in the root's window for this prompt length and the request's mean length, read
            # by `_priced_call` at every tool return (found again there if the root's window changes first)
            self._root_ups(walk, self.tree.agnostic)
        return bucket

    def _admit_bucket(self, req: Request) -> int:
        root = self.tree.prompts.get(req.prompt_id)
        walk = req.state = Walk(root, self.tree.agnostic, req.prompt_tokens)
        if self.admit_mode == "smallest":
            return 0
        if self.rule == "priced":  # admission carries nothing: the likeliest bucket, if clearly likelier
            probs = self._probabilities(walk, req.prompt_tokens, self.admit_min_count)
            if probs is None:
                tree = 0
            else:
                best = max(range(len(probs)), key=probs.__getitem__)
                tree = best if probs[best] - probs[0] >= self.admit_margin else 0
            if self._experts is None:
                return tree
            guesses: tuple[int, ...] = (tree, *self._admit_guesses(walk, req.prompt_tokens))
            walk.guesses = guesses
            if self._experts.recent:  # (before any request finished: the population's guess)
                recent = self._experts.recent_guess
                walk.guesses = guesses = (*guesses, guesses[2] if recent is None else recent)
            return guesses[self._experts.chosen]
        target, act = self._decide(walk, req.prompt_tokens, 0, self._predict(walk, req.prompt_tokens))
        return target if act else 0

    def _admit_guesses(self, walk: Walk, prompt_tokens: int) -> tuple[int, int]:
        """The admission guesses of the `prompt` and `population` experts (experts.py)."""
        root = self.tree.agnostic
        pop_probs = self._bucket_probs(root, prompt_tokens, 1.0, prompt_tokens) if root.count else None
        pop = 0 if pop_probs is None else max(range(len(pop_probs)), key=pop_probs.__getitem__)
        node = walk.p_root
        own = self._bucket_probs(node, prompt_tokens, 1.0, prompt_tokens) if node is not None and node.count else None
        if own is not None:
            return max(range(len(own)), key=own.__getitem__), pop
        by_length = self._experts.lengths.guess(prompt_tokens)  # type: ignore[union-attr]
        return (pop if by_length is None else by_length), pop

    def _tool_return(self, req: Request, tool: str, tool_tokens: int, status: str) -> tuple[int, str]:
        code = self.tree.codec.encode(tool, tool_tokens, status)
        walk: Walk = req.state
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
        if self.rule == "priced":  # (not reached: `__init__` makes `_priced_native` this rule's `on_tool_return`)
            raise RuntimeError("a priced C-MLFQ router routes tool returns in its own on_tool_return (_priced_native)")
        carried = ctx - tool_tokens
        if self.rule == "probability":  # the rule reads no prediction: one is made only where the cost test needs it
            target, act = self._likeliest(walk, ctx, req.bucket)
            if act and target != req.bucket:
                pred = self._predict(walk, ctx)
                if pred is not None and pred[0] - ctx >= self.cost_ratio * carried:
                    return target, "tool-return"
            if not self.overflow or ctx <= self.limits[req.bucket]:  # (`_overflow`'s first test, inline)
                return req.bucket, "stay"
            pred = self._predict(walk, ctx)
        else:
            pred = self._predict(walk, ctx)
            target, act = self._decide(walk, ctx, req.bucket, pred)
            if act and target != req.bucket and pred is not None and pred[0] - ctx >= self.cost_ratio * carried:
                return target, "tool-return"
        return self._overflow(req, None if pred is None else pred[0], carried)

    def _decide(self, walk: Walk, ctx: int, current: int, pred: tuple[float, float, float] | None) -> tuple[int, bool]:
        """The bucket the rule points at for a request with context `ctx`, and whether the rule is sure enough
        to act: mean-p90 (the buckets of the predicted mean and P90 agree), median (the bucket of the predicted
        P50), probability (the likeliest bucket, if at least `confidence` likely)."""
        if self.rule == "probability":
            return self._likeliest(walk, ctx, current)
        if pred is None:
            return current, False
        mean, p50, p90 = pred
        if self.rule == "median":
            return self.bucket_for(p50), True
        target = self.bucket_for(mean)
        return target, target == self.bucket_for(p90)

    def _likeliest(self, walk: Walk, ctx: int, current: int) -> tuple[int, bool]:
        """The bucket the final length most likely falls in, among the window's trajectories that ran at least
        as long as the request has, and whether that is likely enough (>= `confidence`) to act on."""
        probs = self._probabilities(walk, ctx)
        if probs is None:
            return current, False
        best = max(range(len(probs)), key=probs.__getitem__)
        return best, probs[best] >= self.confidence

    def _probabilities(
        self, walk: Walk, ctx: int, min_count: int | None = None, record: bool = False
    ) -> list[float] | None:
        """Per bucket, the share of the selected node's window whose final length falls in it, among the
        trajectories that ran at least as long as the request has; None without a node or a survivor."""
        node, anchor, scale = self._select(walk, min_count)
        if node is None:
            return None
        probs = self._bucket_probs(node, anchor, scale, ctx)
        root = self.tree.agnostic
        self._blend = None
        if probs is not None and (self.shrink or record) and node is not root:
            # a node's few survivors are noisy: blend its shares with the survival statistics of all trajectories,
            # as `shrink` pseudo-observations against the node's survivors (shrinkage.py)
            n = self._survivors
            prior = self._root_probs(root, walk.root_ctx, ctx)
            if prior is not None:
                if record:
                    self._blend = (probs, prior, n)
                if self.shrink:
                    w = n / (n + self.shrink)
                    v = 1.0 - w
                    probs = probs[:]  # (no comprehension: a function call each time before Python 3.12)
                    for i, b in enumerate(prior):
                        probs[i] = w * probs[i] + v * b
        if probs is None and self.beyond == "root" and self.tree.agnostic.count:
            # the request outlived every observation at its node: the survival statistics of all trajectories,
            # else (it outlived them all too) the bucket of its context
            probs = self._bucket_probs(self.tree.agnostic, walk.root_ctx, 1.0, ctx)
            if probs is None:
                probs = [0.0] * len(self.limits)
                probs[self.bucket_for(ctx)] = 1.0
        return probs

    def _bucket_probs(self, node: Node, anchor: int, scale: float, ctx: int) -> list[float] | None:
        ordered = node.ordered  # the window, sorted: shares by bisection (Node.fraction_at_most, inline)
        n = len(ordered)
        if not n:  # (a selected node always holds observations; kept for an empty window's exact old answer)
            probs = [0.0] * len(self.limits)
            if self.limits[-1] == float("inf"):
                probs[-1] = 1.0
            return probs
        # the window holds integers: bisecting by the floor of a float key gives the same position, and an
        # int-to-int comparison costs about half an int-to-float one (issue 16). Unscaled (the common case), the
        # keys are integers to begin with: `ctx - anchor - 1` and `floor(limit) - anchor` (contexts are integers).
        if scale == 1.0:
            i = bisect_right(ordered, ctx - anchor - 1)  # ended before the current context
            if i >= n:
                return None
            below = i / n
            alive = 1.0 - below
            self._survivors = alive * n
            probs = []
            for limit in self._floor_limits:
                j = bisect_right(ordered, limit - anchor)
                if j > i:  # (as `upto > below` on the shares: j / n is increasing in j)
                    upto = j / n
                    probs.append((upto - below) / alive)
                    below, i = upto, j
                else:
                    probs.append(0.0)
        else:
            below = bisect_right(ordered, floor((ctx - anchor) / scale - 1)) / n
            alive = 1.0 - below
            if alive <= 0:
                return None
            self._survivors = alive * n
            probs = []
            for edge in self._finite_limits:
                share = bisect_right(ordered, floor((edge - anchor) / scale)) / n
                probs.append((share - below) / alive if share > below else 0.0)
                if share > below:
                    below = share
        if len(probs) < len(self.limits):  # the unbounded last bucket takes the rest
            probs.append((1.0 - below) / alive if below < 1.0 else 0.0)
        return probs

    def _root_probs(self, root: Node, anchor: int, ctx: int) -> list[float] | None:
        """`_bucket_probs(root, anchor, 1.0, ctx)` (up to rounding) for the prior of the shrinkage, in counts: fewer
        operations on every tool return."""
        ordered = root.ordered
        n = len(ordered)
        if not n:
            return None
        below = bisect_right(ordered, ctx - anchor - 1)
        if below >= n:
            return None
        alive = n - below
        probs = []
        for limit in self._finite_limits:
            upto = bisect_right(ordered, floor(limit - anchor))
            if upto > below:
                probs.append((upto - below) / alive)
                below = upto
            else:
                probs.append(0.0)
        if len(probs) < len(self.limits):
            probs.append((n - below) / alive)
        return probs

    def _select(self, walk: Walk, min_count: int | None = None) -> tuple[Node | None, int, float]:
        """The node whose statistics stand for the request now, the context when the request reached it, and
        the factor its remaining tokens are scaled by (1 except for the `scaled` fallback)."""
        m = self.min_count if min_count is None else min_count
        p_ok = walk.p_node is not None and walk.p_node.count >= m
        a_ok = walk.a_node.count >= m
        if p_ok and walk.p_exact:
            return walk.p_node, walk.p_ctx, 1.0
        root = walk.p_root  # not None when p_ok: a walk reaches a prompt node only from that prompt's root
        if self.fallback == "scaled" and p_ok and a_ok and walk.a_exact and root is not None and root.count >= m:
            # the agnostic node for this path, scaled by how long this prompt runs relative to all prompts
            base = self.tree.agnostic.mean
            return walk.a_node, walk.a_ctx, (root.mean / base if base > 0 else 1.0)
        if self.fallback == "agnostic" and a_ok and walk.a_exact:
            return walk.a_node, walk.a_ctx, 1.0
        if p_ok:
            return walk.p_node, walk.p_ctx, 1.0
        if a_ok:
            return walk.a_node, walk.a_ctx, 1.0
        return None, 0, 1.0

    def _predict(self, walk: Walk, ctx: int) -> tuple[float, float, float] | None:
        """Predicted final length (mean, P50, P90) from the selected node, conditioned on the request having grown
        from the node's context to `ctx`; None when no node has `min_count` observations or none ran that long."""
        node, anchor, scale = self._select(walk)
        if node is None:
            return None
        # (unscaled, the integer `ctx - anchor - 1` is the same key: the window holds integers; see _bucket_probs)
        stats = node.beyond(ctx - anchor - 1 if scale == 1.0 else (ctx - anchor) / scale - 1)
        if stats is None:
            return None
        _, mean, p50, p90 = stats
        return anchor + scale * mean, anchor + scale * p50, anchor + scale * p90

    def _overflow(self, req: Request, predicted_mean: float | None, carried: int | None = None) -> tuple[int, str]:
        if not self.overflow or req.context <= self.limits[req.bucket]:
            return req.bucket, "stay"
        target = self.bucket_for(req.context)
        if predicted_mean is not None:
            target = max(target, self.bucket_for(predicted_mean))
            carried = req.context if carried is None else carried
            if predicted_mean - req.context < self.cost_ratio * carried:
                return req.bucket, "stay"
        return target, "overflow"

    def _progress(self, req: Request) -> tuple[int, str]:
        if req.context <= self.limits[req.bucket]:
            return req.bucket, "stay"
        if self.rule == "priced":
            probs = self._probabilities(req.state, req.context)
            walk: Walk = req.state
            if probs is not None and walk.points is not None and walk.points[-1:] != [None]:
                # one overflow point per stretch between tool returns: later ones only carry more
                a = walk.admitted
                best = max(range(len(probs)), key=probs.__getitem__)
                if self.overflow and best > a and req.context > self.limits[a]:
                    walk.points.append((0.0, probs[best] * self._mean_length(req) / req.context, req.context))
                    walk.points.append(None)
            return self._priced_overflow(req, probs)
        pred = self._predict(req.state, req.context)
        return self._overflow(req, None if pred is None else pred[0])

    # -- the budget: the price of a carried token is set from the observed costs of moving (budget.py) ----------
    def _move(self, req: Request, target: int, carried: int, reason: str) -> RouteDecision:
        if target != req.bucket and self.ceiling is not None:
            # the tokens seen: the finished requests' and the contexts of those in flight (each at most its
            # final length, so the share of the whole run stays within the ceiling too)
            seen = self._finished_total + self._context_in_flight
            if self._carried_total + max(0, carried) > self.ceiling * seen:
                target, reason = req.bucket, "stay"
            else:
                self._carried_total += max(0, carried)
        elif target != req.bucket and self.repay is not None:
            self._carried_total += max(0, carried)
        return super()._move(req, target, carried, reason)

    def finish(self, request_id, trajectory: Trajectory) -> None:
        req = self._check_finish(request_id, trajectory)  # before any book: a refused finish changes nothing
        self._finished_total += trajectory.total_tokens
        if self.cold == "budget" and req is not None and not req.state.warm:
            self._cold_finished += trajectory.total_tokens
        if self._budget is not None and req is not None and req.state.warm:
            self._budget.finish(req.state.points, trajectory.total_tokens)
        if self._fit is not None and req is not None and req.state is not None and req.state.calib:
            self._fit.finish(self._resolved_calib(req.state), self.bucket_for(trajectory.total_tokens))
        if self._experts is not None and req is not None and req.state.guesses is not None:
            self._experts.finish(req.state.guesses, self.bucket_for(trajectory.total_tokens), trajectory.prompt_tokens)
        super().finish(request_id, trajectory)

    def _adapt_price(self) -> None:
        budget = self._budget
        step_tokens = self._finished_total - self._step_start_total
        self._step_start_total = self._finished_total
        if budget is None:
            return
        first = not budget.recorded
        budget.end_step()
        if self.hold_first and first and budget.recorded and not self._held:
            self._held = True  # the first warm step ended (`hold_first`)
            budget.forget()
            return
        share = None
        if self.repay is not None and step_tokens > 0:
            shortfall = self.budget * self._finished_total - self._carried_total  # type: ignore[operator]
            top = 1.0 if self.ceiling is None else self.ceiling
            share = min(top, max(0.0, self.budget + shortfall / (self.repay * step_tokens)))  # type: ignore[operator]
        if self.budget_mix:
            self.price, self._mix_price, self._mix_q = budget.choose_mix(self.price, share)
        else:
            self.price = budget.choose(self.price, share)

    def _learn(self, finished: list[Trajectory]) -> None:
        self._cold_carried = self._cold_finished = 0
        self._adapt_price()
        if self._fit is not None:
            self._fit.end_step()
            self.shrink = self._fit.choose(self.shrink)
        if self._experts is not None:
            self._experts.end_step()

        if self._fit is not None:  # records of requests in flight read the root's window before it changes
            for req in self._requests.values():
                if req.state is not None and req.state.calib:
                    req.state.calib = self._resolved_calib(req.state)
        self.tree.update(finished)

    def _resolved_calib(self, walk: Walk) -> list[tuple[list[float], list[float], float]]:
        """The request's `shrink="auto"` records with the population shares of those `_priced_call` left for later (the
        context in their place): found in the agnostic root's window, unchanged since the record (the tree learns
        only in `end_step`, which resolves the requests in flight first). A record whose request outlived the whole
        window by now is dropped (only if the tree was updated under it from outside `end_step`)."""
        out: list[tuple[list[float], list[float], float]] = []
        for probs, prior, n in walk.calib:
            shares = self._root_probs(self.tree.agnostic, walk.root_ctx, prior) if isinstance(prior, int) else prior
            if shares is not None:
                out.append((probs, shares, n))
        return out
