"""The router contract: requests in, `RouteDecision` values out.

A rollout loop (the simulator, the vLLM adapter, any RL framework) calls, per request:
`admit` once, then `on_progress` as the generation grows and `on_tool_return` after each tool call, in any
interleaving with other requests, then `finish` once with the finished trajectory. At a step boundary it calls
`end_step()`, which is the only place a router learns from finished trajectories; routing within step s therefore
uses only trajectories finished in earlier steps. Each call returns a decision (except `finish`/`end_step`): the
bucket the request should be in now and, if that differs from where it was, a migration whose cost is the
context already in KV cache (`migrated_tokens`) that the destination must re-prefill or receive.

Buckets are indices into the `buckets` tuple given at construction (`Bucket(tp, max_tokens)`, limits ascending).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from libra.spec import Bucket, SpecError
from libra.workloads.trace import TOOL_STATUSES, Trajectory


@attrs.frozen(kw_only=True)
class RouteDecision:
    """Where request `request_id` should run now. `migrate` is True when `bucket != from_bucket`; then
    `migrated_tokens` is the context the move carries. `reason` is a short tag (admit, stay, tool-return, overflow,
    promote, predicted) for logs and tests."""

    request_id: Any
    bucket: int
    migrate: bool
    from_bucket: int | None
    migrated_tokens: int
    reason: str


# `_decision`: each slot of a RouteDecision set by its descriptor (attrs sets a frozen class's fields through
# `object.__setattr__`, which looks each name up first); a renamed field fails here, at import
_new = object.__new__
_set_request_id = RouteDecision.__dict__["request_id"].__set__
_set_bucket = RouteDecision.__dict__["bucket"].__set__
_set_migrate = RouteDecision.__dict__["migrate"].__set__
_set_from_bucket = RouteDecision.__dict__["from_bucket"].__set__
_set_migrated_tokens = RouteDecision.__dict__["migrated_tokens"].__set__
_set_reason = RouteDecision.__dict__["reason"].__set__


def _decision(
    request_id: Any, bucket: int, migrate: bool, from_bucket: int | None, migrated_tokens: int, reason: str
) -> RouteDecision:
    """`RouteDecision(request_id=..., ..., reason=...)`, built in about half the time (0.28 against 0.55 us here):
    no keyword arguments to parse, no name look-up per field. The same value (RouteDecision has no defaults,
    converters or validators; test_route_decision.py compares the two and checks that every field is set): the
    router makes one at every admission, every move and a request's first return in a bucket."""
    d = _new(RouteDecision)
    _set_request_id(d, request_id)
    _set_bucket(d, bucket)
    _set_migrate(d, migrate)
    _set_from_bucket(d, from_bucket)
    _set_migrated_tokens(d, migrated_tokens)
    _set_reason(d, reason)
    return d


class Request:
    """What a router remembers about one request in flight (mutable, private to the router)."""

    __slots__ = (
        "request_id",
        "prompt_id",
        "prompt_tokens",
        "final_tokens",
        "bucket",
        "context",
        "tool_tokens",
        "migrations",
        "state",
        "stay",
    )

    def __init__(
        self, request_id: Any, prompt_id: str, prompt_tokens: int, final_tokens: int | None, bucket: int
    ) -> None:
        self.request_id = request_id
        self.prompt_id = prompt_id
        self.prompt_tokens = prompt_tokens
        self.final_tokens = final_tokens
        self.bucket = bucket
        self.context = prompt_tokens
        self.tool_tokens = 0
        self.migrations = 0
        self.state: Any = None  # per-policy scratch
        self.stay: RouteDecision | None = None  # the "stay" decision in `bucket`, made once per bucket (router.py)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if not isinstance(value, bool | int) and hasattr(value, "__index__"):  # numpy's and torch's integers
            raise SpecError(f"{name} must be a Python int (convert with int(...)), got {value!r}")
        raise SpecError(f"{name} must be a non-negative integer, got {value!r}")
    return value


class Router(ABC):
    """Base class of every routing policy. Subclasses implement `_admit` (and may override `_tool_return`,
    `_progress`, `_learn`); this class keeps the books: a request is admitted once, finished once, and every
    decision names an existing bucket."""

    name: ClassVar[str] = "router"

    def __init__(self, buckets: Sequence[Bucket]) -> None:
        buckets = tuple(buckets)
        if not buckets or not all(isinstance(b, Bucket) for b in buckets):
            raise SpecError("a router needs at least one Bucket (see libra.spec.parse_buckets)")
        if any(b.max_tokens <= a.max_tokens for a, b in zip(buckets, buckets[1:])):
            raise SpecError("bucket limits must increase strictly")
        self.buckets = buckets
        self.limits = tuple(b.max_tokens for b in buckets)
        self._requests: dict[Any, Request] = {}
        self._finished: list[Trajectory] = []
        # the sum of the contexts of the requests in flight, kept as they change (a policy that bounds its moves by
        # the tokens seen reads it at each move: a sum over thousands of requests in flight would cost O(n) a move)
        self._context_in_flight = 0

    # -- the contract --------------------------------------------------------------------------------------------
    def admit(
        self, request_id: Any, *, prompt_id: str, prompt_tokens: int, final_tokens: int | None = None
    ) -> RouteDecision:
        """Place a new request. `final_tokens` (the true final length) is read only by the `oracle` policy."""
        if request_id in self._requests:
            raise SpecError(f"request {request_id!r} is already admitted (a request is routed once)")
        _check_count("prompt_tokens", prompt_tokens)
        req = Request(request_id, str(prompt_id), prompt_tokens, final_tokens, 0)
        req.bucket = self._admit(req)
        self._requests[request_id] = req
        self._context_in_flight += prompt_tokens
        return _decision(request_id, req.bucket, False, None, 0, "admit")

    def on_tool_return(
        self, request_id: Any, *, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> RouteDecision:
        """A tool call of the request returned `tool_tokens` tokens with `status` (ok/error/timeout);
        `context_tokens` is the context including that return. A migration here carries the context already in KV
        cache, `context_tokens - tool_tokens`: the tool return is prefilled at the destination either way. Counts
        are Python `int`s (a numpy or torch integer raises SpecError: convert with `int(...)`); every argument
        after `request_id` is keyword-only."""
        req = self._book_tool_return(request_id, tool, tool_tokens, status, context_tokens)
        target, reason = self._tool_return(req, tool, tool_tokens, status)
        stay = req.stay
        if target == req.bucket and stay is not None and stay.bucket == target:  # `_move`'s commonest case, inline
            return stay
        return self._move(req, target, context_tokens - tool_tokens, reason)

    def _book_tool_return(
        self, request_id: Any, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> Request:
        """Every rule's `on_tool_return` starts here: the request in flight, its arguments checked (plain ones pass
        one test, `_checked_tool_return` takes the rest) and its context and tool tokens booked."""
        req = self._requests.get(request_id)
        if (
            req is None
            or status not in TOOL_STATUSES
            or type(tool) is not str
            or not tool
            or type(tool_tokens) is not int
            or tool_tokens < 0
            or type(context_tokens) is not int
            or context_tokens < 0
        ):
            req = self._checked_tool_return(request_id, tool, tool_tokens, status, context_tokens)
        self._context_in_flight += context_tokens - req.context
        req.context = context_tokens
        req.tool_tokens += tool_tokens
        return req

    def _checked_tool_return(
        self, request_id: Any, tool: object, tool_tokens: object, status: object, context_tokens: object
    ) -> Request:
        """`on_tool_return`'s checks in full and in order (the request in flight, the status, the tool, the
        counts): raises SpecError, or returns the request (arguments of a subclass of `str` or `int` pass)."""
        req = self._get(request_id)
        if status not in TOOL_STATUSES:
            raise SpecError(f"tool status must be one of {', '.join(TOOL_STATUSES)}, got {status!r}")
        if not isinstance(tool, str) or not tool:
            raise SpecError(f"tool must be a non-empty string, got {tool!r}")
        _check_count("tool_tokens", tool_tokens)
        _check_count("context_tokens", context_tokens)
        return req

    def on_progress(self, request_id: Any, *, context_tokens: int) -> RouteDecision:
        """The request's generation has grown its context to `context_tokens`."""
        req = self._get(request_id)
        _check_count("context_tokens", context_tokens)
        self._context_in_flight += context_tokens - req.context
        req.context = context_tokens
        target, reason = self._progress(req)
        return self._move(req, target, context_tokens, reason)

    def finish(self, request_id: Any, trajectory: Trajectory) -> None:
        """The request is done; its trajectory is kept for `end_step` (the tree learns it under the trajectory's
        own `prompt_id`). Finishing twice is an error."""
        req = self._check_finish(request_id, trajectory)
        del self._requests[request_id]
        self._context_in_flight -= req.context
        self._finished.append(trajectory)

    def abort(self, request_id: Any) -> None:
        """The request ended without a trajectory to learn from (its agent loop failed, it was cancelled): it leaves
        the books and no rule learns anything from it (`finish` with an empty trajectory would teach the tree, the
        price and the experts a request of zero tokens). The moves it made stay counted."""
        req = self._get(request_id)
        del self._requests[request_id]
        self._context_in_flight -= req.context

    def _check_finish(self, request_id: Any, trajectory: object) -> Request:
        """The request in flight that `trajectory` finishes; SpecError for anything else (before any book)."""
        req = self._get(request_id)
        if not isinstance(trajectory, Trajectory):
            raise SpecError(f"finish({request_id!r}, ...) needs its Trajectory, got {type(trajectory).__name__}")
        return req

    def end_step(self) -> None:
        """Step boundary: learn from the trajectories finished since the last boundary."""
        finished, self._finished = self._finished, []
        self._learn(finished)

    # -- introspection -------------------------------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        return len(self._requests)

    @property
    def context_in_flight(self) -> int:
        """The sum of the current contexts of the requests in flight (prompt, generated and tool tokens so far)."""
        return self._context_in_flight

    def bucket_of(self, request_id: Any) -> int:
        return self._get(request_id).bucket

    def migrations_of(self, request_id: Any) -> int:
        return self._get(request_id).migrations

    # -- for subclasses ------------------------------------------------------------------------------------------
    def bucket_for(self, length: float) -> int:
        """The bucket whose range holds `length` (the last bucket takes the overflow, and NaN): the first limit
        >= `length`, by bisection over the ascending limits."""
        limits = self.limits
        i = bisect_left(limits, length)
        if i == len(limits) or (i == 0 and not length <= limits[0]):  # past the last limit, or NaN
            return len(limits) - 1
        return i

    @classmethod
    def create(cls, buckets: Sequence[Bucket], **options: Any) -> Router:
        """The router `make_router` builds from options (a policy may read named option sets here)."""
        return cls(buckets, **options)

    @abstractmethod
    def _admit(self, req: Request) -> int:
        """The bucket a new request starts in."""

    def _tool_return(self, req: Request, tool: str, tool_tokens: int, status: str) -> tuple[int, str]:
        return req.bucket, "stay"

    def _progress(self, req: Request) -> tuple[int, str]:
        return req.bucket, "stay"

    def _learn(self, finished: list[Trajectory]) -> None:
        """Update from one step's finished trajectories (default: nothing to learn)."""
        return None

    def _get(self, request_id: Any) -> Request:
        req = self._requests.get(request_id)
        if req is None:
            raise SpecError(f"request {request_id!r} is not in flight (never admitted, or already finished)")
        return req

    def _move(self, req: Request, target: int, carried: int, reason: str) -> RouteDecision:
        if target == req.bucket:
            # most calls keep the request where it is: one frozen decision per request and bucket serves them all
            stay = req.stay
            if stay is None or stay.bucket != target:
                stay = req.stay = _decision(req.request_id, target, False, target, 0, "stay")
            return stay
        source = req.bucket
        req.bucket = target
        req.migrations += 1
        return _decision(req.request_id, target, True, source, max(0, carried), reason)


_REGISTRY: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: make a policy available to `make_router` under `cls.name`."""
    _REGISTRY[cls.name] = cls
    return cls


def router_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def _option_names(cls: type[Router]) -> set[str] | None:
    """The keyword options a policy takes: its constructor's and those `create` reads itself (which hands the
    rest to the constructor); None where the constructor takes any keyword."""
    import inspect

    names: set[str] = set()
    for fn, skip in ((cls.__init__, {"self", "buckets"}), (cls.create, {"buckets"})):
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.VAR_KEYWORD:
                if fn is cls.__init__:
                    return None
            elif p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in skip:
                names.add(p.name)
    return names


def make_router(name: str, buckets: Sequence[Bucket], **options: Any) -> Router:
    """A router by policy name (`cmlfq`, `mlfq`, `predictor`, `oracle`, `fcfs`); options go to its constructor
    (through `cls.create`: `cmlfq` takes `preset=NAME`, default its default preset). An unknown name or option
    raises SpecError."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise SpecError(f"unknown routing policy {name!r}; expected one of {', '.join(_REGISTRY)}")
    known = _option_names(cls)
    unknown = sorted(set(options) - known) if known is not None else []
    if unknown:
        raise SpecError(
            f"policy {name!r}: unknown option(s) {', '.join(unknown)}; "
            f"its options: {', '.join(sorted(known)) if known else 'none'}"
        )
    try:
        return cls.create(buckets, **options)
    except TypeError as exc:
        raise SpecError(f"policy {name!r}: {exc}") from None
