"""Tool results written inline in a model's text, split out: the rollouts of models trained to call tools in their
own text, logged as one response string with each result inside it.

An assistant message whose text holds one of these result blocks is rewritten as generations and `tool` messages,
the text before each block (the call included) a generation, the block's inside the tool's result:

- `<information>` ... `</information>`: Search-R1 and the agents trained on its template (ZeroSearch, ...); tool
  `search`;
- `<|begin_search_result|>` ... `<|end_search_result|>`: Search-o1, WebThinker; `search`;
- `<|begin_of_documents|>` ... `<|end_of_documents|>`: R1-Searcher; `search`;
- `<interpreter>` ... `</interpreter>`: ReTool; `python`;
- a fenced `output` block: ToRA (tool-integrated reasoning); `python`;
- `<tool_response>` ... `</tool_response>`: Hermes / Qwen tool templates decoded to text (verl's rollout dumps);
  the name in the `<tool_call>` before it, else `tool`;
- `<result>` ... `</result>`, only right after a call (`</search>`: ReSearch, `search`; `</tool_call>`: ReCall, the
  call's name; `</code>` or `</python>`: `python`), a tag too common to split on anywhere else.

A block must be closed: an opening marker without its closing one (a rollout cut at its length limit) is left in
the generation. The markers are not counted (a few tokens a return; the status is read from the result's own
first and last lines); nor, with a Hermes template decoded without its special tokens, are the role words left
around a result (`user` or `tool` before it, `assistant` after it). Only assistant text is split: a prompt that
shows the template (Search-R1's instruction names `<information>`) is the prompt.

Such rollouts are often dumped as a prompt and a response in text (`text_records`): verl's `rollout_data_dir`
files (`input`, `output`, `score`, `step`), generation outputs (`prompt` as text or messages; `response`,
`completion`, or a list of `responses`, one per sample). Each becomes a message record, the prompt a user message
(or its own messages), the response an assistant message; `score` is the reward where no `reward` is given, `step`
the RL step; a record without an id is named by a digest of its prompt, so that the samples of one prompt share
their prompt id, as the rollouts of one step's group do.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from libra.spec import checks

# (opening marker, closing marker, tool name or None: named by the call before it)
_BLOCKS: tuple[tuple[str, str, str | None], ...] = (
    ("<information>", "</information>", "search"),
    ("<|begin_search_result|>", "<|end_search_result|>", "search"),
    ("<|begin_of_documents|>", "<|end_of_documents|>", "search"),
    ("<interpreter>", "</interpreter>", "python"),
    ("```output\n", "```", "python"),
    ("<tool_response>", "</tool_response>", None),
    ("<result>", "</result>", None),  # only right after a call (_GUARDED)
)
_HERMES = "<tool_response>"
# a block this common a tag opens counts only right after one of these calls, and the call names its tool
_GUARDED = {"<result>": {"</search>": "search", "</tool_call>": None, "</code>": "python", "</python>": "python"}}
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
# the role word a decoded Hermes template leaves on its own line before a result, and after it
_ROLE_BEFORE = re.compile(r"(?:^|\n)(?:user|tool)\s*$")
_ROLE_AFTER = re.compile(r"\s*assistant\b\n?")  # (matched where the result ends)


def has_inline_results(text: str) -> bool:
    """Whether `text` holds an opening marker of a result block (what `split` then looks at closely)."""
    return any(opening in text for opening, _, _ in _BLOCKS)


def split(message: dict) -> list[dict] | None:
    """An assistant message with result blocks in its text as assistant and `tool` messages (module docstring);
    None when its text holds no closed block. The message's other fields (id, reasoning) go with the first
    generation, its tool calls with the last."""
    text = message.get("content")
    if not isinstance(text, str) or not has_inline_results(text):
        return None
    out: list[dict] = []
    pos = 0
    ahead: dict[int, int] = {}  # each kind's next opening at or after pos (-1: none): the text is read once a kind
    while True:
        found = _next_block(text, pos, ahead)
        if found is None:
            break
        start, inner, end, tool = found
        before = text[pos:start]
        name = tool or _called(before)
        if text.startswith(_HERMES, start):  # the role words of a decoded chat template, not counted
            role = _ROLE_BEFORE.search(before)
            before = before[: role.start()] if role else before
            after = _ROLE_AFTER.match(text, end)
            end = after.end() if after else end
        out.append({"role": "assistant", "content": before})
        out.append({"role": "tool", "name": name, "content": inner})
        pos = end
    if not out:
        return None
    rest = text[pos:]
    if rest.strip() or message.get("tool_calls"):
        out.append({"role": "assistant", "content": rest})
    if message.get("tool_calls"):
        out[-1]["tool_calls"] = message["tool_calls"]
    others = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
    out[0] = {**others, **out[0]}  # its id, reasoning and the like go with the first generation
    return out


def _next_block(text: str, pos: int, ahead: dict[int, int]) -> tuple[int, str, int, str | None] | None:
    """The first closed result block at or after `pos`: (its start, its inside, its end, its tool); `ahead` keeps
    where each kind opens next, found again only once `pos` has passed it."""
    best: tuple[int, str, int, str | None] | None = None
    for kind, (opening, closing, tool) in enumerate(_BLOCKS):
        start = ahead.get(kind)
        if start is None or pos > start != -1:  # not looked for yet, or passed
            start = ahead[kind] = _opening(text, opening, pos)
        if start == -1 or (best is not None and start >= best[0]):
            continue
        if tool is None and opening in _GUARDED:
            tool = _GUARDED[opening].get(_call_before(text, start, _GUARDED[opening]) or "")
        close = text.find(closing, start + len(opening))
        if close == -1:  # opened and never closed: no block of this kind from here on
            ahead[kind] = -1
            continue
        best = (start, text[start + len(opening) : close], close + len(closing), tool)
    return best


def _opening(text: str, opening: str, pos: int) -> int:
    """Where `opening` is next at or after `pos` (-1: nowhere); a guarded one only right after its calls."""
    start = text.find(opening, pos)
    calls = _GUARDED.get(opening)
    while calls is not None and start != -1 and _call_before(text, start, calls) is None:
        start = text.find(opening, start + 1)
    return start


def _call_before(text: str, start: int, calls: dict[str, str | None]) -> str | None:
    """The call closing in `calls` that `text` ends with before `start` (whitespace aside), else None."""
    head = text[max(0, start - 64) : start].rstrip()
    return next((c for c in calls if head.endswith(c)), None)


def _called(before: str) -> str:
    """The name of the last `<tool_call>` in `before` (Hermes: a JSON object with `name`), else `tool`."""
    calls = _CALL.findall(before)
    if calls:
        try:
            value: Any = json.loads(calls[-1])
        except (json.JSONDecodeError, RecursionError):
            value = None
        name = value.get("name") if isinstance(value, dict) else None
        if isinstance(name, str) and name:
            return name[:64]
    return "tool"


_PROMPT_TEXT = ("input", "prompt")
_RESPONSE_TEXT = ("output", "response", "completion")
STEP = "_libra_step"  # the key under which a text record's RL step is handed on (the importer reads it)


def text_records(value: dict, id_keys: tuple[str, ...]) -> list[dict] | None:
    """A record of a prompt and its response(s) as text as message records (module docstring), else None.
    `id_keys`: the fields that name a prompt, where the record has one."""
    keys = _pair_keys(value)
    if keys is None:
        return None
    pkey, rkey = keys
    texts = value[rkey] if rkey == "responses" else [value[rkey]]
    prompt = value[pkey]
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    rest = {k: v for k, v in value.items() if k not in (pkey, rkey)}
    if not any(isinstance(rest.get(k), str | int) and rest.get(k) != "" for k in id_keys):
        digest = hashlib.sha1(json.dumps(prompt, sort_keys=True).encode(), usedforsecurity=False).hexdigest()
        rest["prompt_id"] = f"prompt-{digest[:12]}"
    if rest.get("reward") is None and checks.is_real(rest.get("score")):
        rest["reward"] = rest.pop("score")
    if checks.is_whole(rest.get("step")) and rest["step"] >= 0:
        rest[STEP] = rest.pop("step")
    many = len(texts) > 1
    return [
        {**rest, "messages": [*head, {"role": "assistant", "content": t}], **({"sample": i} if many else {})}
        for i, t in enumerate(texts)
    ]


def is_text_record(value: Any) -> bool:
    """Whether `value` is a record of a prompt and its response(s) as text (`text_records` reads it)."""
    return isinstance(value, dict) and _pair_keys(value) is not None


def _pair_keys(value: dict) -> tuple[str, str] | None:
    """The keys of a text record's prompt and response(s), else None."""
    pkey = next((k for k in _PROMPT_TEXT if isinstance(value.get(k), str) or _messages(value.get(k))), None)
    if pkey is None:
        return None
    rkey = next((k for k in _RESPONSE_TEXT if isinstance(value.get(k), str)), None)
    if rkey is not None:
        return pkey, rkey
    listed = value.get("responses")
    if isinstance(listed, list) and listed and all(isinstance(r, str) for r in listed):
        return pkey, "responses"
    return None


def _messages(value: Any) -> bool:
    """Whether `value` is a prompt given as chat messages (a list of objects with a role)."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)
