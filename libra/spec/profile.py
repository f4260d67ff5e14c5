"""WorkloadProfile: what the planner needs to know of one step's trajectories.

It keeps a sorted sample of per-trajectory shapes (total length and tokens decoded), plus summary statistics.
The planner groups the sample into length quantiles, so a profile of 8,192 trajectories costs it little.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from libra.spec import checks
from libra.spec.errors import SpecError

_PLAIN = frozenset((float,))
_SIZES = ("mean_total", "mean_gen", "max_total", "mean_turns", "max_gen", "max_turns", "max_tool_gen")
MAX_TOKENS = 1_000_000_000  # tokens in one trajectory: 100 x the trace loader's bound
MAX_REQUESTS = 1_000_000_000  # trajectories in one step: far above any RL step, small enough to price in floats
# a group's means are sums over its trajectories divided by their count: in floats the mean of equal lengths may
# come out an ulp above them (3 x 0.1 / 3 > 0.1), which is no impossible group
_ROUNDING = 1.0 + 1e-9


@attrs.frozen(kw_only=True)
class LengthGroup:
    """`count` trajectories with these mean shapes; `max_total` is the longest in the group, `max_gen` and
    `max_turns` the most tokens decoded and turns taken by one of them (0: unknown, estimated from the means);
    `max_tool_s` the most seconds one of them spent in tool calls, `max_tool_gen` that one's decoded tokens and
    `max_gen_tool_s` the seconds in tool calls of the one decoding `max_gen` (None: unknown, the planner takes the
    most turns times the mean tool call). `chain_points`: (decoded tokens, seconds in tool calls) of the requests
    whose own chain of turns, tokens at a pace plus tool seconds, is the group's longest at some pace (the upper
    hull, `chain_hull`); empty where not computed, and then the group's longest decoder and its request longest in
    tool calls stand for them."""

    count: int
    mean_total: float
    mean_gen: float
    max_total: float
    mean_turns: float = 1.0
    max_gen: float = 0.0
    max_turns: float = 0.0
    max_tool_s: float | None = None
    max_tool_gen: float = 0.0
    max_gen_tool_s: float | None = None
    chain_points: tuple[tuple[float, float], ...] = ()

    def __attrs_post_init__(self) -> None:
        checks.whole("LengthGroup", "count", self.count, 1, MAX_REQUESTS)
        sizes: tuple[float, ...] = (self.mean_total, self.mean_gen, self.max_total, self.mean_turns, self.max_gen)
        sizes += (self.max_turns, self.max_tool_gen)
        # the planner's groups (hundreds a plan) are plain floats: one pass for them, a check a field otherwise
        if not (set(map(type, sizes)) <= _PLAIN and min(sizes) >= 0.0 and math.isfinite(sum(sizes))):
            for name, value in zip(_SIZES, sizes):
                checks.number("LengthGroup", name, value, 0.0)
        checks.seconds("LengthGroup", "max_tool_s", self.max_tool_s, none=True)
        checks.seconds("LengthGroup", "max_gen_tool_s", self.max_gen_tool_s, none=True)
        for gen, tool_s in self.chain_points:
            checks.number("LengthGroup", "chain_points (decoded tokens)", gen, 0.0)
            checks.seconds("LengthGroup", "chain_points (tool seconds)", tool_s)
        self._check_shape()

    def _check_shape(self) -> None:
        """One line naming the first of the group's sizes that no group of trajectories can have."""
        for name, value, label, bound, why in (
            ("mean_total", self.mean_total, "max_total", self.max_total, "no mean is above its maximum"),
            ("mean_gen", self.mean_gen, "mean_total", self.mean_total, "decoded tokens are part of the total"),
            ("max_gen", self.max_gen, "max_total", self.max_total, "no trajectory of the group is longer"),
            ("max_tool_gen", self.max_tool_gen, "max_total", self.max_total, "no trajectory of the group is longer"),
        ):
            if value > bound * _ROUNDING:
                checks.fail("LengthGroup", name, f"<= {label} {bound!r} ({why})", value)

    @property
    def chain_reps(self) -> tuple[tuple[float, float], ...]:
        """The requests whose own chains stand for every request's of the group, as (tokens decoded, seconds in
        tool calls): `chain_points` (at every pace one of them has the longest chain) where the profile computed
        them, else the longest decoder and the request longest in tool calls (tool seconds taken as 0 if unknown)."""
        if self.chain_points:
            return self.chain_points
        return ((self.tail_gen, self.max_gen_tool_s or 0.0), (self.max_tool_gen, self.max_tool_s or 0.0))

    @property
    def tail_gen(self) -> float:
        """Tokens the group's longest decoder decodes (the rollout tail)."""
        return self.max_gen or self.mean_gen / max(self.mean_total, 1e-9) * self.max_total

    @property
    def tail_turns(self) -> float:
        return self.max_turns or self.mean_turns


def _floats(values: Iterable[float]) -> tuple[float, ...]:
    """A tuple of the values (a tuple given is kept as it is: no copy)."""
    return values if isinstance(values, tuple) else tuple(values)


@attrs.frozen(kw_only=True)
class WorkloadProfile:
    """One step's trajectories. `total_lengths[i]` = prompt + generated + tool tokens of trajectory i and
    `gen_tokens[i]` its decoded tokens; both sorted by total length. `requests_per_step` is how many trajectories
    one step generates (the sample may be smaller or larger; the planner scales it). `tool_s[i]`, where known,
    is the seconds trajectory i spent in tool calls (empty: unknown; the planner then prices a chain of turns at
    `mean_tool_time_s` a call)."""

    name: str
    total_lengths: tuple[float, ...] = attrs.field(converter=_floats)
    gen_tokens: tuple[float, ...] = attrs.field(converter=_floats)
    turns: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    requests_per_step: int = 8192
    mean_tool_time_s: float = 0.0
    tool_s: tuple[float, ...] = attrs.field(default=(), converter=_floats)

    def __attrs_post_init__(self) -> None:
        checks.instance("WorkloadProfile", "name", self.name, str)
        if not self.total_lengths:
            raise SpecError(f"WorkloadProfile {self.name!r} has no trajectories")
        if len(self.gen_tokens) != len(self.total_lengths):
            raise SpecError("WorkloadProfile.gen_tokens must have one entry per trajectory")
        if self.turns and len(self.turns) != len(self.total_lengths):
            raise SpecError("WorkloadProfile.turns must be empty or have one entry per trajectory")
        if self.tool_s and len(self.tool_s) != len(self.total_lengths):
            raise SpecError("WorkloadProfile.tool_s must be empty or have one entry per trajectory")
        try:  # the range checks below compare and add every entry: a string or None among them is a TypeError
            self._check_samples()
        except (TypeError, OverflowError):  # (and an integer too large for a float an OverflowError)
            bad = next((x for v in self._samples() for x in v if math.isnan(checks.as_float(x))), None)
            raise SpecError(
                f"WorkloadProfile {self.name!r}: trajectory shapes must be finite numbers, got {bad!r}"
            ) from None
        checks.seconds("WorkloadProfile", "mean_tool_time_s", self.mean_tool_time_s)
        rps = self.requests_per_step
        if not (checks.is_whole(rps) and 1 <= rps <= MAX_REQUESTS):  # the wording that callers' tests match
            checks.fail("WorkloadProfile", "requests_per_step", f">= 1 and <= {MAX_REQUESTS:,} (whole)", rps)

    def _samples(self) -> tuple[tuple[float, ...], ...]:
        return (self.total_lengths, self.gen_tokens, self.turns, self.tool_s)

    def _check_samples(self) -> None:
        """The per-trajectory tuples' ranges, in a few passes each (a profile holds thousands of trajectories)."""
        if self.tool_s and not all(math.isfinite(x) and x >= 0 for x in self.tool_s):
            raise SpecError("WorkloadProfile.tool_s must be finite seconds >= 0")
        if any(not a <= b for a, b in zip(self.total_lengths, self.total_lengths[1:])):  # (NaN fails too)
            raise SpecError("WorkloadProfile.total_lengths must be sorted ascending (use WorkloadProfile.build)")
        if not (self.total_lengths[0] >= 0 and float(self.total_lengths[-1]) <= MAX_TOKENS):  # (NaN fails too)
            raise SpecError(f"WorkloadProfile.total_lengths must be finite token counts >= 0 and <= {MAX_TOKENS:,}")
        if not (math.isfinite(sum(self.gen_tokens)) and min(self.gen_tokens) >= 0):  # (a NaN or inf makes the sum so)
            raise SpecError("WorkloadProfile.gen_tokens must be finite token counts >= 0")
        if any(map(operator.gt, self.gen_tokens, self.total_lengths)):  # decoded tokens are part of the total
            i, gen, total = next(
                (i, g, t) for i, (g, t) in enumerate(zip(self.gen_tokens, self.total_lengths)) if g > t
            )
            raise SpecError(
                f"WorkloadProfile {self.name!r}: trajectory {i} (by total length) decodes {gen:g} tokens of a total "
                f"of {total:g}; gen_tokens must be <= total_lengths"
            )
        if self.turns and not (math.isfinite(sum(self.turns)) and min(self.turns) >= 0):
            raise SpecError("WorkloadProfile.turns must be finite counts >= 0")

    @classmethod
    def build(
        cls,
        *,
        name: str,
        shapes: Sequence[tuple[float, ...]],
        requests_per_step: int | None = None,
        mean_tool_time_s: float = 0.0,
    ) -> WorkloadProfile:
        """From unsorted `(total_tokens, gen_tokens, turns)` triples, or `(..., tool_s)` quadruples where each
        trajectory's seconds in tool calls are known."""
        if not shapes:
            raise SpecError(f"WorkloadProfile {name!r} has no trajectories")
        if len({len(s) for s in shapes}) != 1 or len(shapes[0]) not in (3, 4):
            raise SpecError(f"WorkloadProfile {name!r}: shapes must all be triples or all quadruples")
        ordered = sorted(shapes)
        return cls(
            name=name,
            total_lengths=tuple(float(s[0]) for s in ordered),
            gen_tokens=tuple(float(s[1]) for s in ordered),
            turns=tuple(float(s[2]) for s in ordered),
            requests_per_step=requests_per_step if requests_per_step is not None else len(ordered),
            mean_tool_time_s=mean_tool_time_s,
            tool_s=tuple(float(s[3]) for s in ordered) if len(ordered[0]) > 3 else (),
        )

    @property
    def num_samples(self) -> int:
        return len(self.total_lengths)

    @property
    def mean_length(self) -> float:
        return sum(self.total_lengths) / self.num_samples

    @property
    def total_tokens_per_step(self) -> float:
        return self.mean_length * self.requests_per_step

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise SpecError(f"quantile must be in [0, 1], got {q}")
        idx = min(self.num_samples - 1, max(0, math.ceil(q * self.num_samples) - 1))
        return self.total_lengths[idx]

    def groups(self, num_groups: int) -> tuple[LengthGroup, ...]:
        """Split the sorted sample into at most `num_groups` contiguous groups of (nearly) equal count, and at most
        one group a request, whose counts add up to exactly `requests_per_step`: each group one request plus its
        share of the rest, by cumulative rounding. (Rounding each group's share alone gave every group at least
        one: a step of one request was planned as 32, and the counts drifted from the step's.) Unscaled (a step of
        the sample's size), a group's count is its size. No boundary splits requests of equal length: a bucket's
        limit is its last group's `max_total`, and every request of that length is served there (routing and
        `GlobalPlanner.evaluate` place a request on the first bucket that holds it), so a tie cut in two had its
        upper part priced in the next bucket; such a boundary moves to the nearer end of the tie (fewer groups
        where a tie spans one)."""
        n, requests = self.num_samples, self.requests_per_step
        k = max(1, min(num_groups, n, requests))
        bounds = _whole_lengths(self.total_lengths, [round(i * n / k) for i in range(k + 1)])  # k <= n: none empty
        k = len(bounds) - 1
        shares = [round(b * (requests - k) / n) for b in bounds]
        out = []
        for lo, hi, a, b in zip(bounds, bounds[1:], shares, shares[1:]):
            size = hi - lo
            turns = self.turns[lo:hi] if self.turns else (1.0,) * size
            # the request decoding the most, and the one longest in tool calls (the first of ties), where known
            most_gen = max(range(lo, hi), key=self.gen_tokens.__getitem__)
            most_tool = max(range(lo, hi), key=self.tool_s.__getitem__) if self.tool_s else None
            out.append(
                LengthGroup(
                    count=size if requests == n else 1 + b - a,
                    mean_total=sum(self.total_lengths[lo:hi]) / size,
                    mean_gen=sum(self.gen_tokens[lo:hi]) / size,
                    max_total=self.total_lengths[hi - 1],
                    mean_turns=sum(turns) / size,
                    max_gen=self.gen_tokens[most_gen],
                    max_turns=max(turns),
                    max_tool_s=None if most_tool is None else self.tool_s[most_tool],
                    max_tool_gen=0.0 if most_tool is None else self.gen_tokens[most_tool],
                    max_gen_tool_s=self.tool_s[most_gen] if self.tool_s else None,
                    chain_points=chain_hull(self.gen_tokens[lo:hi], self.tool_s[lo:hi]) if self.tool_s else (),
                )
            )
        return tuple(out)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "trajectories": self.num_samples,
            "requests_per_step": self.requests_per_step,
            "mean_tokens": self.mean_length,
            "p50_tokens": self.quantile(0.5),
            "p90_tokens": self.quantile(0.9),
            "p99_tokens": self.quantile(0.99),
            "max_tokens": self.total_lengths[-1],
            "mean_tool_call_s": self.mean_tool_time_s,
            # each trajectory's seconds in tool calls, where known (None: unknown, priced at the mean call)
            "max_tool_s": max(self.tool_s) if self.tool_s else None,
        }


def _whole_lengths(lengths: Sequence[float], bounds: list[int]) -> list[int]:
    """`bounds` (group starts in the ascending `lengths`, then its size) with each inner bound that falls inside a
    run of equal lengths moved to the run's nearer end (its upper end on a draw), and repeats dropped."""
    out = [0]
    for b in bounds[1:-1]:
        if lengths[b - 1] == lengths[b]:
            lo, hi = bisect.bisect_left(lengths, lengths[b]), bisect.bisect_right(lengths, lengths[b])
            b = hi if hi - b <= b - lo else lo
        if out[-1] < b < len(lengths):
            out.append(b)
    return [*out, len(lengths)]


def chain_hull(gen: Sequence[float], tool_s: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """The (decoded tokens, tool seconds) pairs among `gen` and `tool_s` whose own chain, `gen * pace + tool_s`, is
    the longest at some pace >= 0: the upper hull from the request longest in tool calls (pace 0) to the one that
    decodes the most (any large pace), fewest tokens first. Any other request's chain is at most the longest of
    these at every pace, so a bucket that lives through theirs lives through every request's."""
    points = set(zip(map(float, gen), map(float, tool_s)))
    first = max(points, key=lambda p: (p[1], p[0]))  # pace 0: the most tool seconds (of those, the most tokens)
    hull = [first]
    for p in sorted(q for q in points if q[0] > first[0]):  # the upper hull onwards (Andrew's monotone chain)
        while len(hull) >= 2 and _turns_left(hull[-2], hull[-1], p) >= 0.0:
            hull.pop()
        hull.append(p)
    return tuple(hull)


def _turns_left(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """Cross product of (b - a) and (c - a): >= 0 where b lies on or under the line from a to c (not on the upper
    hull)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
