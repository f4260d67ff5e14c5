"""The corpus's source conversions (scripts/build_corpus.py) and the held-out sources (data/corpus/held-out/): the
ReAct transcripts of the search agent split into generations and search returns, and the held-out set kept apart
from the sources that the router's tests gate on."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from libra.workloads.importers import DEFAULT_ERROR_PATTERNS, StatusRules, import_files
from libra.workloads.trace import TraceError
from tests.scripts import load_script

HELD_OUT = DEFAULT_CORPUS / "held-out"


@pytest.fixture(scope="module")
def build_corpus():
    return load_script("build_corpus")


def _b4(text: str) -> int:
    return -(-len(text.encode()) // 4)


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
    data = build_corpus._react_messages(json.dumps(raw).encode())
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
    data = build_corpus._qwen_tools_messages((json.dumps(rec) + "\n").encode())
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
    data = build_corpus._reflexion_react_messages(log.encode(), context)
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
    data = build_corpus._webshop_messages(json.dumps(notebook).encode())
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
    data = build_corpus._fever_messages(json.dumps(notebook).encode(), context)
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


# InterCode's templates as prompts.py writes them: a base class with the retry message, the chat template (which
# sets an attribute in get_init_msg and one in get_query_msg) and the SQL game that inherits its other methods
INTERCODE_PROMPTS = b"""
X = "not a template"


class PromptTemplate():
    def __init__(self, language: str, setting: str):
        self.language = language.upper()

    def get_retry_msg(self):
        return f\"\"\"No {self.language} code was found.\"\"\"


class TemplateV2(PromptTemplate):
    def get_init_msg(self):
        self.explore_msg = f\"\"\"Try {self.language}.\"\"\"
        return f\"\"\"Use a {self.setting} system. {self.explore_msg}\"\"\"

    def get_query_msg(self, query):
        self.query = query
        return f\"\"\"Query: \\"{query}\\".\"\"\"

    def get_obs_msg(self, observation, reward):
        if isinstance(observation, str) and observation == "":
            observation = "No output"
        return f\"\"\"{self.setting} Output: {observation}
Reward: {reward}
Again: {self.query}\"\"\"


class TemplateSQLGame(TemplateV2):
    def get_init_msg(self):
        return f\"\"\"`{self.language}Env` is a game.\"\"\"
"""


def _intercode_run(env: str, dataset: str, steps: list[tuple[str, str, float, bool | None]]) -> dict:
    actions, observations, rewards, valid = (list(x) for x in zip(*steps, strict=True))
    return {
        "environment": env,
        "dataset": dataset,
        "task_id": 3,
        "query": "how many?",
        "turn_history": {"actions": actions, "observations": observations, "rewards": rewards, "valid_action": valid},
        "summary": {"max_reward": max(rewards)},
    }


def test_intercode_runs_become_chats_with_the_templates_of_the_runs(build_corpus, tmp_path) -> None:
    """InterCode's result files: the system prompt and the query from the run's template class (read by `ast`, the
    inherited methods from its base), each logged command a reply in the template's code fence (a reply without code
    as logged), each observation the template's output message, cut as the policy cut it (a SQL result to 50 rows, a
    text to 1,000 characters, empty as "No output"), an error where the run logged the action invalid; the
    observation after the last turn is dropped; the reward is the run's best."""
    rows = "[" + ", ".join(f"({i}, 'a, (b)')" for i in range(52)) + "]"
    retry = "No SQL code was found."
    sql = _intercode_run("ic_sql", "./data/spider/dev_spider.json", [
        ("SELECT n FROM t", rows, 0.5, True), ("I cannot answer", retry, 0, False),
        ("SELECT x FROM t", "Error executing query: Unknown column 'x'", 0, False),
        ("SELECT m FROM t", "[]", 1.0, True),
    ])  # fmt: skip
    bash = _intercode_run("ic_bash", "./data/nl2bash/nl2bash_fs_2.json", [
        ("ls /", "x" * 1500, 0.2, True), ("grep q f", "", 0.25, False), ("wc -l f", "3 f\n", 0.25, True),
    ])  # fmt: skip
    context = {"experiments/utils/prompts.py": INTERCODE_PROMPTS}
    data = build_corpus.CONVERTERS["intercode"](json.dumps({"0": sql, "1": bash}).encode(), context)
    first, second = (json.loads(line) for line in data.decode().splitlines())
    assert first["id"] == "dev_spider-3" and first["reward"] == 1.0 and second["id"] == "nl2bash_fs_2-3"
    assert [m.get("name", m["role"]) for m in first["messages"]] == [
        "system", "user", "assistant", "sql", "assistant", "sql", "assistant", "sql", "assistant"
    ]  # fmt: skip
    assert first["messages"][0]["content"] == "`SQLEnv` is a game."
    assert second["messages"][0]["content"] == "Use a Bourne Shell system. Try BASH."
    assert first["messages"][1]["content"] == 'Query: "how many?".'
    assert first["messages"][2]["content"] == "```SQL\nSELECT n FROM t\n```"
    assert first["messages"][4]["content"] == "I cannot answer"
    fifty = "[" + ", ".join(f"({i}, 'a, (b)')" for i in range(50)) + "]"
    assert first["messages"][3]["content"] == f"MySQL Database Output: {fifty}\nReward: 0.5\nAgain: how many?"
    assert first["messages"][5]["content"].startswith(f"MySQL Database Output: {retry}\nReward: 0\n")
    assert first["messages"][-1]["content"] == "```SQL\nSELECT m FROM t\n```" and "No output" not in json.dumps(first)
    texts = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert texts == [
        f"Bourne Shell Output: {'x' * 1000}\nReward: 0.2\nAgain: how many?",
        "Bourne Shell Output: No output\nReward: 0.25\nAgain: how many?",
    ]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    sql_run, bash_run = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool_status for t in sql_run.turns] == ["ok", "error", "error", None]
    assert [t.tool for t in bash_run.turns] == ["bash", "bash", None]
    assert [t.tool_status for t in bash_run.turns] == ["ok", "error", None]
    assert sql_run.prompt_tokens == _b4("`SQLEnv` is a game.") + _b4('Query: "how many?".')


# the CTF and Python templates as prompts.py writes them: the CTF system prompt is an f-string plus the file's
# demonstrations (a module constant), its observation message an `if` on the observation; the function template
# inherits the query message (which keeps the query) from the chat template
INTERCODE_MORE_PROMPTS = b"""
DEMO_CTF = \"\"\"Task: find it
Action: ls
\"\"\"


class PromptTemplate():
    def get_retry_msg(self):
        return f\"\"\"No {self.language} code was found.\"\"\"


class TemplateV2(PromptTemplate):
    def get_query_msg(self, query):
        self.query = query
        return f\"\"\"Query: \\"{query}\\".\"\"\"


class TemplateCTF(PromptTemplate):
    def get_init_msg(self):
        return f\"\"\"You play {self.setting}, flags are 'picoCTF{{...}}'.
\"\"\" + DEMO_CTF

    def get_query_msg(self, query):
        return f\"\"\"Task: {query}\"\"\"

    def get_obs_msg(self, observation, reward):
        if observation != "":
            return f\"\"\"Output: {observation}\"\"\"
        return "No output"


class TemplateCodeFunction(TemplateV2):
    def get_init_msg(self):
        return f\"\"\"Write a {self.language} function in a {self.setting}.\"\"\"

    def get_obs_msg(self, observation, reward):
        if isinstance(observation, str) and observation == "":
            observation = "No output"
        return f\"\"\"{self.setting} Output: {observation}
    Reward: {reward}
    Again: \\"{self.query}\\"\"\"\"
"""


def test_intercode_ctf_and_python_runs_keep_every_turn_and_its_tokens(build_corpus, tmp_path) -> None:
    """InterCode's CTF and Python runs: the reply is the logged action as it is (their templates ask for bare code),
    the CTF system prompt is the template's text and the demonstrations, an empty CTF output is the template's "No
    output", a CTF output is cut to 1,000 characters and a Python output dict is not; errors: a CTF command logged
    invalid or a wrong flag (a timeout by its text), a failed Python test, an action the interpreter could not run
    or an output whose `error` is set. Every turn but the dropped last observation is kept, with its tokens."""
    wrong = "Submitted flag is incorrect. Keep trying!"
    big = "{'output': '" + "y" * 1200 + "', 'error': ''}"
    ctf = _intercode_run("ic_ctf", "./data/ctf/ic_ctf.json", [
        ("ls", "a.txt\n", 0, True), ("cat a.txt", "x" * 1500, 0, True), ("touch b", "", 0, True),
        ("./a.out", "Command timed out", 0, False), ("grep -r pico .", "bin", 0, False),
        ("submit picoCTF{no}", wrong, 0, True), ("submit picoCTF{yes}", "bin", 1, True),
    ])  # fmt: skip
    python = _intercode_run("ic_python", "./data/python/mbpp/ic_mbpp.json", [
        ("print(f(2))", big, 0, None),
        ("def f(x):\n    return x", "Test case did not pass. Please try again.", 0.5, None),
        ("f(", "Error executing action: invalid syntax (<unknown>, line 1)", 0, None),
        ("g(1)", "{'output': '', 'error': \"NameError: name 'g' is not defined\"}", 0, None),
        ("def f(x):\n    return 2 * x", "{'output': '', 'error': ''}", 1.0, None),
    ])  # fmt: skip
    context = {"experiments/utils/prompts.py": INTERCODE_MORE_PROMPTS}
    data = build_corpus.CONVERTERS["intercode"](json.dumps({"0": ctf, "1": python}).encode(), context)
    first, second = (json.loads(line) for line in data.decode().splitlines())
    system = "You play Capture the Flag, flags are 'picoCTF{...}'.\nTask: find it\nAction: ls\n"
    assert [m["content"] for m in first["messages"][:2]] == [system, "Task: how many?"]
    replies = [m["content"] for m in first["messages"] if m["role"] == "assistant"]
    assert replies == ctf["turn_history"]["actions"] and first["reward"] == 1
    returns = [m["content"] for m in first["messages"] if m["role"] == "tool"]
    outputs = ["a.txt\n", "x" * 1000, None, "Command timed out", "bin", wrong]
    assert returns == [f"Output: {o}" if o else "No output" for o in outputs]
    assert second["messages"][0]["content"] == "Write a PYTHON function in a Python 3 Interpreter."
    assert [m["content"] for m in second["messages"] if m["role"] == "assistant"] == python["turn_history"]["actions"]
    (back,) = (m["content"] for m in second["messages"][3:4])
    assert back == f'Python 3 Interpreter Output: {big}\n    Reward: 0\n    Again: "how many?"'
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    ctf_run, python_run = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool for t in ctf_run.turns] == ["ctf"] * 6 + [None]
    assert [t.tool_status for t in ctf_run.turns] == ["ok", "ok", "ok", "timeout", "error", "error", None]
    assert [t.tool_status for t in python_run.turns] == ["ok", "error", "error", "error", None]
    for run, rec in ((ctf_run, first), (python_run, second)):
        gens = [_b4(m["content"]) for m in rec["messages"] if m["role"] == "assistant"]
        tools = [_b4(m["content"]) for m in rec["messages"] if m["role"] == "tool"]
        assert run.prompt_tokens == _b4(rec["messages"][0]["content"]) + _b4(rec["messages"][1]["content"])
        assert [t.gen_tokens for t in run.turns] == gens
        assert [t.tool_tokens for t in run.turns] == [*tools, 0]


def test_intercode_sql_runs_with_the_tables_given_add_them_to_the_prompt(build_corpus, tmp_path) -> None:
    """The SQL runs with the tables given: the policy's second system message lists the task's tables and columns
    (the record at the run's task index in the dataset the run logged), counted in the prompt; a dataset whose
    record there is another query is an error."""
    run = _intercode_run("ic_sql", "./data/spider/dev_spider.json", [
        ("SELECT a FROM t", "[(1,)]", 0.5, True), ("SELECT a, b FROM t", "[(1, 2)]", 1.0, True),
    ])  # fmt: skip
    other = {"query": "who?", "db_tables": {"u": ["c"]}}
    dataset = [other, other, other, {"query": "how many?", "db_tables": {"t": ["a", "b"], "s": ["it's"]}}]
    spider = "data/spider/dev_spider.json"
    context = {"experiments/utils/prompts.py": INTERCODE_PROMPTS, spider: json.dumps(dataset).encode()}
    data = build_corpus.CONVERTERS["intercode-tables"](json.dumps({"0": run}).encode(), context)
    rec = json.loads(data)
    tables = "MySQL tables, with their properties\n- t: ['a', 'b']\n- s: [\"it's\"]\n"
    assert [m["role"] for m in rec["messages"]] == ["system", "system", "user", "assistant", "tool", "assistant"]
    assert rec["messages"][1]["content"] == tables
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    (traj,) = import_files("openai", [path], tokenizer="bytes4")
    assert traj.prompt_tokens == _b4("`SQLEnv` is a game.") + _b4(tables) + _b4('Query: "how many?".')
    replies = ["```SQL\nSELECT a FROM t\n```", "```SQL\nSELECT a, b FROM t\n```"]
    assert [t.gen_tokens for t in traj.turns] == [_b4(r) for r in replies]
    context[spider] = json.dumps(dataset[:3] + [other]).encode()
    with pytest.raises(ValueError, match="not the run's query"):
        build_corpus.CONVERTERS["intercode-tables"](json.dumps({"0": run}).encode(), context)


# the templates of InterCode's other policies as prompts.py writes them: the completion template keeps a history
# that each observation message adds to (`+=`, a tuple of the dialogue's items, `"-"*10`), the chat templates
# answer with the output and the reward, and the ReAct template's demonstrations are a module dict of constants
INTERCODE_OTHER_PROMPTS = rb"""
DEMO_SQL_REACT = '''Question: q1
Action 1: execute[SHOW TABLES]
'''
DEMO_BASH_REACT = '''Question: b1
Action 1: execute[ls]
'''
DEMO_MAP_REACT = {"SQL": DEMO_SQL_REACT, "BASH": DEMO_BASH_REACT}


class PromptTemplate():
    def get_retry_msg(self):
        return f'''No {self.language} code was found.'''


class TemplateV1(PromptTemplate):
    def get_init_msg(self):
        return f'''Write {self.language}.
'''

    def get_query_msg(self, query):
        self.message_history = "\n" + "-"*3 + "\n" + "Tried:\n"
        return f'''Query: "{query}"
'''

    def get_obs_msg(self, dialogue):
        action, observation, reward = dialogue["actions"], dialogue["observations"], dialogue["reward"]
        self.message_history += f"- Action: {action}\n" + f"- Output: {observation}\n" + f"- Reward: {reward}\n\n"
        message = f"Analyze {self.language}\n" + self.message_history + "-"*3 + "\n" + "Output something else."
        return message


class TemplateV2(PromptTemplate):
    def get_init_msg(self):
        return f'''Use a {self.setting} system.'''

    def get_query_msg(self, query):
        self.query = query
        return f'''Query: "{query}".'''

    def get_obs_msg(self, observation, reward):
        if isinstance(observation, str) and observation == "":
            observation = "No output"
        return f'''Output: {observation}
Reward: {reward}'''


class TemplateV4(TemplateV2):
    def get_init_msg(self):
        return f'''You get a task in {self.language}.
'''


class TemplateReAct(PromptTemplate):
    def get_init_msg(self):
        return f'''Use a {self.setting} system with {self.language}. Examples:
'''

    def get_demos(self):
        return DEMO_MAP_REACT[self.language]

    def get_query_msg(self, query):
        return f'''Question: {query}'''
"""


def _other_context() -> dict[str, bytes]:
    return {"experiments/utils/prompts.py": INTERCODE_OTHER_PROMPTS}


def test_intercode_completion_runs_count_what_each_call_sent(build_corpus, tmp_path) -> None:
    """The completion policies (text-davinci-003, PaLM text-bison) send one text per call, rebuilt from the first
    prompt and TemplateV1's history of every action, output and reward (read with `ast`: its `+=`, tuple and `*`):
    the prompt is the system prompt and the query, each reply the command in its fence, each return what the next
    call's text gained less the action (which the reply stands for), so that the trace's context before each call
    holds the call's text, with the reply in place of its `- Action:` command. Outputs are cut as the policy cut
    them (500 characters for text-davinci-003, 1,000 for PaLM; empty: "No output"); statuses as logged."""
    run = _intercode_run("ic_bash", "./data/nl2bash/nl2bash_fs_1.json", [
        ("ls /", "x" * 700, 0.2, True), ("grep q f", "", 0.25, False), ("wc -l f", "3 f\n", 1.0, True),
    ])  # fmt: skip
    data = build_corpus.CONVERTERS["intercode-completion-gpt"](json.dumps({"0": run}).encode(), _other_context())
    rec = json.loads(data)
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    prompt = 'Write BASH.\nQuery: "how many?"\n'
    assert rec["messages"][0]["content"] == prompt and rec["reward"] == 1.0
    assert rec["messages"][1]["content"] == "```BASH\nls /\n```"
    # the texts of the second and third calls, as the policy built them
    blocks = [f"- Action: {a}\n- Output: {o}\n- Reward: {r}\n\n" for a, o, r in
              (("ls /", "x" * 500, 0.2), ("grep q f", "No output", 0.25))]  # fmt: skip
    head, tail = "Analyze BASH\n\n---\nTried:\n", "---\nOutput something else."
    calls = [prompt + head + "".join(blocks[:n]) + tail for n in (1, 2)]
    returns = [m["content"] for m in rec["messages"] if m["role"] == "tool"]
    assert returns[0] == calls[0][len(prompt) :].replace("ls /", "", 1)
    actions = ["ls /", "grep q f"]
    for n, call in enumerate(calls, start=1):
        assert len(prompt) + sum(len(r) + len(a) for r, a in zip(returns[:n], actions[:n])) == len(call)
    palm = build_corpus.CONVERTERS["intercode-completion-palm"](json.dumps({"0": run}).encode(), _other_context())
    assert "x" * 700 + "\n" in json.loads(palm)["messages"][2]["content"]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    (traj,) = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool_status for t in traj.turns] == ["ok", "error", None] and traj.prompt_tokens == _b4(prompt)
    assert [t.tool_tokens for t in traj.turns] == [_b4(returns[0]), _b4(returns[1]), 0]


def test_intercode_palm_and_hf_chats_keep_their_first_messages(build_corpus, tmp_path) -> None:
    """The chat policies of the other models: PaLM's chat has its default context and one first message of the
    system prompt and the query (TemplateV2), the Hugging Face chat a fixed system line and that message
    (TemplateV4); each return is the template's output message (a SQL result cut to 50 rows, empty as "No
    output"); a reply without SQL code (answered by the commit's retry message or the older code's) is counted as
    logged. A run whose first call failed (`blocked`) is left out; one that failed later ends on its last reply."""
    rows = "[" + ", ".join(f"({i},)" for i in range(60)) + "]"
    retry = "No SQL code was found."
    old_retry = "Format your SQL command as follows:\n```SQL\nYour SQL code here\n```\n"  # the older code's
    sql = _intercode_run("ic_sql", "./data/spider/dev_spider.json", [
        ("SELECT n FROM t", rows, 0.5, True), ("I cannot", retry, 0, False), ("SELECT m FROM t", "[]", 0, True),
        ("```SQL SELECT", old_retry, 0, False), ("SELECT k FROM t", "[(1,)]", 1.0, True),
    ])  # fmt: skip
    dead = {**sql, "task_id": 4, "turn_history": {"actions": ["blocked"], "observations": [], "rewards": [0],
                                                   "valid_action": []}}  # fmt: skip
    late = {**sql, "task_id": 5, "turn_history": {"actions": ["SHOW TABLES", "blocked"], "observations": ["[]"],
                                                   "rewards": [0, 0], "valid_action": [True]}}  # fmt: skip
    raw = json.dumps({"0": sql, "1": dead, "2": late}).encode()
    palm = [json.loads(x) for x in build_corpus.CONVERTERS["intercode-palm-chat"](raw, _other_context()).splitlines()]
    hf = [json.loads(x) for x in build_corpus.CONVERTERS["intercode-hf-chat"](raw, _other_context()).splitlines()]
    assert [r["id"] for r in palm] == [r["id"] for r in hf] == ["dev_spider-3", "dev_spider-5"]
    assert [m["content"] for m in palm[0]["messages"][:2]] == [
        "You are a helpful assisstant", 'Use a MySQL Database system.Query: "how many?".'
    ]  # fmt: skip
    assert [m["content"] for m in hf[0]["messages"][:2]] == [
        "You are an expert in Bash.", 'You get a task in SQL.\nQuery: "how many?".'
    ]  # fmt: skip
    fifty = "[" + ", ".join(f"({i},)" for i in range(50)) + "]"
    returns = [m["content"] for m in palm[0]["messages"] if m["role"] == "tool"]
    assert returns[:3] == [
        f"Output: {fifty}\nReward: 0.5",
        f"Output: {retry}\nReward: 0",
        "Output: No output\nReward: 0",
    ]
    replies = [m["content"] for m in palm[0]["messages"] if m["role"] == "assistant"]
    assert replies[1] == "I cannot" and replies[3] == "```SQL SELECT" and replies[4] == "```SQL\nSELECT k FROM t\n```"
    assert [m["role"] for m in palm[1]["messages"]] == ["system", "user", "assistant"]
    path = tmp_path / "x.jsonl"
    path.write_bytes(build_corpus.CONVERTERS["intercode-hf-chat"](raw, _other_context()))
    run, short = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool_status for t in run.turns] == ["ok", "error", "ok", "error", None] and len(short.turns) == 1
    assert run.prompt_tokens == _b4("You are an expert in Bash.") + _b4('You get a task in SQL.\nQuery: "how many?".')


def test_intercode_palm_sql_runs_with_the_tables_given_put_them_in_the_first_text(build_corpus, tmp_path) -> None:
    """PaLM's SQL runs with the tables given: both policies put the tables text (`handicap_sql`, the task's record
    in the run's dataset) between the system prompt and the query of their first text (`add_to_dialogue`), the chat
    after its default context, the completion in the one prompt that every call repeats (its returns are as
    without the tables); a dataset whose record there is another query is an error."""
    run = _intercode_run("ic_sql", "./data/spider/dev_spider.json", [
        ("SELECT a FROM t", "[(1,)]", 0.5, True), ("SELECT a, b FROM t", "[(1, 2)]", 1.0, True),
    ])  # fmt: skip
    other = {"query": "who?", "db_tables": {"u": ["c"]}}
    dataset = [other, other, other, {"query": "how many?", "db_tables": {"t": ["a", "b"]}}]
    spider = "data/spider/dev_spider.json"
    context = {**_other_context(), spider: json.dumps(dataset).encode()}
    raw = json.dumps({"0": run}).encode()
    tables = "MySQL tables, with their properties\n- t: ['a', 'b']\n"
    chat = json.loads(build_corpus.CONVERTERS["intercode-palm-chat-tables"](raw, context))
    assert [m["content"] for m in chat["messages"][:2]] == [
        "You are a helpful assisstant", f'Use a MySQL Database system.{tables}Query: "how many?".'
    ]  # fmt: skip
    plain = json.loads(build_corpus.CONVERTERS["intercode-completion-palm"](raw, context))
    data = build_corpus.CONVERTERS["intercode-completion-palm-tables"](raw, context)
    completion = json.loads(data)
    prompt = f'Write SQL.\n{tables}Query: "how many?"\n'
    assert completion["messages"][0] == {"role": "user", "content": prompt}
    assert completion["messages"][1:] == plain["messages"][1:]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    (traj,) = import_files("openai", [path], tokenizer="bytes4")
    assert traj.prompt_tokens == _b4(prompt) and len(traj.turns) == 2
    context[spider] = json.dumps(dataset[:3] + [other]).encode()
    for name in ("intercode-palm-chat-tables", "intercode-completion-palm-tables"):
        with pytest.raises(ValueError, match="not the run's query"):
            build_corpus.CONVERTERS[name](raw, context)


def _react_run(task: int, steps: list[tuple[str, str, str, bool | None]], reward: float) -> dict:
    thoughts, actions, observations, valid = (list(x) for x in zip(*steps, strict=True))
    history = {"thoughts": thoughts, "actions": actions, "observations": observations, "rewards": [0] * len(steps)}
    return {"environment": "ic_sql", "dataset": "./data/spider/dev_spider.json", "task_id": task, "query": "how many?",
            "turn_history": {**history, "valid_action": valid}, "summary": {"max_reward": reward}}  # fmt: skip


def test_intercode_react_runs_are_the_prompt_each_step_sent(build_corpus, tmp_path) -> None:
    """InterCode's ReAct runs: the prompt is the template's instruction, the language's demonstrations (a module dict,
    read with `ast`), the question and `Thought 1:`; each step's completion its thought and action, each return the
    observation and the next `Thought i:`, so that the messages before each reply are the text eval_react.py sent.
    An action without `execute[...]` is an error; the harness's own submit after the last step and the observation
    after the last step are dropped; the reward is the run's."""
    no_code = "Error executing query: Your last `execute` action did not contain sql code"
    done = _react_run(3, [
        ("I look.", "execute[SHOW TABLES]", "[('t',)]", True), ("Ask.", "what?", no_code, True),
        ("Count.", "execute[SELECT COUNT(*) FROM t]", "[(2,)]", True), ("Done.", "submit", "[(2,)]", True),
    ], 1.0)  # fmt: skip
    gave_up = _react_run(4, [
        ("I look.", "execute[SHOW TABLES]", "[('t',)]", True), ("EXCEEDED MAX TURNS: submit", "submit", "[]", True),
    ], 0.0)  # fmt: skip
    raw = json.dumps({"0": done, "1": gave_up}).encode()
    data = build_corpus.CONVERTERS["intercode-react"](raw, _other_context())
    first, second = (json.loads(line) for line in data.decode().splitlines())
    prompt = "Use a MySQL Database system with SQL. Examples:\nQuestion: q1\nAction 1: execute[SHOW TABLES]\n"
    prompt += "Question: how many?"
    sent, texts = prompt, []  # the text eval_react.py sent before each step
    h = done["turn_history"]
    for i, (thought, action, obs) in enumerate(zip(h["thoughts"], h["actions"], h["observations"]), start=1):
        texts.append(sent + f"Thought {i}:")
        sent += f"Thought {i}: {thought}\nAction {i}: {action}\nObservation {i}: {obs}\n"
    messages = first["messages"]
    before = ["".join(m["content"] for m in messages[:i]) for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert before == texts and first["reward"] == 1.0
    assert [m["content"] for m in second["messages"]] == [
        prompt + "Thought 1:",
        " I look.\nAction 1: execute[SHOW TABLES]",
    ]
    assert second["reward"] == 0.0
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    run, short = import_files("openai", [path], tokenizer="bytes4")
    assert [t.tool_status for t in run.turns] == ["ok", "error", "ok", None] and [t.tool for t in short.turns] == [None]
    assert run.prompt_tokens == _b4(prompt + "Thought 1:")


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


# held-out sources of fewer than 100 trajectories: the whole run, where it is that small
FEWER_RUNS = {"intercode-ctf-gpt4": 93}  # InterCode's CTF run: 93 of the benchmark's 100 tasks, all it logged


def test_held_out_sources_are_apart_and_complete() -> None:
    """Every held-out source loads with the count and provenance its manifest states (repository, commit, licence,
    sha256 per file), has >= 100 trajectories (or exactly the count `FEWER_RUNS` states), and none of them is in
    the manifest that the router's tests read."""
    manifest = load_manifest(HELD_OUT)
    corpus = load_corpus(HELD_OUT)
    gated = {s["name"] for s in load_manifest()["sources"]}
    assert manifest["sources"] and not gated & set(corpus)
    for src in manifest["sources"]:
        trajs = corpus[src["name"]]
        assert src["held_out"] and src["licence"] and src["repo"] and len(trajs) == src["trajectories"]
        assert len(trajs) == FEWER_RUNS[src["name"]] if src["name"] in FEWER_RUNS else len(trajs) >= 100
        assert sum(f["trajectories"] for f in src["files"]) == len(trajs)
        for f in src["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and re.fullmatch(r"[0-9a-f]{40}", f["commit"])
        assert all(t.extra["source"] == src["name"] and t.turns for t in trajs)
        assert {t.extra["origin"]["path"] for t in trajs} <= {f["path"] for f in src["files"]}


# -- the default router on the held-out search agents (docs/routing.md, "Held-out search agent") -------------------
# Never tuned on. At 616dbdd the default beat the best baseline by >= 5 points on all five but moved 14.4 % and
# 14.0 % of the tokens on FireAct GPT-3.5 and Llama-2-13B (their files come in order of length: each chunk longer
# than the last, so the price learnt on the last steps is always too low). The migration ceiling (12 % of the
# tokens seen, every move of the run) was added after that and meets the bound everywhere; it costs Reflexion's
# ReAct one run of 138 (72 -> 71 single-shot right against the predictor's 65), below the 5 points, and the budget
# that targets the run's share (repay, hold_first) one more (+3.6): strict xfail, so that a router change that
# wins it back shows here (XPASS) and the mark is updated.
# InterCode's CTF run with GPT-4 (added later, never tuned on) misses it too: +1.1 in file order (31.2 % against
# fcfs's 30.1 %, 8.7 % moved), -4.3 / -0.5 / +4.3 over 10 random orders (scripts/eval_corpus.py --orders 10).
# MedAgentBench's AgentBench runs (added later, never tuned on: clinical-records agents on a FHIR API, 100 runs
# each, a ~3.3K-token prompt and one or two calls) miss it with GPT-4o (+2.0 in file order, 6.7 % moved) and
# DeepSeek-V3 (+1.0, 11.2 % moved); GPT-4o-mini (+15.0) and Llama-3.3-70B (+5.0 exactly, 30 vs 25) meet it.
# InterCode's runs of the other models and its ReAct runs (added later still, never tuned on): eight of ten
# meet it in file order; text-davinci-003 on Bash misses it, as a multi-turn completion agent (+1.0: its runs end in
# one turn or use all ten, and all ten say nothing at admission of how much output they will get) and as ReAct
# (-1.0: a 1.9K-token few-shot prompt is 86 % of each run and every move carries it).
MISSES_MARGIN = {
    "reflexion-react-davinci003-hotpotqa": "+3.6 points (two runs of 138 short of +5.1)",
    "intercode-ctf-gpt4": "+1.1 points (29 of 93 runs single-shot right against fcfs's 28)",
    "medagentbench-gpt4o": "+2.0 points (29 of 100 runs single-shot right against mlfq's 27)",
    "medagentbench-deepseek-v3": "+1.0 point (26 of 100 runs single-shot right against mlfq's 25)",
    "intercode-bash-davinci003": "+1.0 point (52 of 199 runs single-shot right against mlfq's 50)",
    "intercode-bash-react-davinci003": "-1.0 point (62 of 200 runs single-shot right against the predictor's 64)",
}


@pytest.fixture(scope="module")
def held_out_scores():
    from libra.scheduling.sources import quantile_buckets, score_source

    return {name: score_source(t, quantile_buckets(t), {"default": {}}) for name, t in load_corpus(HELD_OUT).items()}


def _held_out_params():
    for src in load_manifest(HELD_OUT)["sources"]:
        reason = MISSES_MARGIN.get(src["name"])
        marks = [pytest.mark.xfail(strict=True, reason=f"misses the 5 points: {reason}")] if reason else []
        yield pytest.param(src["name"], marks=marks, id=src["name"])


@pytest.mark.parametrize("name", list(_held_out_params()))
def test_default_beats_baselines_on_held_out_search_agents(held_out_scores, name) -> None:
    """The accuracy half of the issue's target: the default beats the best of fcfs, mlfq, predictor and
    most-common by >= 5 points (measured with the recent admission expert, 2026-12-06: +35.1, +31.7, +29.4 on
    FireAct, +3.6 on Reflexion's ReAct, +13.5 on WebDancer; +7.2 on ReAct's WebShop agent, +7.0 on its FEVER agent,
    +5.0 / +8.2 / +6.8 / +8.3 on InterCode's Bash and SQL runs with GPT-4 / GPT-3.5, +13.4 / +10.3 on its Python
    runs, +14.3 on its SQL run with the tables given (GPT-3.5) and +1.1 on its CTF run with GPT-4 (strict xfail),
    added later and never tuned on; +2.0 / +15.0 / +1.0 / +5.0 on MedAgentBench's runs with GPT-4o / GPT-4o-mini /
    DeepSeek-V3 / Llama-3.3-70B, the first and third strict xfails, added later still; on InterCode's other models
    +1.0 / +11.0 / +13.6 / +6.6 on Bash and +7.5 / +9.2 / +11.2 / +10.3 on SQL with text-davinci-003 / text-bison /
    chat-bison / StarChat, and -1.0 / +6.9 on its ReAct runs on Bash / SQL, the two Bash misses strict xfails; +5.9
    on Moatless Tools' SWE-bench Lite runs with Claude 3.5 Sonnet, a coding agent, added later still; +11.8 / +12.7
    on InterCode's PaLM SQL runs with the tables given, text-bison / chat-bison, added last)."""
    from libra.scheduling.sources import BASELINES, TARGET_MARGIN, meets_target

    res = held_out_scores[name]
    gap = res["default"].routing_accuracy - max(res[b].routing_accuracy for b in BASELINES)
    assert meets_target(gap, 0.0), f"{gap:+.4f} < {TARGET_MARGIN}"  # (InterCode Bash / GPT-4: +5.0 exactly, 69 vs 59)


def test_default_migration_bound_on_held_out_search_agents(held_out_scores) -> None:
    """The migration half: <= 12 % of the tokens moved on every held-out source (measured 8.3 %, 8.9 %, 7.8 % on
    FireAct, 6.7 % on Reflexion, 8.4 % on WebDancer, 7.9 % on WebShop, 8.3 % on FEVER, 7.9-9.9 % on InterCode,
    6.7-11.2 % on MedAgentBench, 7.4-9.2 % on InterCode's other models and ReAct, 7.5 % on Moatless, 8.9 % and 8.5 %
    on the PaLM SQL runs with the tables given; 14.4 % and 14.0 % on the first two before the ceiling, 11.8 % and
    11.9 % before the recent admission expert)."""
    from libra.scheduling.sources import MAX_MIGRATED

    for name, res in held_out_scores.items():
        assert res["default"].migrated_token_fraction <= MAX_MIGRATED, name


# -- the coding agents' second bucket set (scripts/eval_corpus.py's CODING_BUCKETS, the issue's buckets for coding
# agents: 1:8000,2:16000,4:32000,8:inf) on the held-out coding sources; a unit that misses the target in file order
# is a strict xfail here, with its measured figure (none so far: Moatless / Claude 3.5 Sonnet, +7.1 and 7.2 % moved)
CODING_MISSES_MARGIN: dict[str, str] = {}


def _held_out_coding_params():
    for src in load_manifest(HELD_OUT)["sources"]:
        if src["kind"].startswith("coding"):
            reason = CODING_MISSES_MARGIN.get(src["name"])
            marks = [pytest.mark.xfail(strict=True, reason=f"misses the target: {reason}")] if reason else []
            yield pytest.param(src["name"], marks=marks, id=src["name"])


@pytest.mark.parametrize("name", list(_held_out_coding_params()))
def test_default_meets_the_target_on_held_out_coding_agents_with_fixed_buckets(name) -> None:
    """Both halves of the target on the held-out coding agents with the fixed buckets the issue names for them
    (measured 2026-12-06: Moatless Tools / claude-3-5-sonnet-20241022 on SWE-bench Lite +7.1 points over mlfq,
    7.2 % of the tokens moved)."""
    from libra.scheduling.sources import BASELINES, MAX_MIGRATED, meets_target, score_source
    from libra.spec import parse_buckets

    buckets = parse_buckets(load_script("eval_corpus").CODING_BUCKETS)
    res = score_source(load_corpus(HELD_OUT)[name], buckets, {"default": {}})
    gap = res["default"].routing_accuracy - max(res[b].routing_accuracy for b in BASELINES)
    moved = res["default"].migrated_token_fraction
    assert meets_target(gap, moved), f"{gap:+.4f} points, {moved:.1%} moved (target {MAX_MIGRATED:.0%})"
