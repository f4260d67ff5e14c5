"""verl function tools for the agent-loop tests (loaded by verl from `multi_turn.function_tool_path`)."""

import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def search(query: str) -> str:
    """Search a corpus.

    Args:
        query: how many words of results to return
    """
    return " ".join(["doc"] * int(query))


@function_tool
def calc(expr: str) -> str:
    """Evaluate a division.

    Args:
        expr: a division such as 6/3
    """
    a, b = expr.split("/")
    return str(int(a) / int(b))  # 1/0 raises: verl turns it into an error text


@function_tool
async def slow(seconds: float) -> str:
    """Wait, then answer.

    Args:
        seconds: how long to wait
    """
    await asyncio.sleep(seconds)
    return "done"
