"""The corpus's source conversions other than InterCode's (scripts/corpus_convert.py, through
scripts/build_corpus.py): the ReAct transcripts of the search agents split into generations and tool returns, tool
calls written in the text, the notebooks' printed episodes, MedAgentBench's runs and Moatless Tools' steps, each
read back by the importer with the tokens it counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from libra.workloads.importers import DEFAULT_ERROR_PATTERNS, StatusRules, import_files
from libra.workloads.trace import TraceError
from tests.workloads.corpus_tokens import b4 as _b4

# the two shapes of FireAct's trajectory files: a message list (fine-tuned GPT-3.5) and one Alpaca-style text
# (the Llama models), each with a search, a failed search (`None`), the answer and the environment's verdict
CHAT = {
    "7": {
        "reward": True,
        "f1": 1.0,
        "prompt": [],
        "traj": [
            {"role": "user", "content": "Who is older, A or B?"},
            {"role": "assistant", "content": "Thought: I need A's birth date.\nAction: search[A birth date]"},
            {"role": "user", "content": "Observation: June 22, 1987"},
            {"role": "assistant", "content": "Thought: Now B.\nAction: search[B birth date]"},
            {"role": "user", "content": "Observation: None"},
            {"role": "assistant", "content": "Thought: A is younger.\nAction: finish[B]"},
            {"role": "user", "content": "Observation: Episode finished, reward = True"},
        ],
    }
}
HEAD = "Below is an instruction.\n\n### Instruction:\nWho is older, A or B?\n\n### Response:\n"
TEXT = {
    "7": {
        "reward": False,
        "f1": 0,
        "prompt": "",
        "traj": HEAD + "Thought: I need A's birth date.\nAction: search[A birth date]\nObservation: June 22, 1987\n"
        "continued on a second line\nThought: Now B.\nAction: search[B birth date]\nObservation: None\n"
        "Thought: A is younger.\nAction: finish[B]\nObservation: Episode finished, reward = False\n",
    }
}


@pytest.mark.parametrize("raw", [CHAT, TEXT], ids=["chat", "text"])
def test_react_transcripts_become_generations_and_search_returns(build_corpus, raw, tmp_path) -> None:
    """Thought/Action text is generated, each `Observation:` is a `search` return (an empty search an error under
    the source's pattern), the verdict after `finish` goes to no model and is dropped."""
    data = build_corpus.convert._react_messages(json.dumps(raw).encode())
    rec = json.loads(data)
    roles = [m["role"] for m in rec["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["name"] for m in rec["messages"] if m["role"] == "tool"] == ["search", "search"]
    assert rec["id"] == "hotpotqa-7" and rec["reward"] == float(raw["7"]["reward"])
    assert not any("Episode finished" in m["content"] for m in rec["messages"])
    if raw is TEXT:
        assert rec["messages"][0]["content"] == HEAD
        assert rec["messages"][2]["content"] == "Observation: June 22, 1987\ncontinued on a second line"
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, r"^Observation: None$"))
    (traj,) = import_files("openai", [path], tokenizer="bytes4", rules=rules)
    assert [t.tool for t in traj.turns] == ["search", "search", None]
    assert [t.tool_status for t in traj.turns] == ["ok", "error", None]
    assert traj.prompt_tokens == _b4(rec["messages"][0]["content"])
    assert [t.gen_tokens for t in traj.turns] == [
        _b4(m["content"]) for m in rec["messages"] if m["role"] == "assistant"
    ]


def test_tool_calls_in_text_become_named_tool_returns(build_corpus, tmp_path) -> None:
    """WebDancer's records: a `<tool_response>` user message is the return of the call(s) written in the assistant
    message before it (one name, or names joined by `+`); the question's user message stays the prompt."""
    call = '<tool_call>\n{"name": "%s", "arguments": {"query": ["x"]}}\n</tool_call>'
    rec: dict[str, Any] = {
        "tag": "e2hqa",
        "messages": [
            {"role": "system", "content": "You seek information."},
            {"role": "user", "content": "A conversation ... User: who?"},
            {"role": "assistant", "content": "<think>search first</think>\n" + call % "search"},
            {"role": "user", "content": "<tool_response>\n10 results\n</tool_response>"},
            {"role": "assistant", "content": "<think>both</think>" + call % "visit" + call % "search"},
            {"role": "user", "content": "<tool_response>\npage and results\n</tool_response>"},
            {"role": "assistant", "content": "<answer>Him</answer>"},
        ],
    }
    data = build_corpus.convert._qwen_tools_messages((json.dumps(rec) + "\n").encode())
    out = json.loads(data)
    assert out["id"] == "e2hqa-0"
    assert [m["role"] for m in out["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m["name"] for m in out["messages"] if m["role"] == "tool"] == ["search", "visit+search"]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    (traj,) = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool for t in traj.turns] == ["search", "visit+search", None]
    assert traj.prompt_tokens == _b4(rec["messages"][0]["content"]) + _b4(rec["messages"][1]["content"])


def test_reflexion_logs_become_runs_with_the_agents_prompt(build_corpus, tmp_path) -> None:
    """Reflexion's trial logs: the prompt is the agent's template filled with its examples and the question (read
    from the Python files by `ast`, never run), Thought/Action pairs are generations, observations `search` /
    `lookup` returns, the verdict after Finish is dropped, and the reward is the verdict."""
    context = {
        "prompts.py": b'X = 1\nREACT_INSTRUCTION = """Solve.\n{examples}\n(END)\nQuestion: {question}{scratchpad}"""\n',
        "fewshots.py": b'WEBTHINK_SIMPLE6 = """Question: q?\nThought 1: t"""\n',
    }
    log = (
        "#####\nBEGIN TRIAL 1\nTrial summary: Correct: 1\n#####\n------ BEGIN CORRECT AGENTS ------\n\n"
        "Question: Who is A?\nThought 1: Search A.\nAction 1: Search[A]\nObservation 1: Could not find [A]. "
        "Similar: ['A b']\nThought 2: Try A b.\nAction 2: Search[A b]\nObservation 2: A b is a painter.\n"
        "Thought 3: Look up born.\nAction 3: Lookup[born]\nObservation 3: (Result 1/1) born 1900.\n"
        "Thought 4: Done.\nAction 4: Finish[a painter]\nObservation 4: Answer is CORRECT\n"
        "Correct answer: a painter\n\n------ BEGIN INCORRECT AGENTS ------\n"
    )
    data = build_corpus.convert._reflexion_react_messages(log.encode(), context)
    rec = json.loads(data)
    assert rec["messages"][0]["content"] == "Solve.\nQuestion: q?\nThought 1: t\n(END)\nQuestion: Who is A?"
    assert [m.get("name", m["role"]) for m in rec["messages"]] == [
        "user",
        "assistant",
        "search",
        "assistant",
        "search",
        "assistant",
        "lookup",
        "assistant",
    ]
    assert rec["reward"] == 1.0 and "Answer is" not in data.decode()
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, r"^Observation \d+: Could not find \["))
    (traj,) = import_files("openai", [path], tokenizer="bytes4", rules=rules)
    assert [t.tool_status for t in traj.turns] == ["error", "ok", "ok", None]


def _notebook_episode(i: int, steps: list[tuple[str, str]]) -> str:
    body = "".join(f"Action: {a}\nObservation: {o}\n\n" for a, o in steps)
    return f"-----------------\n{i}\n{body}{i + 1} 0.5 0.0 0.0\n-------------\n"


def test_webshop_notebook_episodes_become_runs_with_the_one_shot_prompt(build_corpus, tmp_path) -> None:
    """ReAct's WebShop notebook: the prompt is the cell's one-shot example (read by `ast`), the instruction page and
    `Action:`; each later action is a generation, each observation a return named after the action's verb (an
    invalid action an error under the source's pattern); the score page after `Buy Now` is dropped and is the
    reward; an episode halted at its step limit ends on its last generation; the printed tally is no turn."""
    page = "\nWebshop \nInstruction:  \ni want a red mug \n[Search] "
    done = [("reset", page), ("search[red mug]", "\n[Back to Search] \n[B01] \nRed mug \n$5.0 "),
            ("think[B01 fits.]", "OK."), ("click[B02]", "Invalid action!"), ("click[B01]", "\n[Buy Now] "),
            ("click[Buy Now]", "Your score (min 0.0, max 1.0): 0.75")]  # fmt: skip
    halted = [("reset", page), ("search[mug]", "\n[Back to Search] "), ("click[< Prev]", "\n[Search] ")]
    notebook = {
        "cells": [
            {"cell_type": "code", "source": ["%load_ext autoreload\n"], "outputs": []},
            {
                "cell_type": "code",
                "source": ['x = 1\nprompt1 = """Webshop \nAction: click[Buy Now]\n"""\n'],
                "outputs": [],
            },
            {
                "cell_type": "code",
                "source": ["res1 = run_episodes(prompt1, 2)"],
                "outputs": [
                    {"name": "stdout", "output_type": "stream", "text": _notebook_episode(0, done)},
                    {"name": "stderr", "output_type": "stream", "text": "a warning\n"},
                    {"name": "stdout", "output_type": "stream", "text": _notebook_episode(1, halted) + "0.5 0.0 0.0\n"},
                ],
            },
        ]
    }
    data = build_corpus.convert._webshop_messages(json.dumps(notebook).encode())
    first, second = (json.loads(line) for line in data.decode().splitlines())
    assert first["id"] == "webshop-fixed_0" and first["reward"] == 0.75 and second["reward"] == 0.0
    assert first["messages"][0]["content"] == f"Webshop \nAction: click[Buy Now]\n{page}\n\nAction:"
    assert [m.get("name", m["role"]) for m in first["messages"]] == [
        "user", "assistant", "search", "assistant", "think", "assistant", "click", "assistant", "click", "assistant"
    ]  # fmt: skip
    assert first["messages"][-1]["content"] == " click[Buy Now]" and "score" not in data.decode()
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool", "assistant"]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, r"^Observation: Invalid action!$"))
    traj, _ = import_files("openai", [path], tokenizer="bytes4", rules=rules)
    assert [t.tool for t in traj.turns] == ["search", "think", "click", "click", None]
    assert [t.tool_status for t in traj.turns] == ["ok", "ok", "error", "ok", None]


def _fever_episode(idx: int, claim: str, steps: str, info: str, n: int) -> str:
    return f"{idx} Claim: {claim}\n{steps}\n{info} \n\n{n} {n} 1.0 4.1\n-----------\n\n"


def test_fever_notebook_episodes_become_runs_with_the_few_shot_prompt(build_corpus, tmp_path) -> None:
    """ReAct's FEVER notebook: the prompt is the few-shot prompt the notebook names (read from the JSON file beside
    it) with the claim; each Thought/Action pair is a generation (a bad call's two completions one), each
    observation a return named after its action (a failed Lookup an error under the source's pattern); the verdict
    after Finish and the last observation of an agent halted at its step limit are dropped; the reward is `em`;
    the printed info and tally are no turn."""
    done = (
        "Thought 1: Search A.\nAction 1: Search[A]\nObservation 1: A is a band.\n\n"
        "Thought 2: Look up B.\nAction 2: Lookup[B]\nObservation 2: No more results.\n\n\n"
        "Thought 3: It is.\nAction 3: Finish[SUPPORTS]\nObservation 3: Episode finished, reward = 1\n\n\n"
    )
    bad = (
        "Thought 1: Search C.\nAction 1: Search[C]\nObservation 1: C is a city.\n\n"
        "ohh...  I give up.\n\nAction 2:\n\nFinish[REFUTES]\nThought 2: I give up.\nAction 2: Finish[REFUTES]\n"
        "Observation 2: Episode finished, reward = 0\n\n\n"
    )
    halted = "Thought 1: Search D.\nAction 1: Search[D]\nObservation 1: D is a river.\n\n"
    first = _fever_episode(7, "A is a band.", done, "{'steps': 3, 'answer': 'SUPPORTS', 'em': 1, 'f1': 1}", 1)
    second = _fever_episode(8, "C isn't a city.", bad, "{'steps': 2, 'answer': 'REFUTES', 'em': 0, 'f1': 0}", 2)
    third = _fever_episode(9, "D is long.", halted, "{'steps': 1, 'answer': '', 'em': 0, 'f1': 0}", 3)
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["# ReAct"]},
            {"cell_type": "code", "source": ["webthink_prompt = prompt_dict['webthink_simple3']\n"], "outputs": []},
            {
                "cell_type": "code",
                "source": ["for i in idxs[:3]:\n", "    r, info = webthink(i, to_print=True)\n"],
                "outputs": [
                    {"name": "stdout", "output_type": "stream", "text": first + second[:40]},
                    {"name": "stderr", "output_type": "stream", "text": "a warning\n"},
                    {"name": "stdout", "output_type": "stream", "text": [second[40:], third]},
                ],
            },
        ]
    }
    prompts = {"webthink_simple3": "Verify claims.\nClaim: x\nThought 1: y\n\n", "webact_simple3": "other"}
    context = {"prompts/fever.json": json.dumps(prompts).encode()}
    data = build_corpus.convert._fever_messages(json.dumps(notebook).encode(), context)
    a, b, c = (json.loads(line) for line in data.decode().splitlines())
    assert (a["id"], a["reward"], b["reward"], c["id"]) == ("fever-7", 1.0, 0.0, "fever-9")
    assert a["messages"][0]["content"] == "Verify claims.\nClaim: x\nThought 1: y\n\nClaim: A is a band.\n"
    names = [m.get("name", m["role"]) for m in a["messages"]]
    assert names == ["user", "assistant", "search", "assistant", "lookup", "assistant"]
    assert a["messages"][2]["content"] == "Observation 1: A is a band."
    assert a["messages"][4]["content"] == "Observation 2: No more results.\n"
    assert (
        b["messages"][-1]["content"]
        == "Thought 2:  I give up.\n\nAction 2:\n\nFinish[REFUTES]\nAction 2: Finish[REFUTES]"
    )
    assert [m["role"] for m in c["messages"]] == ["user", "assistant"]
    assert "Episode finished" not in data.decode() and "'steps'" not in data.decode()
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, r"^Observation \d+: No more results\.$"))
    traj, _, _ = import_files("openai", [path], tokenizer="bytes4", rules=rules)
    assert [t.tool_status for t in traj.turns] == ["ok", "error", None]


def _medagent_run(index: int, status: str, history: list[tuple[str, str]]) -> str:
    turns = [{"role": role, "content": text} for role, text in history]
    output = {"index": index, "status": status, "result": None, "history": turns}
    return json.dumps({"index": index, "error": None, "info": None, "output": output, "time": {}})


def test_medagentbench_runs_keep_every_call_and_its_tokens(build_corpus, tmp_path) -> None:
    """MedAgentBench's AgentBench runs: the task's prompt is the prompt, each `agent` reply a generation, each later
    `user` message the return of the call before it (`get`, `post`; a Gemini reply in a ```tool_code fence is read
    as the task reads it), an error where the GET could not be sent or the POST not parsed; an answer after the last
    reply (a run stopped at the round limit) is dropped. The reward is the run's `Correct` in overall.json. Every
    turn is kept, with its tokens."""
    bundle = 'Here is the response from the GET request:\n{"resourceType": "Bundle", "total": 2}. Please call FINISH'
    ok = "POST request accepted and executed successfully. Please call FINISH"
    first = _medagent_run(7, "completed", [
        ("user", "You are an expert in using FHIR functions. Question: A1C of S1?"),
        ("agent", "GET http://h/fhir/Observation?code=A1C&patient=S1"), ("user", bundle),
        ("agent", "```tool_code\nGET http://h/fhir/Patient?x=1\n```"),
        ("user", "Error in sending the GET request: 400 Client Error"),
        ("agent", 'POST http://h/fhir/ServiceRequest\n{"resourceType": "ServiceRequest"}'), ("user", ok),
        ("agent", "POST http://h/fhir/MedicationRequest\nnot json"), ("user", "Invalid POST request"),
        ("agent", 'FINISH([5.5, "2023-10-14"])'),
    ])  # fmt: skip
    second = _medagent_run(8, "task limit reached", [
        ("user", "Question: B?"), ("agent", "GET http://h/fhir/Condition?patient=S2"), ("user", bundle),
    ])  # fmt: skip
    raw = [{"index": "7", "status": "completedCorrect"}, {"index": "8", "status": "task limit reachedIncorrect"}]
    context = {"overall.json": json.dumps({"total": 2, "custom": {"accuracy": 0.5, "raw_results": raw}}).encode()}
    data = build_corpus.CONVERTERS["agentbench-medagent"](f"{first}\n{second}\n".encode(), context)
    a, b = (json.loads(line) for line in data.decode().splitlines())
    assert (a["id"], a["reward"], a["status"]) == ("medagentbench-7", 1.0, "completedCorrect")
    assert (b["id"], b["reward"]) == ("medagentbench-8", 0.0)
    assert [m["role"] for m in b["messages"]] == ["user", "assistant"]
    assert [m["name"] for m in a["messages"] if m["role"] == "tool"] == ["get", "get", "post", "post"]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    run, short = import_files("openai", [path], tokenizer="bytes4")
    history = json.loads(first)["output"]["history"]
    assert [t.tool for t in run.turns] == ["get", "get", "post", "post", None]
    assert [t.tool_status for t in run.turns] == ["ok", "error", "ok", "error", None]
    assert run.prompt_tokens == _b4(history[0]["content"])
    assert [t.gen_tokens for t in run.turns] == [_b4(m["content"]) for m in history if m["role"] == "agent"]
    assert [t.tool_tokens for t in run.turns] == [*(_b4(m["content"]) for m in history[2::2]), 0]
    assert [t.tool for t in short.turns] == [None] and short.reward == 0.0


def _moatless_step(node_id: int, messages: list, response: list, fail: str | None = None) -> dict:
    observation = {"message": "m", "properties": {"fail_reason": fail} if fail else {}}
    call = {"model": "c", "input": messages, "response": {"content": response}, "usage": {}}
    # a model call inside the action (a search's relevance filter): a context of its own, not the conversation's
    inner = {"model": "c", "input": [{"role": "user", "content": "rank these spans " * 50}], "response": {}}
    return {"node_id": node_id, "parent_id": node_id - 1, "action": {}, "observation": observation,
            "completions": {"build_action": call, "execute_action": inner}}  # fmt: skip


def _tool_result(text: str) -> dict:
    # as Moatless renders it into the next call's input: its own id, a prompt-cache marker (not text)
    block = {"tool_use_id": "call_1", "content": text, "type": "tool_result", "cache_control": {"type": "ephemeral"}}
    return {"role": "user", "content": [block]}


def test_moatless_steps_become_calls_with_the_results_as_sent(build_corpus, tmp_path) -> None:
    """Moatless Tools' trajectories: the system prompt and the task are the prompt; each step's recorded call is a
    generation (its raw response: text and one tool call), the tool's result is the text the next call's input
    holds (Moatless renders the history again for each call), an error where the step records a `fail_reason`; a
    reply asked for again within a step (no tool call) is a generation and the harness's text its return; the last
    step's result goes to no model. A call that started again from the task alone is refused."""
    task = "<task>\nFix the validator.\n</task>"
    think = {"type": "text", "text": "<thoughts>\nFind it.\n</thoughts>"}
    find = [think, {"id": "toolu_1", "type": "tool_use", "name": "FindClass", "input": {"class_name": "V"}}]
    edit = [
        {"type": "text", "text": "Edit."},
        {
            "id": "toolu_2",
            "type": "tool_use",
            "name": "str_replace_editor",
            "input": {"command": "str_replace", "old_str": "^", "new_str": "A"},
        },
    ]
    done = [{"id": "toolu_3", "type": "tool_use", "name": "Finish", "input": {"finish_reason": "fixed"}}]
    rendered = {"role": "assistant", "content": [think, {**find[1], "id": "call_1", "cache_control": {}}]}
    found = "<observation>\nFound 1 code section.\n```\nclass V: regex = r'^x$'\n```\n</observation>"
    failed = {"role": "assistant", "content": [{"type": "text", "text": "The fix is to use \\A."}]}
    retry = "You're an autonomous agent that can't communicate with the user. Please provide a tool call."
    missing = "<observation>\nString '^' not found in v.py\n</observation>"
    first = [{"role": "user", "content": task}]
    second = [*first, rendered, _tool_result(found), failed, {"role": "user", "content": retry}]
    third = [*first, rendered, _tool_result(found), {"role": "assistant", "content": edit}, _tool_result(missing)]
    steps = [_moatless_step(1, first, find), _moatless_step(2, second, edit, fail="string_not_found"),
             _moatless_step(3, third, done)]  # fmt: skip
    run = {"metadata": {"instance_id": "x__y-1"}, "agent": {"system_prompt": "You are an agent."},
           "nodes": [{"node_id": 0, "message": task, "completions": {}}, *steps]}  # fmt: skip
    data = build_corpus.CONVERTERS["moatless"](json.dumps(run).encode())
    record = json.loads(data)
    assert record["id"] == "x__y-1" and record["system"] == "You are an agent."
    assert [m["role"] for m in record["messages"]] == ["user", *["assistant", "user"] * 3, "assistant"]
    assert "cache_control" not in data.decode()
    path = tmp_path / "trajectory.json"
    path.write_bytes(data)
    (t,) = import_files("openai", [path], tokenizer="bytes4")
    assert t.prompt_id == "x__y-1" and t.prompt_tokens == _b4("You are an agent.") + _b4(task)
    assert [x.tool for x in t.turns] == ["FindClass", "user", "str_replace_editor", None]
    assert [x.tool_status for x in t.turns] == ["ok", "ok", "error", None]
    assert [x.tool_tokens for x in t.turns] == [_b4(found), _b4(retry), _b4(missing), 0]
    assert t.turns[1].gen_tokens == _b4(failed["content"][0]["text"])
    restart = {**run, "nodes": [*run["nodes"][:2], _moatless_step(2, first, edit)]}
    with pytest.raises(ValueError, match="started again from the task alone"):
        build_corpus.CONVERTERS["moatless"](json.dumps(restart).encode())
    # the raw trajectory.json, as `libra trace import --format openai` reads it (importers/moatless.py): the same
    # trajectory, and the restarted run a one-line error naming the file
    raw = tmp_path / "raw" / "trajectory.json"
    raw.parent.mkdir()
    raw.write_text(json.dumps(run))
    (direct,) = import_files("openai", [raw], tokenizer="bytes4")
    assert (direct.prompt_id, direct.prompt_tokens, direct.turns) == (t.prompt_id, t.prompt_tokens, t.turns)
    raw.write_text(json.dumps(restart))
    with pytest.raises(TraceError, match=r"raw/trajectory\.json.*Moatless trajectory: a call started again") as err:
        import_files("openai", [raw], tokenizer="bytes4")
    assert "\n" not in str(err.value)
