"""Toy tools for the tiny RL loop: a calculator that sometimes errors and a search over a local text file.

The policy is a random tiny model, so its "tool calls" are read from its tokens by a fixed rule: turn 0 searches
with the decoded text of the turn, later turns call the calculator on the turn's last two token ids. The tools are
real functions with real outputs (tokenized back into the context) and real failures.
"""

from __future__ import annotations

from pathlib import Path

from libra.adapters.routing import ToolReturn

CORPUS = Path(__file__).parent / "data" / "corpus.txt"


class Calculator:
    """`a / (b % 5)`: fails with a division-by-zero error when `b % 5 == 0` (about one call in five)."""

    def __call__(self, a: int, b: int) -> tuple[str, str]:
        try:
            return "ok", f"calculator: {a} / {b % 5} = {a / (b % 5):.2f}"
        except ZeroDivisionError:
            return "error", "calculator error: division by zero, retry with a fix"


class Search:
    """Returns the corpus lines sharing the most words with the query (ties in file order), up to `top_k`."""

    def __init__(self, path: Path = CORPUS, top_k: int = 2) -> None:
        self.lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        self.top_k = top_k

    def __call__(self, query: str) -> tuple[str, str]:
        words = set(query.lower().split())
        scored = sorted(self.lines, key=lambda line: -len(words & set(line.split())))
        hits = [line for line in scored[: self.top_k] if words & set(line.split())]
        return ("ok", " | ".join(hits)) if hits else ("error", "search: no document matches")


class ToyAgent:
    """The tool function of `RoutedRollout.run`: turn 0 -> search, later turns -> calculator; ends after a
    calculator success or at the turn limit. Records each call as (request id, tool, status, text)."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.calc, self.search = tokenizer, Calculator(), Search()
        self.calls: list[tuple[str, str, str, str]] = []
        self.results: dict[str, float] = {}
        self.errors: dict[str, int] = {}

    def __call__(self, request_id: str, turn_ids: tuple[int, ...], turn_index: int) -> ToolReturn | None:
        if (
            turn_index > 0
            and self.calls
            and any(c[0] == request_id and c[1] == "calculator" and c[2] == "ok" for c in self.calls)
        ):
            return None  # the calculator answered: the trajectory ends
        if turn_index == 0:
            tool, (status, text) = "search", self.search(self.tok.decode(list(turn_ids)))
        else:
            tool, (status, text) = "calculator", self.calc(turn_ids[-2], turn_ids[-1])
        self.calls.append((request_id, tool, status, text))
        if tool == "calculator" and status == "ok":
            self.results[request_id] = float(text.rsplit("=", 1)[1])
        if status == "error":
            self.errors[request_id] = self.errors.get(request_id, 0) + 1
        ids = tuple(self.tok.encode(" " + text, add_special_tokens=False))
        return ToolReturn(tool=tool, status=status, output_token_ids=ids)

    def reward(self, request_id: str) -> float:
        """Toy reward: 0 without a calculator answer; else 1 / (1 + tool errors) plus a small term that grows with
        the answer (so that samples of one prompt differ and GRPO's advantages are not all zero)."""
        if request_id not in self.results:
            return 0.0
        return 1.0 / (1 + self.errors.get(request_id, 0)) + min(self.results[request_id], 300.0) / 1000.0
