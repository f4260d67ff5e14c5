"""Rollouts whose tool results are inline in the model's text (Search-R1, Search-o1, R1-Searcher, ReTool, ToRA,
Hermes templates decoded to text), and the dumps that hold them as a prompt and a response in text (verl's
`rollout_data_dir`, generation outputs): split into generations and tool returns, as the same run written as chat
messages gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libra.workloads.importers import import_files
from libra.workloads.importers.inline_tools import split

B4 = "bytes4"
PROMPT = (
    "Answer the given question. You can call a search engine by <search> query </search> and it will return the "
    "top searched results between <information> and </information>. Question: who was the first saint of India?"
)
SEARCHES = (
    "<think>I need to search.</think>\n<search>first Indian woman saint</search>\n\n"
    '<information>Doc 1(Title: "Saint Alphonsa") was the first woman of Indian origin to be canonized.\n'
    "Doc 2(Title: Kerala) a state of India</information>\n\n<think>Once more.</think>\n<search>Alphonsa</search>\n"
    "<information>Doc 1(Title: Alphonsa) canonized in 2008</information>\n<answer>Saint Alphonsa</answer>"
)


def _write(tmp_path, name: str, records: list[dict]) -> list:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return import_files("openai", [path], tokenizer=B4)


def _as_messages(text: str, cuts: list[tuple[str, str, str]], tool: str) -> list[dict]:
    """`text` written as chat messages by hand: `cuts` are (opening, inside, closing) of each result block."""
    messages, rest = [], text
    for opening, inside, closing in cuts:
        before, _, rest = rest.partition(opening + inside + closing)
        messages += [{"role": "assistant", "content": before}, {"role": "tool", "name": tool, "content": inside}]
    return [*messages, {"role": "assistant", "content": rest}] if rest.strip() else messages


def test_a_verl_rollout_dump_of_search_r1_is_its_turns(tmp_path) -> None:
    """verl's rollout_data_dir lines (input, output, score, step): each search result a return of tool `search`,
    the samples of one prompt under one prompt id, the score the reward, the step the RL step; the same turns as
    the run written as chat messages, and the prompt, which names the template, not split."""
    other = SEARCHES.replace("Alphonsa</answer>", "Teresa</answer>")
    dump = [
        {"input": PROMPT, "output": SEARCHES, "gts": "Alphonsa", "score": 1.0, "step": 7},
        {"input": PROMPT, "output": other, "gts": "Alphonsa", "score": 0.0, "step": 7},
        {"input": PROMPT + " (2)", "output": "<answer>no idea</answer>", "gts": "x", "score": 0.0, "step": 7},
    ]
    first, second, third = _write(tmp_path, "7.jsonl", dump)
    assert first.prompt_id == second.prompt_id != third.prompt_id and first.prompt_id.startswith("prompt-")
    assert (first.step, first.reward, second.reward, first.extra["meta"]) == (7, 1.0, 0.0, {"gts": "Alphonsa"})
    assert [t.tool for t in first.turns] == ["search", "search", None] and len(third.turns) == 1
    blocks = [
        ("<information>", x.split("</information>")[0], "</information>") for x in SEARCHES.split("<information>")[1:]
    ]
    by_hand = {
        "id": first.prompt_id,
        "messages": [{"role": "user", "content": PROMPT}, *_as_messages(SEARCHES, blocks, "search")],
    }
    (same,) = _write(tmp_path, "by-hand.jsonl", [by_hand])
    assert same.turns == first.turns and same.prompt_tokens == first.prompt_tokens


@pytest.mark.parametrize(
    ("text", "tool", "inside"),
    [
        (
            "<|begin_search_query|>q<|end_search_query|><|begin_search_result|>r r<|end_search_result|>ok",
            "search",
            "r r",
        ),
        ("<|begin_of_query|>q<|end_of_query|><|begin_of_documents|>d d<|end_of_documents|>ok", "search", "d d"),
        ("<code>print(1)</code><interpreter>1</interpreter>ok", "python", "1"),
        ("```python\nprint(1)\n```\n```output\n1\n```\nok", "python", "1\n"),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\n<tool_response>sun</tool_response>ok',
            "get_weather",
            "sun",
        ),
        ("<tool_call>not json</tool_call><tool_response>x</tool_response>ok", "tool", "x"),
        ("<think>t</think><search>q</search>\n<result>d d</result>ok", "search", "d d"),
        ('<tool_call>{"name": "calc"}</tool_call> <result>4</result>ok', "calc", "4"),
        ("<code>print(1)</code><result>1</result>ok", "python", "1"),
    ],
    ids=["search-o1", "r1-searcher", "retool", "tora", "hermes", "hermes-unnamed", "research", "recall", "code"],
)
def test_each_kind_of_block_is_a_return_of_its_tool(text, tool, inside) -> None:
    parts = split({"role": "assistant", "content": text})
    assert parts is not None and [p["role"] for p in parts] == ["assistant", "tool", "assistant"]
    assert (parts[1]["name"], parts[1]["content"], parts[2]["content"].strip()) == (tool, inside, "ok")


def test_a_decoded_hermes_template_leaves_its_role_words_with_the_result() -> None:
    text = '<tool_call>\n{"name": "f"}\n</tool_call>\nuser\n<tool_response>\nr\n</tool_response>\nassistant\nthen'
    parts = split({"role": "assistant", "content": text, "reasoning_content": "why", "tool_calls": [{"id": "c"}]})
    assert parts is not None
    assert parts[0]["content"].endswith("</tool_call>") and parts[2]["content"] == "then"
    assert parts[0]["reasoning_content"] == "why" and parts[2]["tool_calls"] == [{"id": "c"}]
    words = split({"role": "assistant", "content": "ask the user<tool_response>r</tool_response>ok"})
    assert words is not None and words[0]["content"] == "ask the user"  # a word of the text, not a role's line


@pytest.mark.parametrize(
    "text",
    [
        "no tools at all",
        "<search>q</search><information>cut at the length limit",
        "<interpreter> and </information>",
        "the <result> tag </result> in prose",  # a common tag: a result only right after a call
        "<search>q</search><result>cut at the length limit",
    ],
    ids=["plain", "unclosed", "markers-out-of-place", "result-not-after-a-call", "result-unclosed"],
)
def test_text_without_a_closed_block_is_one_generation(text) -> None:
    assert split({"role": "assistant", "content": text}) is None


def test_a_rollout_that_ends_on_a_result_ends_on_its_return(tmp_path) -> None:
    (run,) = _write(
        tmp_path, "r.jsonl", [{"id": "a", "prompt": "p", "response": "<search>q</search><information>x</information>"}]
    )
    assert [(t.tool, t.tool_status) for t in run.turns] == [("search", "ok")]


def test_an_error_in_an_inline_result_is_an_error(tmp_path) -> None:
    out = "<code>1/0</code><interpreter>Traceback (most recent call last):\nZeroDivisionError</interpreter>done"
    (run,) = _write(tmp_path, "r.jsonl", [{"id": "a", "prompt": "p", "completion": out}])
    assert [(t.tool, t.tool_status) for t in run.turns] == [("python", "error"), (None, None)]


def test_generation_outputs_with_several_responses_and_a_chat_prompt(tmp_path) -> None:
    """verl's main_generation rows: the prompt as chat messages, `responses` one per sample."""
    row = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": PROMPT}],
        "responses": [SEARCHES, "<answer>x</answer>"],
    }
    runs = _write(tmp_path, "gen.jsonl", [row])
    assert [r.sample for r in runs] == [0, 1] and runs[0].prompt_id == runs[1].prompt_id
    assert [len(r.turns) for r in runs] == [3, 1] and runs[0].prompt_tokens == runs[1].prompt_tokens > 0


def test_a_record_with_an_id_keeps_it_and_other_text_fields_are_no_rollout(tmp_path) -> None:
    (run,) = _write(tmp_path, "r.jsonl", [{"task_id": "t-1", "input": "p", "output": "plain answer"}])
    assert run.prompt_id == "t-1" and run.step is None and "input" not in run.extra.get("meta", {})
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"input": "p", "output": 5}) + "\n")  # a response that is no text: not a rollout
    with pytest.raises(ValueError, match="expected a message list"):
        import_files("openai", [path], tokenizer=B4)


_PLAIN = st.text(alphabet="abc xyz\n.:=()0123456789", max_size=40)  # no marker can be written with these
_KINDS = [
    ("<information>", "</information>", "search"),
    ("<|begin_search_result|>", "<|end_search_result|>", "search"),
    ("<|begin_of_documents|>", "<|end_of_documents|>", "search"),
    ("<interpreter>", "</interpreter>", "python"),
]


@given(
    turns=st.lists(st.tuples(_PLAIN, st.sampled_from(_KINDS), _PLAIN), min_size=1, max_size=6),
    last=_PLAIN.filter(lambda t: t.strip() != ""),
)
def test_split_gives_back_every_generation_and_result_written_into_one_text(turns, last) -> None:
    """Property: generations and results of any kinds written into one text with their markers come back one by
    one, in order, each result named after its kind's tool."""
    text = "".join(f"{gen}{opening}{result}{closing}" for gen, (opening, closing, _), result in turns) + last
    parts = split({"role": "assistant", "content": text})
    expected: list[dict] = []
    for gen, (_, _, tool), result in turns:
        expected += [{"role": "assistant", "content": gen}, {"role": "tool", "name": tool, "content": result}]
    assert parts == [*expected, {"role": "assistant", "content": last}]


def _text(tokens: int, head: str = "") -> str:
    """`head` padded with spaces and words to exactly `tokens` bytes4 tokens (4 ASCII characters each)."""
    body = (head + " " + "word " * tokens)[: 4 * tokens]
    return body if len(body) == 4 * tokens else body.ljust(4 * tokens)


def test_a_synthetic_search_r1_step_dumped_as_verl_writes_it_imports_to_the_same_trajectories(tmp_path) -> None:
    """Two synthetic search-r1 steps written as verl's rollout_data_dir lines (each search result inline in
    `<information>`, an error or a timeout said in its text): every trajectory comes back with its prompt's
    tokens, each turn's generation, tool, status and return tokens, its step and its reward, and the samples of one
    prompt under one prompt id."""
    from libra.workloads.generators import WorkloadGenerator

    gen = WorkloadGenerator("search-r1", seed=3, num_prompts=4, samples_per_prompt=3)
    runs = [t for step in (0, 1) for t in gen.step(step)]
    said = {"ok": "", "error": "Error: the search backend failed", "timeout": "Search timed out"}
    lines = []
    for t in runs:
        output = "".join(
            _text(x.gen_tokens, "<search>q</search>")
            + (f"<information>{_text(x.tool_tokens, said[x.tool_status])}</information>" if x.tool else "")
            for x in t.turns
        )
        lines.append(
            {
                "input": _text(t.prompt_tokens, f"question {t.prompt_id}"),
                "output": output,
                "score": t.reward,
                "step": t.step,
            }
        )
    back = _write(tmp_path, "dump.jsonl", lines)
    names = {t.prompt_id: b.prompt_id for t, b in zip(runs, back, strict=True)}
    assert len(set(names.values())) == len(names)  # one id per prompt, none shared between prompts
    for t, b in zip(runs, back, strict=True):
        assert (b.prompt_id, b.prompt_tokens, b.step, b.reward) == (
            names[t.prompt_id],
            t.prompt_tokens,
            t.step,
            t.reward,
        )
        assert [(x.gen_tokens, x.tool, x.tool_status, x.tool_tokens) for x in b.turns] == [
            (x.gen_tokens, x.tool, x.tool_status, x.tool_tokens) for x in t.turns
        ]


def test_a_rollout_dump_given_as_verl_token_records_says_which_format_reads_it(tmp_path) -> None:
    path = tmp_path / "3.jsonl"
    path.write_text(json.dumps({"input": PROMPT, "output": SEARCHES, "score": 1.0, "step": 3}) + "\n")
    with pytest.raises(ValueError, match=r"rollout_data_dir dump, text: import it with --format openai"):
        import_files("verl", [path])
    assert len(import_files("openai", [path], tokenizer=B4)[0].turns) == 3
