"""A fake token server for verl's LLMServerClient (a fake is for what cannot run here: verl's vLLM server needs a
GPU build of vLLM). It speaks the server side of verl's protocol (`generate`, `get_rollout_config`) and answers from
a script in the prompt: the user message lists the tool calls the trajectory makes, e.g.
`[traj 7] calls: search:40 calc:1/0 slow:5`; turn k emits the k-th call in hermes format, then a final answer
(`fail:1` makes the server raise at that turn instead).

Imports no verl: it runs in Ray worker processes, and every process that imports verl costs 10-25 s here.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTokenOutput:
    """The fields verl's agent loop reads from a server's TokenOutput."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str = "completed"
    num_preempted: int = 0
    extra_fields: dict[str, Any] = field(default_factory=dict)


class FakeTokenServer:
    def __init__(self, name: str, rollout_config: dict[str, Any], tokenizer_dir: str, delay_s: float = 0.02) -> None:
        from pathlib import Path

        from tokenizers import Tokenizer  # not transformers: a lighter import for each Ray worker

        self.name = name
        self.rollout_config = rollout_config
        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    def get_rollout_config(self) -> dict[str, Any]:
        return self.rollout_config

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        traj = re.search(r"\[traj (\d+)\]", text)
        script = re.search(r"calls:((?: [a-z]+:[0-9/.]+)*)", text)
        calls = script.group(1).split() if script else []
        turn = text.count("tool:")  # the chat template writes each tool message as "tool: ..."
        self.calls.append(
            {
                "t": time.monotonic(),
                "traj": int(traj.group(1)) if traj else -1,
                "turn": turn,
                "context": len(prompt_ids),
            }
        )
        await asyncio.sleep(self.delay_s)
        if turn < len(calls):
            tool, _, arg = calls[turn].partition(":")
            if tool == "fail":  # the server fails this turn: the trajectory's agent loop raises
                raise RuntimeError(f"{self.name}: scripted failure of trajectory {traj.group(1) if traj else '?'}")
            args = {"query": arg} if tool == "search" else {"expr": arg} if tool == "calc" else {"seconds": float(arg)}
            reply = "<tool_call>" + json.dumps({"name": tool, "arguments": args}) + "</tool_call>"
        else:
            reply = "the answer is forty two"
        return FakeTokenOutput(token_ids=self.tokenizer.encode(reply, add_special_tokens=False).ids)

    def stats(self) -> list[dict[str, Any]]:
        return list(self.calls)
