"""Rollout planning: which TP-1/2/4/8 instances to run and which length range each bucket serves.

Requests are sorted by length and grouped into Q length quantiles (`WorkloadProfile.groups`). A **bucket** is a
contiguous range of groups [j, i) served by `c` instances of degree `tp` that share its requests evenly; its time
`T(j, i, tp, c)` comes from `RolloutCost.instance_time`. Rollout time is the slowest bucket.

What a bucket serves depends on how requests reach it (`routing`):
- `start-small` (default; the published C-MLFQ admission and length-bucketed serving without prediction): every
  request starts in the smallest bucket and is promoted as its context outgrows each bucket's limit. Bucket [j, i)
  with context range (lo, hi] serves the requests that end in it from context lo (re-prefilling the lo tokens a
  migration carries in) and every longer request from lo to hi; only the smallest bucket pays the per-request
  engine cost. Each bucket's work still depends only on its own range, so the DP below stays exact.
- `final-length`: each request is served only by the bucket of its final length (perfect routing, as if an oracle
  or a predictor at admission chose), the published DP's assumption.
  A request that ends in a later bucket first queues for admission in the smallest one: first come, first
  served in an order that says nothing of its length, so it starts on average `admission_delay` (default 1/2) of
  the way through the rollout. A later bucket therefore finishes within T only if its longest request's chain
  fits in (1 - admission_delay) T; its time is max(T_instance, chain / (1 - admission_delay))
  (`RolloutCost.instance_time(queued_share=...)`), which keeps the DP separable.
Within a request, decoded tokens are spread evenly over its context (a piece of d decoded tokens ending at context b
has decode-weighted resident context b - d / 2, as for a whole request).

The published DP, `dp[g][i]` = least makespan serving the first i groups with g GPUs, is computed through its
inverse, which has the same optimum and is cheap to tabulate:

    M(T) = least GPUs that serve all Q groups with every bucket finishing within T
         = f[Q],  f[0] = 0,  f[i] = min_{j < i, tp} f[j] + tp * cmin(j, i, tp, T)

where cmin is the fewest instances with T(j, i, tp, c) <= T (times are taken as a running minimum over c: an
instance may idle, so more instances are never slower). Then `T_rollout(g) = min {T : M(T) <= g}`, found by
bisection over T; M is monotone, so the bisection is exact up to float precision (the final plan's time lies in
(lo, hi] with hi - lo below one ulp of the answer). Every bucket-time table is computed once per profile and
memoised, so all budgets, and the joint search with training, reuse it.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from libra.planning.cost import RolloutCost
from libra.spec import InstanceGroup, LengthGroup, SpecError

ROUTINGS = ("start-small", "final-length")
_NONE = np.empty(0, dtype=np.int64)
_GRID = 1 << 15  # grid entries (ranges x counts) per vectorised cost evaluation


@attrs.frozen(kw_only=True)
class BucketChoice:
    start: int  # first group (inclusive)
    stop: int  # last group (exclusive)
    tp: int
    count: int
    time_s: float


class CountBracket:
    """The per-range positions `RolloutTable` found for earlier limits of one search: the positions for a new
    limit lie between those of the nearest larger and the nearest smaller limit seen (times never increase within a
    range), so a bisection's later probes search a few entries per range instead of the whole range."""

    def __init__(self) -> None:
        self._limits: list[float] = []
        self._positions: list[np.ndarray] = []

    def window(self, table: RolloutTable, limit: float) -> tuple[np.ndarray, np.ndarray]:
        floor, ceil = table._all_starts, table._all_ends
        above = [k for k, x in enumerate(self._limits) if x >= limit]
        below = [k for k, x in enumerate(self._limits) if x <= limit]
        if above:
            floor = self._positions[min(above, key=self._limits.__getitem__)]
        if below:
            ceil = self._positions[max(below, key=self._limits.__getitem__)]
        return floor, ceil

    def add(self, limit: float, positions: np.ndarray) -> None:
        self._limits.append(limit)
        self._positions.append(positions)


class RolloutTable:
    """Bucket times for every contiguous range of groups, TP degree and instance count (flat ragged arrays)."""

    def __init__(
        self,
        cost: RolloutCost,
        groups: tuple[LengthGroup, ...],
        *,
        tp_degrees: tuple[int, ...],
        max_gpus: int,
        tool_latency_s: float = 0.0,
        routing: str = "start-small",
        admission_delay: float = 0.5,
    ) -> None:
        if routing not in ROUTINGS:
            raise SpecError(f"unknown rollout routing {routing!r}; expected one of {', '.join(ROUTINGS)}")
        if not 0.0 <= admission_delay < 1.0:
            raise SpecError(f"admission_delay must be in [0, 1), got {admission_delay}")
        self.cost, self.groups, self.max_gpus, self.routing = cost, groups, max_gpus, routing
        self.tool_latency_s = tool_latency_s
        q = len(groups)
        self.num_groups = q
        c = np.array([g.count for g in groups], dtype=float)
        t = np.array([g.mean_total for g in groups], dtype=float)
        r = np.array([g.mean_gen for g in groups], dtype=float) / np.maximum(t, 1e-9)  # decoded share of a token
        pre = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
        per_group = dict(
            n=c,
            gen=c * r * t,
            tot=c * t,
            cr=c * r,
            cr2=c * r * r,
            res0=c * (r * t * t - r * r * t * t / 2),
            res1=c * (r * r * t - r * t),
        )
        sums = {k: pre(v) for k, v in per_group.items()}
        starts, stops = np.triu_indices(q + 1, k=1)
        self.starts, self.stops = starts, stops
        rng = lambda k: sums[k][stops] - sums[k][starts]  # noqa: E731  (groups start..stop-1: ending here)
        tail = lambda k: sums[k][q] - sums[k][stops]  # noqa: E731  (groups stop..q-1: passing through)
        top = np.array([g.max_total for g in groups])
        hi = top[stops - 1]
        flow = routing == "start-small"
        lo = np.where(flow & (starts > 0), top[np.maximum(starts - 1, 0)], 0.0)
        # requests ending here decode from context lo to their end; with start-small routing the longer ones pass
        # through, from lo to hi. A piece of d decode tokens ending at context b has prefill b - d (tool tokens,
        # the prompt, or the context a migration carries in) and decode-weighted resident context b - d / 2.
        n_pass = tail("n") * flow
        n = rng("n") + n_pass
        width = hi - lo
        decode = rng("gen") - lo * rng("cr") + width * tail("cr") * flow
        prefill = rng("tot") + n_pass * hi - decode
        resident_sum = (
            rng("res0")
            + lo * rng("res1")
            - lo * lo * rng("cr2") / 2
            + (width * hi * tail("cr") - width * width * tail("cr2") / 2) * flow
        )
        resident = resident_sum / np.maximum(decode, 1e-9)
        fresh = np.where(starts == 0, n, 0.0) if flow else n
        queued = np.where(flow & (starts > 0), admission_delay, 0.0)  # later buckets' requests queued in the first
        max_total = hi
        # the tail: the range's longest decoder must live through its whole chain of turns before it ends here, the
        # part decoded in smaller buckets included (taken at this bucket's step time). Groups are sorted by total
        # length (prompt and tool returns included), not by decoded tokens, so it may sit in any group of the range
        # (the first of ties). Requests passing through (start-small) are charged their chain in the later bucket
        # where they end, as `GlobalPlanner.rollout_time` does.
        tail_gen = np.array([g.tail_gen for g in groups])
        tail_turns = np.array([g.tail_turns for g in groups])
        longest = _first_max(tail_gen)[starts, stops - 1]  # per range, the group of its longest decoder
        max_gen = tail_gen[longest]
        max_turns = tail_turns[_first_max(tail_turns)[starts, stops - 1]]  # the most of any request of the range
        # where the profile knows each request's seconds in tool calls, the chain is the longest of three requests':
        # the range's longest decoder, the range's request longest in tool calls (tool time follows no length) and
        # the last group's longest decoder (the request longest in total: few tokens may come with long tool calls,
        # and `chain_bound_s` prices it), each with its own tool seconds; else the most turns at the mean call
        tool_tail = _tool_tail(groups, starts, stops, longest)
        # and a fourth: the range's request whose chain is the longest at the step time of a batch of one (the pace
        # the tail runs at, which depends on the degree): one second in both tokens and tool seconds may outlast the
        # three. Looked for among each group's `chain_reps` (the upper hull of its requests' chains)
        reps = None if tool_tail is None else _chain_reps(groups)
        self.tp_degrees = tuple(tp for tp in tp_degrees if tp <= max_gpus)
        self.times: dict[int, np.ndarray] = {}  # tp -> flat running-min times
        self.offsets: dict[int, np.ndarray] = {}  # tp -> start offset of each range in the flat array
        for tp in self.tp_degrees:
            caps = np.minimum(np.ceil(n), max_gpus // tp).astype(int)
            fits = max_total <= cost.kv_capacity_tokens(tp)
            caps = np.where(fits, caps, 0)
            offsets = np.concatenate([[0], np.cumsum(caps)])
            times = np.empty(int(offsets[-1]))
            # the ranges as a grid (range, k) in blocks of about _GRID entries, k = 1..the block's widest range:
            # row values broadcast rather than repeated, the running minimum over k along each row, and the
            # ragged table is the block's entries with k <= the range's cap, row by row (exact: elementwise)
            live = np.nonzero(caps)[0]
            paced = None  # per range (the live ones), `instance_time`'s `paced_tail` at this degree
            if reps is not None:
                paced = np.zeros((2, q * (q + 1) // 2))
                paced[:, live] = _paced_tail(cost, tp, reps, starts[live], stops[live], resident[live])
            for block in _row_blocks(caps[live], _GRID):
                rows = live[block]
                cap = caps[rows]
                width = int(cap.max())
                tm = cost.instance_time_grid(
                    tp,
                    np.arange(1, width + 1, dtype=float),
                    num_requests=n[rows],
                    decode_tokens=decode[rows],
                    prefill_tokens=prefill[rows],
                    resident_context=resident[rows],
                    max_gen=max_gen[rows],
                    max_turns=max_turns[rows],
                    tool_latency_s=tool_latency_s,
                    new_requests=fresh[rows],
                    queued_share=queued[rows],
                    tool_tail=None if tool_tail is None else tuple(x[rows] for x in tool_tail),
                    paced_tail=None if paced is None else tuple(paced[:, rows]),
                )
                np.minimum.accumulate(tm, axis=1, out=tm)
                entries = tm.ravel() if cap.min() == width else tm[np.arange(width)[None, :] < cap[:, None]]
                times[offsets[rows[0]] : offsets[rows[-1] + 1]] = entries
            self.times[tp], self.offsets[tp] = times, offsets
        # every TP degree's table end to end, so one search per limit answers all of them
        shift = np.cumsum([0] + [len(t) for t in self.times.values()])[:-1]
        self._all_times = np.concatenate([*self.times.values(), np.empty(0)])
        shifted = [o + d for o, d in zip(self.offsets.values(), shift, strict=True)]
        self._all_starts = np.concatenate([*(o[:-1] for o in shifted), _NONE])
        self._all_ends = np.concatenate([*(o[1:] for o in shifted), _NONE])
        self._levels = 1 << np.arange(int(max(self._all_ends - self._all_starts, default=0)).bit_length())[::-1]

    @property
    def num_entries(self) -> int:
        return sum(len(t) for t in self.times.values())

    def time(self, start: int, stop: int, tp: int, count: int) -> float:
        """T(start, stop, tp, count): inf when the range doesn't fit that TP degree or count is out of range."""
        r = self._range_index(start, stop)
        a, b = self.offsets[tp][r], self.offsets[tp][r + 1]
        return float(self.times[tp][a + count - 1]) if 1 <= count <= b - a else math.inf

    def _range_index(self, start: int, stop: int) -> int:
        q = self.num_groups
        return start * (2 * q + 1 - start) // 2 + (stop - start - 1)

    def min_counts(self, limit: float, bracket: CountBracket | None = None) -> dict[int, np.ndarray]:
        """tp -> per range, the fewest instances finishing within `limit` (0 = impossible). `bracket` (earlier
        limits' answers) narrows the search; the answer is the same with or without it."""
        pos = self._first_within(limit, bracket)
        starts, ends = self._all_starts, self._all_ends
        slower, caps = pos - starts, ends - starts  # per range, how many counts are slower than `limit` (>= 0)
        counts = np.where(slower < caps, slower + 1, 0)
        return dict(zip(self.times, np.split(counts, len(self.times)), strict=True)) if self.times else {}

    def _first_within(self, limit: float, bracket: CountBracket | None) -> np.ndarray:
        """Per range (all TP degrees end to end), the position in `_all_times` of its first count finishing within
        `limit` (the range's end when none does): binary lifting inside every range at once, as times never
        increase within a range. Between the answers for a larger limit (`floor`: every position before it is
        slower than that limit, so slower than this one) and a smaller one (`ceil`)."""
        floor, ceil = (self._all_starts, self._all_ends) if bracket is None else bracket.window(self, limit)
        pos = floor.copy()
        if len(self._all_times):
            last = len(self._all_times) - 1
            widest = int((ceil - floor).max())  # a table with entries has at least one range
            levels = self._levels if bracket is None else self._levels[self._levels <= max(widest, 1)]
            for step in levels:
                cand = pos + step
                move = (cand <= ceil) & (self._all_times[np.minimum(cand - 1, last)] > limit)
                pos = np.where(move, cand, pos)
        if bracket is not None:
            bracket.add(limit, pos)
        return pos

    def min_gpus(
        self, limit: float, bracket: CountBracket | None = None, *, counts: dict[int, np.ndarray] | None = None
    ) -> tuple[float, list[BucketChoice]]:
        """M(limit): fewest GPUs so that every bucket finishes within `limit`, and the buckets achieving it
        (`bracket`: as for `min_counts`; `counts`: `min_counts(limit)` already found)."""
        q = self.num_groups
        counts = self.min_counts(limit, bracket) if counts is None else counts
        cost = np.full(len(self.starts), np.inf)
        choice_tp = np.zeros(len(self.starts), dtype=int)
        for tp in self.tp_degrees:  # ascending TP: ties keep the smaller degree
            gpus = np.where(counts[tp] > 0, counts[tp] * tp, np.inf)
            better = gpus < cost
            cost[better], choice_tp[better] = gpus[better], tp
        matrix = np.full((q + 1, q + 1), np.inf)
        matrix[self.starts, self.stops] = cost
        f = np.full(q + 1, np.inf)
        f[0] = 0.0
        back = np.zeros(q + 1, dtype=int)
        for i in range(1, q + 1):
            vals = f[:i] + matrix[:i, i]
            j = int(vals.argmin())
            f[i], back[i] = vals[j], j
        if not np.isfinite(f[q]):
            return math.inf, []
        buckets, i = [], q
        while i > 0:
            j = int(back[i])
            r = self._range_index(j, i)
            tp = int(choice_tp[r])
            c = int(counts[tp][r])
            buckets.append(BucketChoice(start=j, stop=i, tp=tp, count=c, time_s=self.time(j, i, tp, c)))
            i = j
        return float(f[q]), buckets[::-1]

    def fluid_gpu_seconds(self) -> float:
        """Least GPU-seconds of rollout work if every group ran at full concurrency on its best TP degree. With
        `start-small` routing a request decodes its first tokens on small contexts in the smaller buckets; with
        decoded tokens spread evenly over its context (share r), its pieces' decode-weighted resident context is
        sum r (b - a) (b - r (b - a) / 2) / (r T) >= sum (b^2 - a^2) / (2 T) = T / 2, so T / 2 bounds it."""
        g = self.groups
        count = np.array([x.count for x in g], dtype=float)
        gen = np.array([x.mean_gen for x in g])
        total = np.array([x.mean_total for x in g])
        max_total = np.array([x.max_total for x in g])
        resident = total / 2 if self.routing == "start-small" else total - gen / 2
        best = np.full(len(g), np.inf)
        for tp in self.tp_degrees:
            work = self.cost.fluid_gpu_seconds(
                tp,
                num_requests=count,
                decode_tokens=count * gen,
                prefill_tokens=count * (total - gen),
                resident_context=resident,
            )
            best = np.minimum(best, np.where(max_total <= self.cost.kv_capacity_tokens(tp), work, np.inf))
        return float(best.sum())

    def chain_bound_s(self) -> float:
        """A lower bound on any plan's rollout time under this model, from its longest chains alone (0 where
        nothing fits).
        Every request ends in some bucket, whose range holds its length group, so whose degree holds the group's
        longest request. A bucket takes at least the chain of each of its range's groups' representatives (where
        tool seconds are known, the group's `chain_reps`, the upper hull of its requests' chains: the fourth
        candidate of a bucket's chain is the longest of those at the pace of a batch of one, `paced_tail`; where
        tool seconds are unknown the chain is the range's most decoded tokens and most turns at the mean call) at
        the step time of a batch of one (`RolloutCost.instance_time`: what the throughput phase leaves of the chain
        finishes at that pace, and the batch's pace is no faster), and that step is at least the fastest degree's
        holding the group at an empty context. So the bound is the longest of those chains, each at its group's
        fastest step. The fluid bound ignores this: more GPUs shorten the throughput phase, never one request's own
        turns and tool calls."""
        g = self.groups
        if not g:
            return 0.0

        def fastest_step(tokens: float) -> float:  # a batch of one, empty context, the fastest degree holding it
            steps = [
                float(self.cost.decode_step_time(tp, 1.0, 0.0))
                for tp in self.tp_degrees
                if tokens <= self.cost.kv_capacity_tokens(tp)
            ]
            return min(steps, default=math.inf)

        if math.isinf(fastest_step(g[-1].max_total)):
            return 0.0
        known = _tool_seconds_known(g)
        bound = 0.0
        for x in g:
            step = fastest_step(x.max_total)  # (finite: the last group, the longest, fits)
            if known:
                own = max(gen * step + tools for gen, tools in x.chain_reps)
            else:
                own = x.tail_gen * step + x.tail_turns * self.tool_latency_s
            bound = max(bound, own)
        return bound

    def candidates(self, lo: float, hi: float, bracket: CountBracket | None = None) -> np.ndarray:
        """Every bucket time in (lo, hi]: the optimum lies among them or among the training times. With a
        `bracket`, read from the positions of both limits (within a range the times in (lo, hi] lie between the
        first within hi and the first within lo) rather than by scanning the whole table; the same values."""
        if bracket is None or not len(self._all_times):
            found = [times[(times > lo) & (times <= hi)] for times in self.times.values()]
            return np.unique(np.concatenate(found)) if found else np.empty(0)
        first = self._first_within(hi, bracket)
        width = self._first_within(lo, bracket) - first
        keep = width > 0
        first, width = first[keep], width[keep]
        offsets = np.cumsum(width) - width  # each range's run laid end to end: index = first + (k - offset)
        index = np.arange(int(width.sum())) + np.repeat(first - offsets, width)
        return np.unique(self._all_times[index])

    def instance_groups(self, buckets: list[BucketChoice]) -> tuple[InstanceGroup, ...]:
        out = []
        for k, b in enumerate(buckets):
            low = 0.0 if k == 0 else self.groups[b.start - 1].max_total
            high = math.inf if k == len(buckets) - 1 else self.groups[b.stop - 1].max_total
            out.append(InstanceGroup(tp=b.tp, count=b.count, max_tokens=high, min_tokens=low))
        return tuple(out)


def _tool_seconds_known(groups: tuple[LengthGroup, ...]) -> bool:
    """Every group knows its requests' seconds in tool calls (the profile had `tool_s`)."""
    return all(g.max_tool_s is not None and g.max_gen_tool_s is not None for g in groups)


def _first_max(values: np.ndarray) -> np.ndarray:
    """at[s, e] (s <= e): the index of max(values[s:e + 1]), the first of ties; a row s at a time, O(q^2) in all
    (a new maximum where a value beats every one before it in the row, so ties keep the earlier index)."""
    q = len(values)
    at = np.zeros((q, q), dtype=np.int64)
    index = np.arange(q)
    for s in range(q):
        row = values[s:]
        record = np.concatenate([[True], row[1:] > np.maximum.accumulate(row)[:-1]])
        at[s, s:] = np.maximum.accumulate(np.where(record, index[s:], 0))
    return at


def _tool_tail(
    groups: tuple[LengthGroup, ...], starts: np.ndarray, stops: np.ndarray, longest: np.ndarray
) -> tuple[np.ndarray, ...] | None:
    """Per range [start, stop): `RolloutCost.instance_time`'s `tool_tail`, the tool seconds of the range's longest
    decoder (in group `longest`), the tokens and tool seconds of the range's request longest in tool calls (the
    first group of ties), and the tokens and tool seconds of the last group's longest decoder; None where a group
    has no tool seconds."""
    if not _tool_seconds_known(groups):
        return None
    most = np.array([g.max_tool_s for g in groups], dtype=float)
    pick = _first_max(most)[starts, stops - 1]
    gen_tools = np.array([g.max_gen_tool_s for g in groups], dtype=float)
    last = stops - 1
    tail_gen = np.array([g.tail_gen for g in groups], dtype=float)
    tool_gen = np.array([g.max_tool_gen for g in groups], dtype=float)
    return gen_tools[longest], tool_gen[pick], most[pick], tail_gen[last], gen_tools[last]


def _chain_reps(groups: tuple[LengthGroup, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The requests a range's `paced_tail` is looked for among, in order (each group's `chain_reps`), as (group,
    tokens decoded, seconds in tool calls)."""
    reps = [(i, gen, tools) for i, g in enumerate(groups) for gen, tools in g.chain_reps]
    group = np.array([r[0] for r in reps], dtype=np.int64)
    return group, np.array([r[1] for r in reps], dtype=float), np.array([r[2] for r in reps], dtype=float)


def _paced_tail(
    cost: RolloutCost,
    tp: int,
    reps: tuple[np.ndarray, np.ndarray, np.ndarray],
    starts: np.ndarray,
    stops: np.ndarray,
    resident: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per range [start, stop): the tokens and tool seconds of the request of `reps` (`_chain_reps`) in its groups
    whose chain is the longest at degree `tp`'s step time of a batch of one at the range's resident context (the
    first of ties, as `cost.rollout.paced_pick`): `RolloutCost.instance_time`'s `paced_tail`."""
    group, gen, tools = reps
    step1 = np.asarray(cost.decode_step_time(tp, 1.0, resident), dtype=float)
    pick = np.empty(len(starts), dtype=np.int64)
    rows = max(1, _GRID // max(1, len(gen)))  # ranges per (ranges x requests) grid, about _GRID entries each
    for a in range(0, len(starts), rows):
        b = a + rows
        chain = step1[a:b, None] * gen[None, :] + tools[None, :]
        chain[(group[None, :] < starts[a:b, None]) | (group[None, :] >= stops[a:b, None])] = -np.inf
        pick[a:b] = np.argmax(chain, axis=1)
    return gen[pick], tools[pick]


def _row_blocks(caps: np.ndarray, size: int) -> list[slice]:
    """Consecutive rows in blocks of about `size` grid entries (rows x the block's widest row), at least one row
    each."""
    blocks, start, width = [], 0, 0
    for r, cap in enumerate(caps.tolist()):
        wider = cap if cap > width else width
        if r > start and (r - start + 1) * wider > size:
            blocks.append(slice(start, r))
            start, width = r, cap
        else:
            width = wider
    if start < len(caps):
        blocks.append(slice(start, len(caps)))
    return blocks


def bisect_min(
    feasible, lo: float, hi: float, *, candidates=None, iterations: int = 200, switch_ratio: float = 1e-6
) -> float:
    """Smallest T in (lo, hi] with feasible(T), for monotone `feasible` with feasible(hi) true and feasible(lo)
    false. Bisects in log space; once hi/lo - 1 < switch_ratio and `candidates(lo, hi)` (every value the optimum
    can take inside the interval) is given, tests those in order instead, so the answer is exact."""
    for _ in range(iterations):
        if candidates is not None and lo > 0 and hi / lo - 1.0 < switch_ratio:
            for value in candidates(lo, hi):
                if feasible(value):
                    return float(value)
            return hi
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2.0
        if not lo < mid < hi:
            break
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi
