"""The corpus's InterCode conversions (scripts/corpus_intercode.py, through scripts/build_corpus.py): each logged
run restated as the chat or completion calls its policy sent, from the repository's templates (read with `ast`),
and read back by the importer with the tokens it counts."""

from __future__ import annotations

import json

import pytest

from libra.workloads.importers import import_files
from tests.workloads.corpus_tokens import b4 as _b4

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
