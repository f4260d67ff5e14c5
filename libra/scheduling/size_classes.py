"""Size classes learnt from the data: `QuantileStateCodec` classifies a tool return by where its size falls among
the recent returns of the same tool (its online quantiles), not by fixed token edges.

With `classes=3` a return is class 0, 1 or 2 as it is in the lower, middle or upper third of that tool's last
`sample` returns (all tools pooled while a tool has fewer than `min_samples`). So "a large return" means large
for that tool and that agent, whatever the workload: the same router serves a search agent whose results are
thousands of tokens and a customer-service agent whose user replies are tens. The edges move only when the prefix
tree learns (`observe`, called by `PrefixTree.update` at a step end), from finished trajectories: routing never
reads the future. Before any observation every return is class 0.

Rare tools share one key. A tool is keyed by its own name in the tree only while it returned in at least
`tool_share` (a tenth) of the finished trajectories, and in two; the returns of every other tool are keyed
OTHER_TOOL and classed by the pooled edges. Tool names that belong to one task (an API per query, a name that
carries an id) or to a few would otherwise open branches of the prompt-agnostic tree that no later request reaches,
and each such request would fall back to the root, losing what its number and kinds of returns say (measured on the
corpus with each task's tools renamed: 4-8 points of margin lost on ToRA, InterCode and WebDancer,
docs/routing-log.md). The counts move at step ends, as the edges do. A closed `tools` set keys every tool by name.

And a common tool is keyed by its name only while its name says something: while what followed its returns differs
from what followed each other common tool's (`tool_test`, a two-sample Kolmogorov-Smirnov test at level 0.01 on the
tokens left in a trajectory after the tool's first return, against the same after the other tool's first returns,
over the last `2 * sample` such returns; the only common tool is compared with all the other tools together). A name
that splits returns without telling them apart (a log whose tools are named after the task's group, `g3/search` and
`g3/answer`, or a wide vocabulary of same-purpose tools) would only split the tree's data (on the corpus with tools
named by random groups of 20 or 40 tasks: up to 5 points of margin lost on InterCode's Bash and Python runs,
docs/routing-log.md); pair by pair, each kind's names are told apart from no other name of their kind. A tool keyed
by its name keeps it while the test tells it apart at the looser level 0.05 (`tool_keep`): a distance near the
threshold would otherwise give and take the name, and the branches under it, at alternate step ends. A tool with no
other tool to compare with is named as before.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from libra.scheduling.states import StateCodec, ToolReturnState
from libra.spec import SpecError

OTHER_TOOL = "*"  # the key of the returns of rare tools (module docstring)
MAX_TOOLS = 10_000  # tools counted at most (`_name_tools`)
TOOL_TEST = 0.01  # the level of the test that keys a common tool by its name (module docstring)
TOOL_KEEP = 0.05  # the level at which a tool keyed by its name keeps it (module docstring)


class QuantileStateCodec(StateCodec):
    """A `StateCodec` whose size-class edges are per-tool online quantiles (module docstring)."""

    def __init__(
        self,
        *,
        classes: int = 3,
        sample: int = 2000,
        min_samples: int = 20,
        method: str = "breaks",
        tools: Iterable[str] | None = None,
        tool_share: float = 0.1,
        tool_test: float | None = TOOL_TEST,
        tool_keep: float = TOOL_KEEP,
    ) -> None:
        if method not in ("quantile", "breaks"):
            raise SpecError(f"size-class method must be 'quantile' or 'breaks', got {method!r}")
        self.method = method
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
            raise SpecError(f"size classes must be an integer >= 1, got {classes!r}")
        super().__init__(size_edges=(), tools=tools)
        self.classes = classes
        self.sample = int(sample)
        self.min_samples = int(min_samples)
        self._recent: dict[str, Sample] = {}
        self._pooled = Sample(4 * self.sample)
        self._edges: dict[str, tuple[float, ...]] = {}
        self._pooled_edges: tuple[float, ...] = ()
        if isinstance(tool_share, bool) or not isinstance(tool_share, (int, float)) or not 0 <= tool_share <= 1:
            raise SpecError(f"tool_share must be a number in [0, 1], got {tool_share!r}")
        self.tool_share = float(tool_share)
        if tool_test is not None and (
            isinstance(tool_test, bool) or not isinstance(tool_test, (int, float)) or not 0 < tool_test < 1
        ):
            raise SpecError(f"tool_test must be a level in (0, 1) or None, got {tool_test!r}")
        self.tool_test = None if tool_test is None else float(tool_test)
        if (
            isinstance(tool_keep, bool)
            or not isinstance(tool_keep, (int, float))
            or not (self.tool_test or 0) <= tool_keep < 1
            or tool_keep <= 0
        ):
            raise SpecError(f"tool_keep must be a level in [tool_test, 1), got {tool_keep!r}")
        self.tool_keep = float(tool_keep)
        # a tool's first return in each trajectory, the newest last (`_told_apart`): the tool, and the tokens left in
        # its trajectory after that return (two deques in step: numpy reads each in one pass)
        self._first_tools: deque[str] = deque(maxlen=2 * self.sample)
        self._first_lefts: deque[int] = deque(maxlen=2 * self.sample)
        self._tool_trajs: dict[str, int] = {}  # per tool, the finished trajectories it returned in
        self._trajs = 0  # the finished trajectories observed
        # tools keyed by name; the others are OTHER_TOOL (None: every tool, as with a closed set of tools)
        self._named: set[str] | None = None if self.tools is not None else set()

    @classmethod
    def from_spec(
        cls, spec: str, *, tools: Iterable[str] | None = None, tool_test: float | None = TOOL_TEST
    ) -> QuantileStateCodec:
        """From `METHOD` or `METHOD:CLASSES` (`quantile`, `breaks`; e.g. `quantile:3`), as `PrefixTree`'s
        `size_edges` takes it (`tool_test`: the constructor's)."""
        method, _, k = spec.partition(":")
        if method not in ("quantile", "breaks") or (k and not k.isdigit()):
            raise SpecError(
                f"size_edges must be increasing token counts or 'quantile[:K]' / 'breaks[:K]', got {spec!r}"
            )
        return cls(classes=int(k) if k else 3, method=method, tools=tools, tool_test=tool_test)

    # -- learning ------------------------------------------------------------------------------------------------
    def observe(self, trajectories: Iterable) -> None:
        """Take the tool-return sizes of finished trajectories into the per-tool samples; recompute the edges."""
        by_tool: dict[str, list[int]] = {}
        flat: list[int] = []  # in order, for the pooled sample
        counts, first_tools, first_lefts = self._tool_trajs, self._first_tools, self._first_lefts
        for traj in trajectories:
            self._trajs += 1
            seen: set[str] = set()
            left = traj.total_tokens - traj.prompt_tokens
            for t in traj.turns:
                left -= t.gen_tokens + t.tool_tokens
                tool = t.tool
                if tool is not None:
                    sizes = by_tool.get(tool)
                    if sizes is None:
                        sizes = by_tool[tool] = []
                    sizes.append(t.tool_tokens)
                    flat.append(t.tool_tokens)
                    if tool not in seen:
                        seen.add(tool)
                        counts[tool] = counts.get(tool, 0) + 1
                        first_tools.append(tool)
                        first_lefts.append(left)
        if by_tool:
            recent, pooled = self._recent, self._pooled
            for tool, sizes in by_tool.items():
                q = recent.get(tool)
                if q is None:
                    q = recent[tool] = Sample(self.sample)
                q.extend(sizes)
            pooled.extend(flat[-pooled.maxlen :])
            self._pooled_edges = self._quantiles(pooled)
            for tool, q in recent.items():
                if len(q) >= self.min_samples:
                    if tool in by_tool or tool not in self._edges:
                        self._edges[tool] = self._quantiles(q)
                else:
                    self._edges.pop(tool, None)
        self._name_tools()

    def _name_tools(self) -> None:
        """Key a tool by its name once it returned in at least `tool_share` of the finished trajectories (and in
        two); the others share OTHER_TOOL (module docstring). Past MAX_TOOLS tools counted (names that carry ids
        never repeat), the half seen in the fewest trajectories is forgotten, with its samples and edges: such a
        tool is far from a tenth of the trajectories, and if it comes back it is counted again from there."""
        if self._named is None:
            return
        counts = self._tool_trajs
        if len(counts) > MAX_TOOLS:
            keep = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: MAX_TOOLS // 2])
            for tool in counts.keys() - keep.keys():
                self._recent.pop(tool, None)
                self._edges.pop(tool, None)
            self._tool_trajs = counts = keep
        need = max(2.0, self.tool_share * self._trajs)
        common = {tool for tool, n in counts.items() if n >= need}
        if self.tool_test is not None and common and self._first_tools:
            common = self._told_apart(common, self.tool_test, self.tool_keep)
        self._named = common

    def _told_apart(self, common: set[str], level: float, keep: float) -> set[str]:
        """The tools of `common` whose first returns left a trajectory differently from every other common tool's (a
        two-sample Kolmogorov-Smirnov test on the tokens left, asymptotic critical value, pair by pair; the only
        common tool is compared with all the others' returns together): at `level` for a tool not keyed by its name
        yet, at the looser `keep` for one that is, so that a distance near the threshold does not give and take the
        name (and the tree's branches under it) at alternate step ends. Pair by pair, so that names that split
        several kinds of return alike (`g3/search`, `g3/answer`, ...) are not told apart from their kind's other
        names; a name is used once the data tell it apart, so not while a side has too few returns to. A tool is
        kept where no other tool's return was seen (a name that splits nothing: named as before the test)."""
        named = self._named or set()
        tools = np.array(self._first_tools, dtype=object)
        lefts = np.fromiter(self._first_lefts, float, len(self._first_lefts))
        masks = {tool: tools == tool for tool in common}
        samples = {tool: lefts[mask] for tool, mask in masks.items()}  # (ks_distance sorts)
        distances: dict[frozenset[str], float] = {}
        out = set()
        for tool in common:
            mine, at = samples[tool], keep if tool in named else level
            if not len(mine):
                continue
            rivals = [other for other in common if other != tool]
            if not rivals:  # the only common tool: against every other tool's returns together
                rest = lefts[~masks[tool]]
                if not len(rest) or ks_distance(mine, rest) > ks_critical(len(mine), len(rest), at):
                    out.add(tool)
                continue
            for other in rivals:
                theirs = samples[other]
                if not len(theirs):
                    break
                pair = frozenset((tool, other))
                if pair not in distances:
                    distances[pair] = ks_distance(mine, theirs)
                if distances[pair] <= ks_critical(len(mine), len(theirs), at):
                    break
            else:
                out.add(tool)
        return out

    def tool_key(self, tool: str) -> str:
        """The name a tool's returns are keyed by in the tree: its own while it returns in `tool_share` of the
        finished trajectories, else OTHER_TOOL (module docstring)."""
        named = self._named
        return tool if named is None or tool in named else OTHER_TOOL

    def absorb(self, other: QuantileStateCodec) -> None:
        """Take another codec's samples in as newer than ours (a tree merged from another rollout rank's) and
        recompute the edges, so the next step classifies by every rank's returns, as one codec that observed ours
        then theirs would. A codec loaded from a file keeps its edges but not its samples: where ours has no edges
        of a tool (or no pooled ones) and it has, we take its edges."""
        recent, pooled = self._recent, self._pooled
        self._trajs += other._trajs
        for tool, n in other._tool_trajs.items():
            self._tool_trajs[tool] = self._tool_trajs.get(tool, 0) + n
        self._first_tools.extend(other._first_tools)
        self._first_lefts.extend(other._first_lefts)
        self._name_tools()
        for tool, sizes in other._recent.items():
            q = recent.get(tool)
            if q is None:
                q = recent[tool] = Sample(self.sample)
            q.extend(sizes)
        pooled.extend(other._pooled)
        if other._pooled:
            self._pooled_edges = self._quantiles(pooled)
        elif not self._pooled_edges:
            self._pooled_edges = other._pooled_edges
        for tool, q in recent.items():
            if tool in other._recent:
                if len(q) >= self.min_samples:
                    self._edges[tool] = self._quantiles(q)
                else:
                    self._edges.pop(tool, None)
        for tool, edges in other._edges.items():
            if tool not in self._edges and len(recent.get(tool, ())) < self.min_samples:
                self._edges[tool] = edges

    def _quantiles(self, values: Sample) -> tuple[float, ...]:
        if self.classes == 1 or not values:
            return ()
        qs = np.quantile(values.sizes, np.arange(1, self.classes) / self.classes)
        if self.method == "breaks":
            qs = _natural_breaks(values.logs, qs)
        return tuple(float(e) for e in np.unique(qs))

    # -- classifying ---------------------------------------------------------------------------------------------
    def edges_for(self, tool: str) -> tuple[float, ...]:
        """The edges `tool`'s returns are classed by: its own while it is keyed by name and has `min_samples`
        returns, else the pooled ones."""
        named = self._named
        return self._edges.get(tool, self._pooled_edges) if named is None or tool in named else self._pooled_edges

    def size_class(self, tool_tokens: int, tool: str | None = None) -> int:
        if isinstance(tool_tokens, bool) or not isinstance(tool_tokens, int) or tool_tokens < 0:
            raise SpecError(f"tool_tokens must be a non-negative integer, got {tool_tokens!r}")
        return bisect.bisect_right(self.edges_for(tool) if tool is not None else self._pooled_edges, tool_tokens)

    def encode(self, tool: str, tool_tokens: int, status: str) -> int:
        """The code of one return's state (the router has validated `tool_tokens`; `size_class` validates)."""
        named = self._named
        if named is None or tool in named:
            key = (tool, bisect.bisect_right(self._edges.get(tool, self._pooled_edges), tool_tokens), status)
        else:
            key = (OTHER_TOOL, bisect.bisect_right(self._pooled_edges, tool_tokens), status)
        code = self._codes.get(key)
        return self._intern(key) if code is None else code

    def encode_trajectories(self, trajectories: Iterable, limit: int) -> list[list[int]]:
        codes, edges, pooled, named = self._codes, self._edges, self._pooled_edges, self._named
        size_class = bisect.bisect_right
        paths = []
        for traj in trajectories:
            turns = traj.turns
            out = []
            for t in turns if len(turns) <= limit else turns[:limit]:
                tool = t.tool
                if tool is not None:
                    if named is None or tool in named:
                        key = (tool, size_class(edges.get(tool, pooled), t.tool_tokens), t.tool_status)
                    else:
                        key = (OTHER_TOOL, size_class(pooled, t.tool_tokens), t.tool_status)
                    code = codes.get(key)
                    out.append(self._intern(key) if code is None else code)
            paths.append(out)
        return paths

    def encode_state(self, state: ToolReturnState) -> int:
        return super().encode_state(state)

    # -- serialising ---------------------------------------------------------------------------------------------
    def config(self) -> dict:
        return {
            "size_edges": f"{self.method}:{self.classes}",
            "tools": None if self.tools is None else sorted(self.tools),
        }

    def state(self) -> dict:
        """The learnt edges and the counts that name tools (saved with a tree; the samples behind the edges are
        not)."""
        out: dict = {"edges": {k: list(v) for k, v in self._edges.items()}, "pooled": list(self._pooled_edges)}
        if self._named is not None:
            out["tools"] = {
                "share": self.tool_share,
                "trajectories": self._trajs,
                "returned_in": dict(self._tool_trajs),
                "test": self.tool_test,
                "keep": self.tool_keep,
                "named": sorted(self._named),
                "first_returns": [[t, n] for t, n in zip(self._first_tools, self._first_lefts)],
            }
        return out

    # -- copying: `StateCodec` is a slotted attrs class whose own `__getstate__` knows only its fields, so a pickled
    # or deep-copied codec (and router) lost the learnt edges and samples; they travel with the fields now
    def __getstate__(self) -> tuple[object, dict]:
        return super().__getstate__(), dict(self.__dict__)

    def __setstate__(self, state: tuple[object, dict]) -> None:
        fields, own = state
        super().__setstate__(fields)  # type: ignore[misc]  # (attrs writes it on the slotted base; typeshed's object has none)
        self.__dict__.update(own)
        if "_named" not in own:  # pickled before rare tools were grouped: every tool keyed by its name
            self.tool_share, self._tool_trajs, self._trajs, self._named = 0.1, {}, 0, None
        if "_first_tools" not in own:  # pickled before common tools were tested: named by their share alone
            self.tool_test, self.tool_keep = None, TOOL_KEEP
            self._first_tools, self._first_lefts = deque(maxlen=2 * self.sample), deque(maxlen=2 * self.sample)
        # a codec pickled when its samples were deques of sizes
        if isinstance(self._pooled, deque):
            self._pooled = Sample.of(self._pooled)
            self._recent = {tool: Sample.of(q) for tool, q in self._recent.items()}

    def load_state(self, state: dict) -> None:
        self._edges = {str(k): tuple(float(e) for e in v) for k, v in state.get("edges", {}).items()}
        self._pooled_edges = tuple(float(e) for e in state.get("pooled", ()))
        tools = state.get("tools")
        if tools is None:  # saved before rare tools were grouped: its nodes are keyed by every tool's name
            if self.tools is None:
                self._named = None
            return
        self.tool_share = float(tools["share"])
        self._trajs = int(tools["trajectories"])
        self._tool_trajs = {str(k): int(v) for k, v in tools["returned_in"].items()}
        # saved before common tools were tested: named by their share alone
        test = tools.get("test")
        self.tool_test = None if test is None else float(test)
        self.tool_keep = float(tools.get("keep", TOOL_KEEP))
        self._first_tools.clear()
        self._first_lefts.clear()
        for tool, left in tools.get("first_returns", ()):
            self._first_tools.append(str(tool))
            self._first_lefts.append(int(left))
        if self.tools is None:
            if "named" in tools:  # as saved: which tools keep their names depends on which had them
                self._named = {str(tool) for tool in tools["named"]}
            else:
                self._named = set()
                self._name_tools()


def ks_distance(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical distribution functions of
    `a` and `b` (both non-empty)."""
    x, y = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    at = np.concatenate([x, y])
    gaps = np.searchsorted(x, at, side="right") / len(x) - np.searchsorted(y, at, side="right") / len(y)
    return float(np.abs(gaps).max())


def ks_critical(n: int, m: int, level: float) -> float:
    """The distance past which two samples of sizes `n` and `m` differ at `level` (the asymptotic two-sample
    Kolmogorov-Smirnov bound, c(level) * sqrt((n + m) / (n m)), c = sqrt(-ln(level / 2) / 2))."""
    return math.sqrt(-math.log(level / 2) / 2) * math.sqrt((n + m) / (n * m))


class Sample:
    """The last `maxlen` return sizes of a tool (or of all tools), oldest first, as an array of sizes and one of their
    log1p (`_log1p`, taken once when a size comes in): a step end's edges are numpy passes over these, with no
    conversion of the whole sample from Python ints."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = int(maxlen)
        self.sizes = np.zeros(0)
        self.logs = np.zeros(0)

    @classmethod
    def of(cls, sizes: deque[int]) -> Sample:
        """A sample of a deque's sizes, its `maxlen` the deque's."""
        out = cls(sizes.maxlen or len(sizes))
        out.extend(list(sizes))
        return out

    def extend(self, sizes: Sequence[int] | Sample) -> None:
        """Append `sizes` (newest last), dropping the oldest beyond `maxlen`, as a deque would."""
        if isinstance(sizes, Sample):
            new, logs = sizes.sizes, sizes.logs
        else:
            new = np.array(sizes, float)
            logs = _log1p(new)
        keep = max(0, len(self.sizes) + len(new) - self.maxlen)  # (not `[-maxlen:]`: a maxlen of 0 keeps nothing)
        self.sizes = np.concatenate([self.sizes, new])[keep:]
        self.logs = np.concatenate([self.logs, logs])[keep:]

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[int]:
        return iter(int(x) for x in self.sizes.tolist())


def _natural_breaks(logs: np.ndarray, start: np.ndarray, iterations: int = 30) -> np.ndarray:
    """Edges between the groups of a one-dimensional k-means (Lloyd) of log sizes, started at the quantile edges
    `start` (tokens): where a workload's returns form clusters (short, medium, long answers), the edges fall in the
    gaps between them rather than inside a cluster. Returned in token units; `start` itself when a group is empty
    (too few distinct sizes to cluster)."""
    edges = _log1p(np.sort(start))
    for _ in range(iterations):
        groups = np.searchsorted(edges, logs, side="right")
        counts = np.bincount(groups, minlength=len(edges) + 1)
        if (counts == 0).any():
            return start
        centers = np.bincount(groups, weights=logs, minlength=len(edges) + 1) / counts
        new = (centers[:-1] + centers[1:]) / 2
        if np.allclose(new, edges):
            break
        edges = new
    return np.array([math.expm1(e) for e in edges.tolist()])


def _log1p(x: np.ndarray) -> np.ndarray:
    """`log1p` of each element by the C library's scalar function, not numpy's: numpy computes it with SIMD code
    chosen by the CPU (AVX-512 machines take another implementation), whose last bits differ from machine to machine,
    and the edges decide how returns are classed, so learnt trees and decisions would depend on the CPU. Computed
    once per distinct size (sizes are token counts: few distinct values)."""
    values, inverse = np.unique(x, return_inverse=True)
    return np.array([math.log1p(v) for v in values.tolist()])[inverse]
