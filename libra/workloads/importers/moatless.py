"""Moatless Tools trajectories (`trajectory.json`), rewritten into one Anthropic-style conversation for the `openai`
importer (openai_chat.py reads the raw file; `libra trace import --format openai trajectory.json`).

Moatless (aorwall/moatless-tools) saves a run as its agent's `system_prompt` and a tree of `nodes`, each a step whose
`completions.build_action` records the model call that chose the step's action: the `input` messages, as Anthropic
content blocks, and the raw `response`. Moatless renders the history again for every call, older observations as
summaries, so each call's own input is what the model read; the trajectory keeps, per call, the tool result that
call's input ends with. A call whose input is the task alone after the first (the step before it recorded no
observation) starts the context again, which one trajectory cannot hold: `record` refuses it (ValueError).
"""

from __future__ import annotations

import json
from typing import Any


def is_trajectory(value: Any) -> bool:
    """Whether a JSON value is a Moatless trajectory: `nodes` of steps, some with `completions.build_action`, and
    the agent's `system_prompt`."""
    if not isinstance(value, dict) or not isinstance(value.get("nodes"), list):
        return False
    agent = value.get("agent")
    if not isinstance(agent, dict) or not isinstance(agent.get("system_prompt"), str):
        return False
    return any(isinstance(n, dict) and "build_action" in (n.get("completions") or {}) for n in value["nodes"])


def _blocks(content: Any) -> Any:
    """A message's content as the model got or wrote it: Anthropic content blocks without the prompt-cache
    markers (`cache_control`, not text), or a plain text as it is."""
    if isinstance(content, list):
        return [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
    return content


def _retries(messages: list[dict]) -> list[dict]:
    """The replies Moatless asked the model again for within one call (a reply without a tool call, answered with
    a plain-text user message such as `You're an autonomous agent that can't communicate with the user. Please
    provide a tool call.`): the trailing (assistant, user text) pairs of the call's input, in order."""
    pairs: list[dict] = []
    end = len(messages)
    while end >= 2 and messages[end - 1]["role"] == "user" and isinstance(messages[end - 1]["content"], str):
        if messages[end - 2]["role"] != "assistant":
            break
        pairs[:0] = [
            {"role": "assistant", "content": _blocks(messages[end - 2]["content"])},
            {"role": "user", "content": messages[end - 1]["content"]},
        ]
        end -= 2
    return pairs


def _result(messages: list[dict], retries: int) -> dict:
    """The tool result a call's input ends with before its retries: the return of the call before it, as it was
    sent (Moatless renders the history again for every call, older observations as summaries: this one is the
    text the model read next)."""
    if len(messages) - retries == 1:
        raise ValueError(
            "a call started again from the task alone (the step before it recorded no observation): "
            "a context the trace cannot hold"
        )
    last = messages[len(messages) - retries - 1]
    blocks = [b for b in last["content"] if b.get("type") == "tool_result"] if isinstance(last["content"], list) else []
    if last["role"] != "user" or len(blocks) != 1:
        raise ValueError(f"a call's input does not end with one tool result: {json.dumps(last)[:200]}")
    return blocks[0]


def record(run: dict) -> dict:
    """A Moatless Tools trajectory (`trajectory.json`: the agent's `system_prompt`, then `nodes`, each a step whose
    `completions.build_action` records the model call that chose its action: the `input` messages, Anthropic
    content blocks, and the raw `response`) as one Anthropic-style conversation for `--format openai`: the
    system prompt and the task (the first call's first message) are the prompt; per call, the replies it was
    asked for again (`_retries`: each a generation, the harness's plain text its return), then its
    response (text and one tool call) as a generation, then that tool's result as the next call's input holds it
    (`_result`), an error where the step's observation records a `fail_reason`. The result of the last
    call's action (`Finish`, or the step at the iteration limit) goes to no model and is dropped. The model calls
    inside an action (`completions.execute_action`: a search's relevance filter, with a context of its own) are
    not part of the conversation and are not counted."""
    steps = [n for n in run["nodes"] if "build_action" in (n.get("completions") or {})]
    calls = [n["completions"]["build_action"] for n in steps]
    messages: list[dict] = [{"role": "user", "content": _blocks(calls[0]["input"][0]["content"])}]
    for i, call in enumerate(calls):
        retries = _retries(call["input"])
        if i:
            result = _result(call["input"], len(retries))
            (use,) = [b for b in messages[-1]["content"] if b.get("type") == "tool_use"]
            block = {"type": "tool_result", "tool_use_id": use["id"], "content": result["content"]}
            if ((steps[i - 1].get("observation") or {}).get("properties") or {}).get("fail_reason"):
                block["is_error"] = True
            messages.append({"role": "user", "content": [block]})
        messages.extend(retries)
        messages.append({"role": "assistant", "content": _blocks(call["response"]["content"])})
    meta = run.get("metadata") or {}
    return {"id": meta.get("instance_id"), "system": run["agent"]["system_prompt"], "messages": messages}
