"""The agent of the embedded run: prompt -> multi-turn trajectory with real tools, and its reward.

An agent is built per RL step (`make_agent(step, tokenizer)`) and gives the rollout loop its tool function
(`tool(request_id, turn_token_ids, turn_index) -> ToolReturn | None`, None ends the trajectory) and the reward of
each finished trajectory. The default `ToolAgent` reads its tool calls from the tokens by a fixed rule (the tiny
policy is random): turn 0 searches a small corpus with the decoded turn, later turns call a calculator on the
turn's last two token ids, which fails about one call in five. From `shift.from_step` on, tool outputs are
repeated `tool_growth` times: the workload drifts to longer contexts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from libra.adapters.routing import ToolReturn
from libra.runtime.config import WorkloadShift

CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "search returned three documents about the topic",
    "python raised an error, retrying with a fix",
    "the answer is forty two",
    "calculator: 12 + 30 = 42",
    "the tool output was ok after a timeout and an error",
)


class Agent(Protocol):
    def tool(self, request_id: str, turn_token_ids: tuple[int, ...], turn_index: int) -> ToolReturn | None: ...

    def reward(self, request_id: str) -> float: ...


AgentFactory = Callable[[int, Any], Agent]
"""`make_agent(step, tokenizer) -> Agent`."""


def calculator(a: int, b: int) -> tuple[str, str]:
    """`a / (b % 5)`: a division-by-zero error when `b % 5 == 0`."""
    try:
        return "ok", f"calculator: {a} / {b % 5} = {a / (b % 5):.2f}"
    except ZeroDivisionError:
        return "error", "calculator error: division by zero, retry with a fix"


def search(query: str, top_k: int = 2) -> tuple[str, str]:
    """The corpus lines sharing the most words with the query (ties in corpus order)."""
    words = set(query.lower().split())
    scored = sorted(CORPUS, key=lambda line: -len(words & set(line.split())))
    hits = [line for line in scored[:top_k] if words & set(line.split())]
    return ("ok", " | ".join(hits)) if hits else ("error", "search: no document matches")


class ToolAgent:
    """Search on turn 0, calculator afterwards; a trajectory ends after a calculator success. Reward: 0 without an
    answer, else 1 / (1 + tool errors) plus a small term that grows with the answer (samples of one prompt differ,
    so GRPO's advantages are not all zero)."""

    def __init__(self, tokenizer: Any, *, step: int, shift: WorkloadShift | None = None) -> None:
        self.tok, self.step = tokenizer, step
        shifted = shift is not None and step >= shift.from_step
        self.growth = shift.tool_growth if shifted and shift is not None else 1
        self.max_tool_tokens = shift.max_tool_tokens if shift is not None else 160
        self.answered: dict[str, float] = {}
        self.errors: dict[str, int] = {}

    def tool(self, request_id: str, turn_token_ids: tuple[int, ...], turn_index: int) -> ToolReturn | None:
        if request_id in self.answered:
            return None
        if turn_index == 0:
            name, (status, text) = "search", search(self.tok.decode(list(turn_token_ids)))
        else:
            ids = list(turn_token_ids) or [0, 0]
            name, (status, text) = "calculator", calculator(ids[-2] if len(ids) > 1 else 0, ids[-1])
        if name == "calculator" and status == "ok":
            self.answered[request_id] = float(text.rsplit("=", 1)[1])
        if status == "error":
            self.errors[request_id] = self.errors.get(request_id, 0) + 1
        out = tuple(self.tok.encode(" " + " ; ".join([text] * self.growth), add_special_tokens=False))
        return ToolReturn(tool=name, status=status, output_token_ids=out[: self.max_tool_tokens])

    def reward(self, request_id: str) -> float:
        if request_id not in self.answered:
            return 0.0
        return 1.0 / (1 + self.errors.get(request_id, 0)) + min(self.answered[request_id], 300.0) / 1000.0


def default_agent_factory(shift: WorkloadShift | None) -> AgentFactory:
    return lambda step, tokenizer: ToolAgent(tokenizer, step=step, shift=shift)
