"""The converters of the corpus's sources other than InterCode's (scripts/corpus_intercode.py), for
scripts/build_corpus.py, which loads this file from beside it: ToRA outputs, ReAct / FireAct transcripts, text tool
calls (WebDancer), Reflexion's ReAct logs, ReAct's WebShop and FEVER notebooks, MedAgentBench's AgentBench runs and
Moatless Tools trajectories, each as chat-completions message lists (JSON Lines) for `--format openai`.
`CONVERTERS` names them as the sources' `convert` does (scripts/corpus_sources.py)."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import runpy
from collections.abc import Callable
from pathlib import Path

# the string constants of a Python file, read with `ast` (the prompts of Reflexion and of the WebShop notebook):
# corpus_intercode.py's reader, run from beside this file (scripts/ is no package)
_string_constants = runpy.run_path(str(Path(__file__).resolve().with_name("corpus_intercode.py")))["string_constants"]


def _tora_messages(data: bytes) -> bytes:
    """ToRA's output files (one JSON object per problem: `question`, and in `code` the model's output with each
    interpreter result inlined as a ```output block) as chat-completions message lists: the prompt the fine-tuned
    models are given (`<|user|>` question `<|assistant|>`), then assistant turns split at the ```output blocks,
    each block a `tool` message of the `python` tool."""
    out = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        text = rec["code"][0] if isinstance(rec.get("code"), list) and rec["code"] else ""
        messages = [{"role": "user", "content": f"<|user|>\n{rec['question']}\n<|assistant|>\n"}]
        rest = text
        while "```output\n" in rest:
            before, _, after = rest.partition("```output\n")
            result, _, rest = after.partition("\n```")
            messages.append({"role": "assistant", "content": before})
            messages.append({"role": "tool", "name": "python", "content": result})
        messages.append({"role": "assistant", "content": rest})
        out.append(json.dumps({"id": f"gsm8k-{rec['idx']}", "messages": messages}))
    return ("\n".join(out) + "\n").encode()


_REACT_LINE = re.compile(r"^(Thought|Action|Observation)\b[ \d]*:")
_REACT_ACTION = re.compile(r"^Action\b[ \d]*:\s*(\w+)\s*\[", re.M)


def _react_turns(text: str) -> list[tuple[str, str]]:
    """A ReAct transcript (`Thought:` / `Action:` lines written by the model, `Observation:` lines by the
    environment) as `(role, text)` chunks: assistant for the model's lines, tool for the observations."""
    chunks: list[list] = []
    for line in text.split("\n"):
        m = _REACT_LINE.match(line)
        role = ("tool" if m.group(1) == "Observation" else "assistant") if m else (chunks[-1][0] if chunks else "")
        if not role:
            continue
        if chunks and chunks[-1][0] == role:
            chunks[-1][1].append(line)
        else:
            chunks.append([role, [line]])
    return [(role, "\n".join(lines)) for role, lines in chunks]


def _append_react_turns(messages: list[dict], turns) -> None:
    """ReAct (role, text) turns as chat messages: each observation becomes a `tool` message named after the
    action of the model's message before it (`Search[...]` -> `search`; `tool` when none was named)."""
    action = "tool"
    for role, content in turns:
        if role == "assistant":
            acts = _REACT_ACTION.findall(content)
            action = acts[-1].lower() if acts else "tool"
            messages.append({"role": "assistant", "content": content})
        else:
            messages.append({"role": "tool", "name": action, "content": content})


def _react_messages(data: bytes) -> bytes:
    """FireAct's trajectory files (one JSON object, question id -> record with `reward`, `em`, `f1` and `traj`) as
    chat-completions message lists. `traj` is either a message list (the fine-tuned GPT-3.5: the question as the
    user's message, then the model's Thought/Action messages and the environment's `Observation:` messages as
    user messages) or one text (the Llama models: the Alpaca prompt with the question up to `### Response:`, then
    the model's Thought/Action lines with the `Observation:` lines inlined). Observations become `tool` messages
    named after the action before them (`search`); the last observation (after `finish`, or after the last step of
    an agent that ran out of steps) goes to no model and is dropped."""
    out = []
    for qid, rec in json.loads(data.decode("utf-8")).items():
        traj = rec["traj"]
        if isinstance(traj, str):
            head, sep, body = traj.partition("### Response:\n")
            messages = [{"role": "user", "content": head + sep}]
            turns = _react_turns(body)
        else:
            messages = [m for m in traj[:1]]
            turns = [("tool" if m["role"] == "user" else m["role"], m["content"]) for m in traj[1:]]
        _append_react_turns(messages, turns)
        while messages and messages[-1]["role"] == "tool":
            messages.pop()
        out.append(
            json.dumps(
                {
                    "id": f"hotpotqa-{qid}",
                    "reward": float(bool(rec.get("reward"))),
                    "f1": rec.get("f1"),
                    "messages": messages,
                }
            )
        )
    return ("\n".join(out) + "\n").encode()


_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def _qwen_tools_messages(data: bytes) -> bytes:
    """Chat records whose tool calls are written in the text (`<tool_call>{"name": ...}</tool_call>` in the
    assistant's message) and whose tool results come back as user messages (`<tool_response>...`), as in
    WebDancer's sampled trajectories: those user messages become `tool` messages named after the call(s) before
    them (names joined by `+` when one message answers several calls); everything else is kept as it is."""
    out = []
    for n, line in enumerate(data.decode("utf-8").splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        messages: list[dict] = []
        names: list[str] = []
        for m in rec["messages"]:
            text = m.get("content") or ""
            if m["role"] == "assistant":
                names = []
                for call in _TOOL_CALL.findall(text):
                    try:
                        names.append(str(json.loads(call)["name"]))
                    except (ValueError, KeyError, TypeError):
                        names.append("tool")
            if m["role"] == "user" and text.lstrip().startswith("<tool_response>"):
                m = {"role": "tool", "name": "+".join(names) or "tool", "content": text}
            messages.append(m)
        out.append(json.dumps({"id": f"{rec.get('tag', 'task')}-{n}", "messages": messages}))
    return ("\n".join(out) + "\n").encode()


def _reflexion_react_messages(data: bytes, context: dict[str, bytes]) -> bytes:
    """Reflexion's ReAct logs (`100_questions_5_trials.txt`: per trial, every agent's `Question:` and scratchpad of
    `Thought n:` / `Action n:` lines written by the model and `Observation n:` lines by the Wikipedia tool, then
    `Correct answer:`) as chat-completions message lists. The prompt is the agent's template (`REACT_INSTRUCTION`
    with the six examples `WEBTHINK_SIMPLE6`, read from the repository at the same commit) filled with the
    question; each Thought/Action pair is a generation (two completions of the same prompt), each observation a
    `tool` message named after its action (`search`, `lookup`); the verdict after `Finish` and the observation
    after the last step of a halted agent go to no model and are dropped. A later trial lists an agent again;
    identical runs are removed by the script's deduplication."""
    consts: dict[str, str] = {}
    for text in context.values():
        consts.update(_string_constants(text.decode("utf-8")))
    template, examples = consts["REACT_INSTRUCTION"], consts["WEBTHINK_SIMPLE6"]
    out = []
    for block in re.split(r"\n(?=Question: )", data.decode("utf-8")):
        if not block.startswith("Question: "):
            continue
        head, _, rest = block.partition("\n")
        question = head[len("Question: ") :].strip()
        body = re.split(r"\n(?:Correct answer:|-{5,}|#{5,})", rest)[0]
        prompt = template.replace("{examples}", examples).replace("{question}", question).replace("{scratchpad}", "")
        messages: list[dict] = [{"role": "user", "content": prompt}]
        _append_react_turns(messages, _react_turns(body))
        if len(messages) == 1:
            continue
        correct = any("Answer is CORRECT" in m["content"] for m in messages if m["role"] == "tool")
        while messages[-1]["role"] == "tool":
            messages.pop()
        qid = hashlib.sha256(question.encode()).hexdigest()[:12]
        out.append(json.dumps({"id": f"hotpotqa-{qid}", "reward": float(correct), "messages": messages}))
    return ("\n".join(out) + "\n").encode()


_NOTEBOOK_EPISODE = re.compile(r"^-{17}\n(\d+)\n", re.M)
_NOTEBOOK_TALLY = re.compile(r"\n\d+ [\d.e-]+ [\d.e-]+ [\d.e-]+\n-{13}")  # running reward, success, failure
_WEBSHOP_SCORE = re.compile(r"Your score \(min 0\.0, max 1\.0\): ([\d.]+)")


def _webshop_messages(data: bytes) -> bytes:
    """ReAct's WebShop notebook (`WebShop.ipynb`, run with its printed outputs): the cell that runs
    `run_episodes(PROMPT, N)` printed every episode (`-----------------`, its index, then `Action: ...` /
    `Observation: ...` pairs, then the running tally). The prompt is what the model was first given: PROMPT (the
    one-shot example, a string constant of another cell, read with `ast`), the instruction page (the observation of
    `reset`) and `Action:`. Each later action is a generation (one completion, stopped at the line's end), each
    observation a `tool` message named after the action's verb (`search`, `click`, `think`); the page after
    `Buy Now` (the score) goes to no model and is dropped, and so is the last observation of an agent halted at its
    15 steps (its last completion was not printed). The reward is the score (0 when none was printed)."""
    cells = json.loads(data.decode("utf-8"))["cells"]
    consts: dict[str, str] = {}
    for cell in _code_cells(cells):
        try:
            consts.update(_string_constants("".join(cell["source"])))
        except SyntaxError:  # a cell of notebook magics: no prompt there
            continue
    out = []
    for run, text in _notebook_runs(cells, r"run_episodes\((\w+)"):
        parts = _NOTEBOOK_EPISODE.split(text)
        for idx, body in zip(parts[1::2], parts[2::2], strict=True):
            out.append(json.dumps(_webshop_episode(f"fixed_{idx}", consts[run.group(1)], body)))
    return ("\n".join(out) + "\n").encode()


def _code_cells(cells: list[dict]) -> list[dict]:
    return [cell for cell in cells if cell["cell_type"] == "code"]


def _notebook_runs(cells: list[dict], pattern: str) -> list[tuple[re.Match, str]]:
    """`(match, printed text)` of each code cell whose source matches PATTERN: the cell's stdout streams joined (a
    long run's output is saved as many streams; stderr's warnings are not the run's)."""
    runs = []
    for cell in _code_cells(cells):
        if run := re.search(pattern, "".join(cell["source"])):
            outputs = cell.get("outputs", ())
            runs.append((run, "".join("".join(o.get("text", "")) for o in outputs if o.get("name") == "stdout")))
    return runs


def _webshop_episode(task: str, prompt: str, body: str) -> dict:
    """One printed WebShop episode (`Action: a` / `Observation: o` pairs, the first action `reset`) as a record."""
    steps = [s.partition("\nObservation: ") for s in re.split(r"(?:\A|\n\n)Action: ", _NOTEBOOK_TALLY.split(body)[0])]
    (_, _, page), *rest = steps[1:]
    messages = [{"role": "user", "content": f"{prompt}{page}\n\nAction:"}]
    reward = 0.0
    for action, _, observation in rest:
        verb = re.match(r"\s*(\w+)\[", action)
        messages.append({"role": "assistant", "content": f" {action}"})
        messages.append(
            {
                "role": "tool",
                "name": verb.group(1) if verb else "tool",
                "content": f"\nObservation: {observation}\n\nAction:",
            }
        )
        if score := _WEBSHOP_SCORE.search(observation):
            reward = float(score.group(1))
    while messages[-1]["role"] == "tool":
        messages.pop()
    return {"id": f"webshop-{task}", "reward": reward, "messages": messages}


_FEVER_EPISODE = re.compile(r"\n*(\d+) (.*)\n")  # `print(idx, question)`: the episode's first line
_FEVER_BAD_CALL = re.compile(r"^ohh\.\.\. (.*?)\nThought (\d+): [^\n]*\n(?=Action \2: )", re.M | re.S)


def _fever_messages(data: bytes, context: dict[str, bytes]) -> bytes:
    """ReAct's FEVER notebook (`FEVER.ipynb`, run with its printed outputs): the cell that runs `webthink` on 500
    claims printed each episode (`idx Claim: ...`, then per step `Thought i:` / `Action i:` / `Observation i:` and
    a blank line, then the episode's `info` dict and the running tally, then `-----------`). The prompt is the
    few-shot prompt the notebook names (`prompt_dict['webthink_simple3']`, read from `prompts/fever.json` at the
    same commit) with the claim and a newline. Each Thought/Action pair is a generation (one completion, stopped
    at the next `Observation`; a completion without an `Action` line, printed after `ohh...`, and the second
    completion that gave the action are one generation), each observation a `tool` message named after its action
    (`search`, `lookup`); the verdict after `Finish` and the last observation of an agent halted at 7 steps go to
    no model and are dropped. The reward is the info's exact match (`em`)."""
    cells = json.loads(data.decode("utf-8"))["cells"]
    (prompts,) = (json.loads(text) for text in context.values())
    key = re.search(r"prompt_dict\[['\"](\w+)['\"]\]", "".join("".join(c["source"]) for c in _code_cells(cells)))
    if key is None:
        raise ValueError("no prompt_dict['...'] in the notebook's code: the prompt of its runs is not named")
    out = []
    for _, text in _notebook_runs(cells, r"=\s*webthink\("):
        for episode in re.split(r"\n-{11}\n", text):
            if head := _FEVER_EPISODE.match(episode):
                out.append(json.dumps(_fever_episode(prompts[key.group(1)], head, episode[head.end() :])))
    return ("\n".join(out) + "\n").encode()


def _fever_episode(prompt: str, head: re.Match, body: str) -> dict:
    """One printed FEVER episode (after its first line) as a record."""
    steps, _, info = body.partition("\n{'steps'")
    steps = _FEVER_BAD_CALL.sub(lambda m: f"Thought {m.group(2)}: {m.group(1)}\n", steps)
    steps = re.sub(r"\n\n(?=Thought \d+:)", "\n", steps)  # print()'s own newline after each step's text
    messages: list[dict] = [{"role": "user", "content": f"{prompt}{head.group(2)}\n"}]
    _append_react_turns(messages, _react_turns(steps.strip("\n")))
    while messages[-1]["role"] == "tool":
        messages.pop()
    em = ast.literal_eval("{'steps'" + info.partition("\n")[0].strip()).get("em") if info else None
    return {"id": f"fever-{head.group(1)}", "reward": None if em is None else float(em), "messages": messages}


_MEDAGENT_VERB = re.compile(r"^(GET|POST|FINISH)\b")
_MEDAGENT_ERRORS = ("Error in sending the GET request", "Invalid POST request")


def _medagent_verb(reply: str) -> str:
    """The action of a MedAgentBench reply as the task reads it (`start_sample`: the reply stripped, Gemini's
    ```tool_code fences removed, then its first word): `get`, `post` or `finish`; `tool` for anything else (an
    invalid action, which ends the run, so no return follows it)."""
    text = reply.strip().replace("```tool_code", "").replace("```", "").strip()
    m = _MEDAGENT_VERB.match(text)
    return m.group(1).lower() if m else "tool"


def _medagent_status(overall: bytes) -> dict[int, str]:
    """Task index -> the status AgentBench's `calculate_overall` wrote for it (`completedCorrect`, ...)."""
    return {int(r["index"]): r["status"] for r in json.loads(overall.decode("utf-8"))["custom"]["raw_results"]}


def _medagent_messages(data: bytes, context: dict[str, bytes]) -> bytes:
    """AgentBench's MedAgentBench runs (`runs.jsonl`: per task `index` and `output.history`, the session's messages
    as the model got them: the task's prompt as the first `user` message, the model's replies as `agent`, and the
    task's answers to a GET or POST as later `user` messages) as chat-completions message lists: `agent` is the
    assistant, each later `user` message a `tool` message named after the reply before it (`get`, `post`:
    `_medagent_verb`), an error when the task could not send the GET or parse the POST (`_MEDAGENT_ERRORS`). A run
    ends with the model's FINISH or an invalid reply; an answer after the last reply (a run stopped at the task's
    round limit) goes to no model and is dropped. The reward is 1 where the run's own `overall.json` (CONTEXT)
    says `Correct`, else 0; the run's status is kept."""
    (overall,) = context.values()
    statuses = _medagent_status(overall)
    out = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        history = rec["output"]["history"]
        messages: list[dict] = [{"role": "user", "content": history[0]["content"]}]
        verb = "tool"
        for m in history[1:]:
            if m["role"] == "agent":
                verb = _medagent_verb(m["content"])
                messages.append({"role": "assistant", "content": m["content"]})
            else:
                failed = m["content"].startswith(_MEDAGENT_ERRORS)
                messages.append({"role": "tool", "name": verb, "content": m["content"], "is_error": failed})
        while messages[-1]["role"] == "tool":
            messages.pop()
        status = statuses.get(rec["index"], rec["output"]["status"])
        record = {"id": f"medagentbench-{rec['index']}", "status": status, "reward": float(status.endswith("Correct"))}
        out.append(json.dumps({**record, "messages": messages}))
    return ("\n".join(out) + "\n").encode()


def _moatless_messages(data: bytes) -> bytes:
    """A Moatless Tools trajectory as one conversation for `--format openai` (`libra trace import` reads the raw file
    the same way: libra/workloads/importers/moatless.py)."""
    from libra.workloads.importers import moatless

    return (json.dumps(moatless.record(json.loads(data.decode("utf-8")))) + "\n").encode()


# the converters by name (a source's `convert`); a converter takes the file's bytes (and, for a source with
# `context`, those files' bytes by path)
CONVERTERS: dict[str, Callable[..., bytes]] = {
    "tora": _tora_messages,
    "react": _react_messages,
    "qwen-tools": _qwen_tools_messages,
    "reflexion-react": _reflexion_react_messages,
    "webshop-notebook": _webshop_messages,
    "fever-notebook": _fever_messages,
    "agentbench-medagent": _medagent_messages,
    "moatless": _moatless_messages,
}
