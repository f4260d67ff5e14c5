"""Tool-return states: `(tool, size_class, status)` for one tool return, and their compact integer codes.

The size class of a tool return is the index of the first edge its token count is below: with the default edges
`(500, 5000)` a return of 120 tokens is class 0, 1,800 is class 1 and 12,000 is class 2. A prefix tree keys its
children by state codes (small ints) so that a lookup hashes an int, not a tuple of strings.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from libra.spec import SpecError, checks
from libra.workloads.trace import TOOL_STATUSES

DEFAULT_SIZE_EDGES: tuple[int, ...] = (500, 5000)


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    """The edges as a tuple, numpy numbers as Python ones (the codec's state is written as JSON)."""
    return tuple(_plain(v) for v in values)


def _plain(value: Any) -> Any:
    if type(value) is int or type(value) is float or not checks.is_real(value):
        return value  # (anything but a number is kept for the validator to name)
    return int(value) if checks.is_whole(value) else checks.as_float(value)


def _tool_set(values: Iterable[str] | None) -> frozenset[str] | None:
    """The closed tool set, or None. A single string is refused (it would become the set of its letters)."""
    if values is None:
        return None
    tools = () if isinstance(values, str) else tuple(values)
    if isinstance(values, str) or not all(isinstance(tool, str) and tool for tool in tools):
        raise SpecError(f"tools must be a collection of tool names (non-empty strings) or None, got {values!r}")
    return frozenset(tools)


def _check_edges(instance: object, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if not all(checks.as_float(e) > 0 for e in value):  # NaN (as_float of a bool or a string too) is no edge
        raise SpecError(f"size-class edges must be positive numbers, got {value!r}")
    if any(b <= a for a, b in zip(value, value[1:])):
        raise SpecError(f"size-class edges must increase strictly, got {value!r}")


@attrs.frozen
class ToolReturnState:
    """One tool return as the router sees it: which tool, how big its payload is (a size class) and how it ended
    (`ok`, `error` or `timeout`)."""

    tool: str
    size_class: int
    status: str

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise SpecError(f"ToolReturnState.tool must be a non-empty string, got {self.tool!r}")
        checks.whole("ToolReturnState", "size_class", self.size_class, 0)
        if self.status not in TOOL_STATUSES:
            raise SpecError(f"ToolReturnState.status must be one of {', '.join(TOOL_STATUSES)}, got {self.status!r}")

    def key(self) -> str:
        """Portable text form `tool|size_class|status`, used when trees are serialised and merged."""
        return f"{self.tool}|{self.size_class}|{self.status}"

    @classmethod
    def from_key(cls, text: str) -> ToolReturnState:
        tool, sep, rest = text.rpartition("|")
        tool, sep2, size = tool.rpartition("|")
        if not sep or not sep2:
            raise SpecError(f"tool-return state {text!r} is not 'tool|size_class|status'")
        try:
            size_class = int(size)
        except ValueError:
            raise SpecError(f"tool-return state {text!r}: size class must be an integer") from None
        return cls(tool, size_class, rest)


@attrs.define
class StateCodec:
    """Classifies tool returns into states and interns each state as a small int code.

    `tools`: when given, the closed set of tool names; any other tool raises SpecError (catches typos and traces of
    another workload). When None, any tool name is accepted and gets a code on first sight.
    """

    size_edges: tuple[int, ...] = attrs.field(default=DEFAULT_SIZE_EDGES, converter=_int_tuple, validator=_check_edges)
    tools: frozenset[str] | None = attrs.field(default=None, converter=_tool_set)
    _codes: dict[tuple[str, int, str], int] = attrs.field(factory=dict, init=False)
    _states: list[ToolReturnState] = attrs.field(factory=list, init=False)

    def size_class(self, tool_tokens: int) -> int:
        if not (checks.is_whole(tool_tokens) and tool_tokens >= 0):
            raise SpecError(f"tool_tokens must be a non-negative integer, got {tool_tokens!r}")
        return bisect.bisect_right(self.size_edges, tool_tokens)

    def encode(self, tool: str, tool_tokens: int, status: str) -> int:
        """The code of the state of one tool return; validates the tool and the status on first sight."""
        # (a plain non-negative int, as the router passes it, is classified without `size_class`'s checks)
        size = (
            bisect.bisect_right(self.size_edges, tool_tokens)
            if type(tool_tokens) is int and tool_tokens >= 0
            else self.size_class(tool_tokens)
        )
        key = (tool, size, status)
        code = self._codes.get(key)
        if code is None:
            code = self._intern(key)
        return code

    def _intern(self, key: tuple[str, int, str]) -> int:
        tool = key[0]
        if self.tools is not None and tool not in self.tools:
            raise SpecError(f"unknown tool {tool!r}; this router knows {', '.join(sorted(self.tools))}")
        state = ToolReturnState(*key)  # validates
        code = len(self._states)
        self._codes[key] = code
        self._states.append(state)
        return code

    def encode_turns(self, turns: Sequence, limit: int) -> list[int]:
        """Codes of the first `limit` tool returns of a trajectory's turns (validated `Turn` values: integer token
        counts)."""
        return self.encode_trajectories([_Turns(turns)], limit)[0]

    def encode_trajectories(self, trajectories: Iterable, limit: int) -> list[list[int]]:
        """`encode_turns(traj.turns, limit)` of each trajectory, the fast path of a step-end tree update: one call
        for the batch (a call per trajectory costs about as much as classifying its returns)."""
        codes = self._codes
        edges = self.size_edges
        size_class = bisect.bisect_right
        paths = []
        for traj in trajectories:
            turns = traj.turns
            out = []
            for t in turns if len(turns) <= limit else turns[:limit]:
                tool = t.tool
                if tool is not None:
                    key = (tool, size_class(edges, t.tool_tokens), t.tool_status)
                    code = codes.get(key)
                    out.append(self._intern(key) if code is None else code)
            paths.append(out)
        return paths

    def encode_state(self, state: ToolReturnState) -> int:
        key = (state.tool, state.size_class, state.status)
        code = self._codes.get(key)
        return self._intern(key) if code is None else code

    def decode(self, code: int) -> ToolReturnState:
        return self._states[code]

    def encode_path(self, returns: Iterable[tuple[str, int, str]]) -> tuple[int, ...]:
        """Codes of `(tool, tool_tokens, status)` returns in order."""
        return tuple(self.encode(t, n, s) for t, n, s in returns)

    def config(self) -> dict:
        return {"size_edges": list(self.size_edges), "tools": None if self.tools is None else sorted(self.tools)}


@attrs.frozen
class _Turns:
    """A trajectory as `encode_trajectories` reads it: its turns only (for `encode_turns`)."""

    turns: Sequence


def trajectory_returns(turns: Sequence) -> list[tuple[str, int, str]]:
    """`(tool, tool_tokens, status)` of every tool turn of a trajectory, in order."""
    return [(t.tool, t.tool_tokens, t.tool_status) for t in turns if t.tool is not None]
