"""InterCode's logged runs (princeton-nlp/intercode `data/results/`) as chat-completions message lists, for
scripts/build_corpus.py: the logs keep the commands, observations and rewards, and the converters restate the rest
(the prompt, each reply's fence, each return's text) from the repository's templates, read with `ast` and never run
(docs/corpus.md, "InterCode"). Loaded by build_corpus.py from beside it; `CONVERTERS` names them."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path


def string_constants(source: str) -> dict[str, str]:
    """Module-level string constants of a Python file, read with `ast` (the file is parsed, never run)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.update((t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name))
    return out


# InterCode's multi-turn runs (experiments/eval_n_turn.py, ChatGPTPolicy): per environment, the language and the
# setting the script gives the template (SETTING_MAP) and the template class of the runs: scripts/expr_multi_turn.sh
# passes `--template v2` (TemplateV2) with `--env bash`, `--template game_sql` (TemplateSQLGame) with `--env sql`,
# `--template ctf` (TemplateCTF) with `--env ctf` and `--template function` (TemplateCodeFunction) with `--env python`
_INTERCODE = {
    "ic_bash": ("BASH", "Bourne Shell", "TemplateV2"),
    "ic_sql": ("SQL", "MySQL Database", "TemplateSQLGame"),
    "ic_ctf": ("CTF", "Capture the Flag", "TemplateCTF"),
    "ic_python": ("PYTHON", "Python 3 Interpreter", "TemplateCodeFunction"),
}
# the environments whose template asks for bare code and whose parser reads no fence (ctf_parser, python_parser): the
# reply is the logged action as it is
_IC_BARE = {"ic_ctf", "ic_python"}
_IC_PROMPTS = "experiments/utils/prompts.py"  # the file of the template classes (a source's `context`)
_IC_TEXT_LIMIT, _IC_ROW_LIMIT = 1000, 50  # ChatGPTPolicy's cut of an observation: a text's characters, a list's rows
_IC_WRONG_FLAG = "Submitted flag is incorrect. Keep trying!"  # eval_n_turn.py's observation for a wrong CTF flag
# the observations eval_n_turn.py gives a Python function that failed MBPP's tests (the three SHOW_FAILED_CASE
# settings: the runs logged all three) and PythonEnv's for an action it could not run
_IC_PYTHON_FAILED = re.compile(
    r"Test case did not pass\.|Failed \d+/\d+ Test Cases\.|Failed Test Case: |Error executing "
)


def _template_methods(source: str, name: str) -> dict[str, ast.FunctionDef]:
    """The methods of class NAME of a Python file, with those it inherits from classes of the same file (the
    nearest definition wins), read with `ast` (the file is parsed, never run)."""
    classes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
    methods: dict[str, ast.FunctionDef] = {}
    todo = [name]
    while todo:
        cls = classes[todo.pop(0)]
        for node in cls.body:
            if isinstance(node, ast.FunctionDef):
                methods.setdefault(node.name, node)
        todo += [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
    return methods


def _expr_text(node: ast.expr, env: dict[str, str]) -> str:
    """A string constant, an f-string filled from ENV, or a name ENV holds (keys are the expressions' source text:
    `self.language`, `query`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_expr_text(v.value if isinstance(v, ast.FormattedValue) else v, env) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # `f"""...""" + DEMO_CTF`
        return _expr_text(node.left, env) + _expr_text(node.right, env)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant):
        return _expr_text(node.left, env) * int(node.right.value)  # TemplateV1's rule, `"-"*10`
    return env[ast.unparse(node)]


def _string_test(node: ast.expr, env: dict[str, str]) -> bool | None:
    """The value of a test that compares an expression ENV holds with a string (`observation != ""`); None for any
    other test (it is not read)."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq | ast.NotEq)):
        return None
    right = node.comparators[0]
    if not (isinstance(right, ast.Constant) and isinstance(right.value, str) and ast.unparse(node.left) in env):
        return None
    return (env[ast.unparse(node.left)] == right.value) == isinstance(node.ops[0], ast.Eq)


def _body_text(body: list[ast.stmt], env: dict[str, str]) -> str | None:
    """What a block of a template method returns, or None where it returns nothing (see `_method_text`)."""
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Tuple)
            and isinstance(stmt.targets[0], ast.Tuple)
        ):
            values = [_expr_text(v, env) for v in stmt.value.elts]  # `a, b = x["a"], x["b"]`
            env.update(zip((ast.unparse(t) for t in stmt.targets[0].elts), values, strict=True))
        elif isinstance(stmt, ast.Assign):
            value = _expr_text(stmt.value, env)
            env.update((ast.unparse(t), value) for t in stmt.targets)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):  # TemplateV1's growing history
            key = ast.unparse(stmt.target)
            env[key] = env[key] + _expr_text(stmt.value, env)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            return _expr_text(stmt.value, env)
        elif isinstance(stmt, ast.If) and (test := _string_test(stmt.test, env)) is not None:
            got = _body_text(stmt.body if test else stmt.orelse, env)
            if got is not None:
                return got
    return None


def _method_text(fn: ast.FunctionDef, env: dict[str, str]) -> str:
    """What a template method returns: its assignments (`self.query = query`, an f-string into `self.explore_msg`,
    a tuple of a dict's items, `+=` onto TemplateV1's `self.message_history`) update ENV (so a template's state
    carries from one call to the next, as the object's did), its `return` is filled from ENV, an `if` that compares
    a value with a string (TemplateCTF's `observation != ""`) takes its branch. Other statements are not read: the
    one such statement of the templates used, the "No output" of TemplateV2 / V4 for an empty observation (an
    `isinstance` test), is restated by the caller."""
    text = _body_text(fn.body, env)
    if text is None:
        raise ValueError(f"template method {fn.name} returns no string")
    return text


def _first_rows(text: str, n: int) -> str:
    """The repr of a list of rows (`[(...), (...)]`, as the SQL runs log a query's result) cut to its first N rows,
    as the repr of the cut list would read: the list's own separators are the commas outside quotes at depth 1."""
    depth, quote, escaped, rows = 0, "", False, 0
    for i, c in enumerate(text):
        if quote:
            escaped, quote = (not escaped and c == "\\"), ("" if c == quote and not escaped else quote)
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 1:
            rows += 1
            if rows == n:
                return text[:i] + "]"
    return text


def _intercode_observation(text: str, rows: bool, limit: int = _IC_TEXT_LIMIT) -> str:
    """An observation as the policy sent it: a list of rows cut to 50 rows, a text to LIMIT characters (1,000; the
    completion policy of text-davinci-003 500); an empty one is "No output" (TemplateV2.get_obs_msg, the completion
    policies themselves)."""
    if rows:
        return "No output" if text == "[]" else _first_rows(text, _IC_ROW_LIMIT)
    return text[:limit] or "No output"


def _ic_observation(environment: str, text: str) -> str:
    """The observation that went into the template's `get_obs_msg`. CTF: a text cut to 1,000 characters (the
    template itself says "No output" for an empty one). Python: the interpreter's `{'output', 'error'}` dict (its
    repr is what the log holds and what the f-string writes; the policy cuts only texts) as logged, a text cut to
    1,000 characters; TemplateCodeFunction's substitute for an empty observation is not restated (no run logged
    one). Bash and SQL: `_intercode_observation`."""
    if environment == "ic_ctf":
        return text[:_IC_TEXT_LIMIT]
    if environment == "ic_python":
        if not text:
            raise ValueError("an empty Python observation: TemplateCodeFunction's substitute for it is not restated")
        return text if text.startswith("{") else text[:_IC_TEXT_LIMIT]
    return _intercode_observation(text, environment == "ic_sql" and text.startswith("["))


def _ic_failed(environment: str, text: str, valid: bool | None) -> bool:
    """Whether a return is an error. Bash, SQL and CTF commands: the run logged the action invalid (a non-zero exit
    code, a failed query, a reply without code); CTF also a wrong flag (`_IC_WRONG_FLAG`). Python (the runs log no
    validity): a failed test, an action the interpreter could not run, or an output whose `error` is not empty."""
    if environment == "ic_python":
        if _IC_PYTHON_FAILED.match(text):
            return True
        try:
            out = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return False
        return isinstance(out, dict) and bool(out.get("error"))
    return valid is not True or (environment == "ic_ctf" and text == _IC_WRONG_FLAG)


def _sql_tables(record: dict) -> str:
    """The second system message of an SQL run with the tables given (`--handicap`): the database's tables and their
    columns from the task's record (experiments/utils/utils.py `handicap_sql`, restated: it is a loop)."""
    lines = [f"- {name}: {columns}\n" for name, columns in record["db_tables"].items()]
    return "MySQL tables, with their properties\n" + "".join(lines)


def _ic_tables(rec: dict, context: dict[str, bytes]) -> str:
    """The tables text of a run with the tables given (`_sql_tables`): that of the task's record in the run's
    dataset (a file of CONTEXT, by the path the run logged) at the run's task index, which must be the run's query."""
    dataset = json.loads(context[rec["dataset"].removeprefix("./")])
    if dataset[rec["task_id"]]["query"] != rec["query"]:
        raise ValueError(f"task {rec['task_id']} of {rec['dataset']} is not the run's query {rec['query']!r}")
    return _sql_tables(dataset[rec["task_id"]])


def _intercode_messages(data: bytes, context: dict[str, bytes], tables: bool = False) -> bytes:
    """InterCode's multi-turn result files (task index -> `query`, `turn_history {actions, observations, rewards,
    valid_action}`, `summary.max_reward`) as chat-completions message lists. The log holds the command parsed from
    each reply and the environment's whole output; the messages restate what the model saw and wrote from the
    template class of the runs (`_INTERCODE`, read from `prompts.py` with `ast`, with the file's string constants:
    TemplateCTF's demonstrations): the system prompt (`get_init_msg`) and the query (`get_query_msg`), then per
    turn the reply, the command in the code fence the template asks for (Bash, SQL; a reply with no code, answered
    by `get_retry_msg`, is logged whole: it is the reply) or as logged (CTF, Python: `_IC_BARE`), and a `tool`
    message (`get_obs_msg`: the observation as the policy passed it, `_ic_observation`, the reward, for Bash, SQL
    and Python the query again) named after the language, an error as `_ic_failed` says. The observation after the
    last turn goes to no model and is dropped; an action logged `blocked` (the API call failed) has no observation
    and no reply. With TABLES (the SQL runs with the tables given), the policy's second system message, the task's
    tables and columns (`_sql_tables`), comes after the first; the task's record is that of the run's dataset (a
    file of CONTEXT, by the path the run logged) at the run's task index."""
    source = context[_IC_PROMPTS].decode("utf-8")
    constants = string_constants(source)
    out = []
    for rec in json.loads(data.decode("utf-8")).values():
        environment = rec["environment"]
        language, setting, template = _INTERCODE[environment]
        methods = _template_methods(source, template)
        env = {**constants, "self.language": language, "self.setting": setting, "query": rec["query"]}
        retry = _method_text(methods["get_retry_msg"], env)
        messages: list[dict] = [
            {"role": "system", "content": _method_text(methods["get_init_msg"], env)},
            {"role": "user", "content": _method_text(methods["get_query_msg"], env)},
        ]
        if tables:
            messages.insert(1, {"role": "system", "content": _ic_tables(rec, context)})
        h = rec["turn_history"]
        for action, obs, reward, valid in zip(h["actions"], h["observations"], h["rewards"], h["valid_action"]):
            bare = obs == retry or environment in _IC_BARE
            messages.append({"role": "assistant", "content": action if bare else f"```{language}\n{action}\n```"})
            env.update(observation=_ic_observation(environment, obs), reward=str(reward))
            text = _method_text(methods["get_obs_msg"], env)
            failed = _ic_failed(environment, obs, valid)
            messages.append({"role": "tool", "name": language.lower(), "content": text, "is_error": failed})
        out.append(_ic_line(rec, messages))
    return ("\n".join(out) + "\n").encode()


def _ic_line(rec: dict, messages: list[dict]) -> str:
    """One InterCode run as a trace line: its messages less the returns after the last reply (the run ended; they
    went to no model), named by its dataset and task, rewarded with the run's best reward."""
    while messages[-1]["role"] == "tool":
        messages.pop()
    task = f"{Path(rec['dataset']).stem}-{rec['task_id']}"
    return json.dumps({"id": task, "reward": float(rec["summary"]["max_reward"]), "messages": messages})


# The other policies of InterCode's multi-turn runs (experiments/policies.py at 69922e2): per policy, the
# template class (PROMPT_MAP's own comments: `v1` "GPT, Palm completion", `v2` "GPT, Palm chat, Vicuna", `v4`
# "Starchat"; scripts/expr_n_turn_others.sh runs `--template v4`), the policy's cut of a text observation
# (`response_limit`) and the shape of what each call sent: `completion` one text that the template rebuilds every
# turn (CompletionGPTPolicy, PalmCompletionPolicy), `palm-chat` a PaLM chat with the system prompt and the query as
# its first message (PalmChatPolicy), `hf-chat` a chat whose first message is a fixed system line and whose second
# is the system prompt and the query (HFChatPolicy)
_IC_OTHER = {
    "completion-gpt": ("completion", "TemplateV1", 500),
    "completion-palm": ("completion", "TemplateV1", 1000),
    "palm-chat": ("palm-chat", "TemplateV2", 1000),
    "hf-chat": ("hf-chat", "TemplateV4", 1000),
}
_IC_PALM_CONTEXT = "You are a helpful assisstant"  # PalmChat.init_chat's default `context` (palm_api.py), sic
_IC_HF_SYSTEM = "You are an expert in Bash."  # HFChatPolicy's first message, on SQL too
# the retry message that the runs of text-davinci-003 and PaLM logged for a reply without SQL code (48, 7 and 25
# turns), not the commit's `get_retry_msg`: the code that ran them was older than the commit that added them
_IC_OLD_RETRY = "Format your {0} command as follows:\n```{0}\nYour {0} code here\n```\n"
_IC_DIALOGUE = ("dialogue['actions']", "dialogue['observations']", "dialogue['reward']")  # TemplateV1's reads


def _ic_turns(rec: dict, limit: int, retry: str) -> list[tuple[str, str, str, str, bool]]:
    """(reply, logged action, observation as the policy passed it, reward, failed) per logged turn of a Bash or SQL
    run: the rules of `_intercode_messages` with the policy's cut of a text (LIMIT); a reply answered by either retry
    message (the commit's, `_IC_OLD_RETRY`) is counted as logged."""
    environment, h = rec["environment"], rec["turn_history"]
    language = _INTERCODE[environment][0]
    out = []
    for action, obs, reward, valid in zip(h["actions"], h["observations"], h["rewards"], h["valid_action"]):
        reply = action if obs in (retry, _IC_OLD_RETRY.format(language)) else f"```{language}\n{action}\n```"
        seen = _intercode_observation(obs, environment == "ic_sql" and obs.startswith("["), limit)
        out.append((reply, action, seen, str(reward), _ic_failed(environment, obs, valid)))
    return out


def _inserted(before: str, after: str) -> str:
    """What AFTER holds that BEFORE does not, where AFTER is BEFORE with one piece of text put in somewhere: the rest
    once the longest common prefix and suffix (together at most BEFORE) are taken off."""
    start, most = 0, min(len(before), len(after))
    while start < most and before[start] == after[start]:
        start += 1
    end = 0
    while end < most - start and before[-1 - end] == after[-1 - end]:
        end += 1
    return after[start : len(after) - end]


def _ic_completion_returns(methods: dict, env: dict[str, str], turns: list) -> list[str]:
    """The returns of a completion policy's run: each call sent the first prompt and `get_obs_msg` of the turns so
    far (TemplateV1: the instruction, every earlier action, output and reward as `- Action:` / `- Output:` / `-
    Reward:` lines, and `Output something else.`); a turn's return is what the next call's text gains (the first:
    the whole message), less the action of its `- Action:` line, which the reply before it stands for."""
    returns, before = [], ""
    for _, action, seen, reward, _ in turns:
        probe = {**env, **dict(zip(_IC_DIALOGUE, ("", seen, reward)))}  # the message with the action left out
        returns.append(_inserted(before, _method_text(methods["get_obs_msg"], probe)))
        env.update(zip(_IC_DIALOGUE, (action, seen, reward)))
        before = _method_text(methods["get_obs_msg"], env)
    return returns


def _intercode_other_messages(data: bytes, context: dict[str, bytes], policy: str, tables: bool = False) -> bytes:
    """InterCode's Bash and SQL runs of the other models (text-davinci-003, PaLM, StarChat) as chat-completions
    message lists, restated as `_intercode_messages` restates the GPT runs, with the policy's own prompt (`_IC_OTHER`):
    `completion` one user message (`get_init_msg` then `get_query_msg`), each reply, and as its return what the next
    call's text gained (`_ic_completion_returns`); `palm-chat` the chat's context (`_IC_PALM_CONTEXT`) and one user
    message of the system prompt and the query; `hf-chat` the fixed system line (`_IC_HF_SYSTEM`) and that user
    message; the chats' returns are `get_obs_msg(observation, reward)`. The observation after the last turn goes to
    no model and is dropped; a run whose first call failed (logged `blocked`: PaLM chat's, 7 of 198 on Bash) has no
    turn and is left out. With TABLES (the PaLM SQL runs with the tables given), the policy's `handicap` (the
    task's tables and columns, `_ic_tables`) goes between the system prompt and the query of that first text: the
    PaLM policies' `add_to_dialogue` keeps it for the first call, which every later completion call repeats."""
    shape, template, limit = _IC_OTHER[policy]
    source = context[_IC_PROMPTS].decode("utf-8")
    methods = _template_methods(source, template)
    out = []
    for rec in json.loads(data.decode("utf-8")).values():
        language, setting, _ = _INTERCODE[rec["environment"]]
        env = {**string_constants(source), "self.language": language, "self.setting": setting, "query": rec["query"]}
        retry = _method_text(methods["get_retry_msg"], env)
        handicap = _ic_tables(rec, context) if tables else ""
        first = _method_text(methods["get_init_msg"], env) + handicap + _method_text(methods["get_query_msg"], env)
        head = {"completion": [], "palm-chat": [_IC_PALM_CONTEXT], "hf-chat": [_IC_HF_SYSTEM]}[shape]
        messages = [*({"role": "system", "content": text} for text in head), {"role": "user", "content": first}]
        turns = _ic_turns(rec, limit, retry)
        if not turns:  # the first call failed (`blocked`): the model wrote nothing
            continue
        if shape == "completion":
            returns = _ic_completion_returns(methods, env, turns)
        else:
            env_of = [{**env, "observation": seen, "reward": reward} for _, _, seen, reward, _ in turns]
            returns = [_method_text(methods["get_obs_msg"], e) for e in env_of]
        for (reply, _, _, _, failed), text in zip(turns, returns, strict=True):
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "tool", "name": language.lower(), "content": text, "is_error": failed})
        out.append(_ic_line(rec, messages))
    return ("\n".join(out) + "\n").encode()


_IC_REACT_NO_CODE = "Error executing query: Your last `execute` action did not contain {} code"  # eval_react.py's
_IC_REACT_GIVE_UP = "EXCEEDED MAX TURNS: submit"  # eval_react.py's logged thought for the harness's own last submit


def _module_dict(source: str, name: str) -> dict[str, str]:
    """A module-level dict NAME of string keys to string constants of the same file (`DEMO_MAP_REACT`), read with
    `ast`."""
    constants = string_constants(source)
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            items = zip(node.value.keys, node.value.values) if isinstance(node.value, ast.Dict) else ()
            return {ast.literal_eval(k): constants[ast.unparse(v)] for k, v in items}
    raise ValueError(f"no dict {name} of string constants in the file")


def _intercode_react_messages(data: bytes, context: dict[str, bytes]) -> bytes:
    """InterCode's ReAct runs (experiments/eval_react.py: text-davinci-003 completions, TemplateReAct) as
    chat-completions message lists. The script's prompt grows by exactly what each step adds: the prompt is
    `get_init_msg`, the demonstrations (`DEMO_MAP_REACT` of the language, read with `ast`) and `get_query_msg`,
    then `Thought 1:`; each step's completion is ` {thought}\nAction i: {action}` (stopped before `Observation`),
    its return `\nObservation i: {observation}\n` (the log holds the observation as cut, 350 characters or 25 rows)
    and the next `Thought i+1:`. An error: an action the run logged invalid, or one without `execute[...]`
    (`_IC_REACT_NO_CODE`). The harness's own `submit` after the 10th step (`_IC_REACT_GIVE_UP`) and the observation
    after the last step go to no model and are dropped; the reward is the last submit's."""
    source = context[_IC_PROMPTS].decode("utf-8")
    methods = _template_methods(source, "TemplateReAct")
    out = []
    for rec in json.loads(data.decode("utf-8")).values():
        language, setting, _ = _INTERCODE[rec["environment"]]
        env = {"self.language": language, "self.setting": setting, "query": rec["query"]}
        env["DEMO_MAP_REACT[self.language]"] = _module_dict(source, "DEMO_MAP_REACT")[language]
        prompt = "".join(_method_text(methods[m], env) for m in ("get_init_msg", "get_demos", "get_query_msg"))
        messages = [{"role": "user", "content": prompt + "Thought 1:"}]
        h = rec["turn_history"]
        no_code = _IC_REACT_NO_CODE.format(language.lower())
        steps = zip(h["thoughts"], h["actions"], h["observations"], h["valid_action"])
        for i, (thought, action, obs, valid) in enumerate(steps, start=1):
            if thought == _IC_REACT_GIVE_UP:
                break
            messages.append({"role": "assistant", "content": f" {thought}\nAction {i}: {action}"})
            text = f"\nObservation {i}: {obs}\nThought {i + 1}:"
            failed = valid is not True or obs == no_code
            messages.append({"role": "tool", "name": language.lower(), "content": text, "is_error": failed})
        out.append(_ic_line(rec, messages))
    return ("\n".join(out) + "\n").encode()


# InterCode's converters by name (the entries of corpus_sources.py's SOURCES name them in `convert`)
CONVERTERS: dict[str, Callable[..., bytes]] = {
    "intercode": _intercode_messages,
    "intercode-tables": lambda data, context: _intercode_messages(data, context, tables=True),
    **{
        f"intercode-{policy}": (lambda data, context, policy=policy: _intercode_other_messages(data, context, policy))
        for policy in _IC_OTHER
    },
    **{
        f"intercode-{policy}-tables": (
            lambda data, context, policy=policy: _intercode_other_messages(data, context, policy, tables=True)
        )
        for policy in ("completion-palm", "palm-chat")
    },
    "intercode-react": _intercode_react_messages,
}
