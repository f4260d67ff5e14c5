"""Rebuild the corpus of real agent trajectories (data/corpus/) from public repositories.

    python scripts/build_corpus.py --mirrors DIR [--out data/corpus] [--only SOURCE]...
    python scripts/build_corpus.py --check [--out data/corpus]

DIR holds bare git snapshots of the repositories below as DIR/<owner>+<name>/repo (what the project's fetch tool
brings; a `git clone --bare` works the same). For each source the files are read at the pinned commit, their
sha256 recorded, imported with `libra.workloads.importers` (o200k_base token counts) and written, deduplicated, to
OUT/<source>.jsonl.gz; OUT/MANIFEST.json keeps the provenance (repository, commit, path, licence, and the upstream
sha256 per file read), the counts, and the sums of the trace written (`trace_sha256`, `trace_bytes`), which
`--check` compares with the committed traces. Nothing of the original text is kept: only token counts, tool names
and statuses. Sources marked `held_out` (never used to choose or tune anything) go to OUT/held-out/ with a manifest
of their own. A source may convert its files first (`convert`: ToRA outputs, ReAct transcripts, text tool calls,
a notebook's printed episodes, InterCode's logs, Moatless trajectories), with other files of the repository read at
the same commit (`context`: prompts, templates), and add error patterns of its tools (`error_patterns`). A file the
snapshot lacks (a snapshot may keep no file of 4 MiB or more) and a file the source's converter refuses are skipped
and listed in the source's manifest entry (`absent`, `skipped` with the reason).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import gzip
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def _sibling(name: str) -> ModuleType:
    """scripts/NAME.py, the module of some of the converters, loaded by path (scripts/ is no package, and the tests
    load this script by path too)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


intercode = _sibling("corpus_intercode")  # InterCode's converters (its runs' templates restated)

_IC_BASH = "shell (InterCode-Bash: NL2Bash tasks, four file systems; a Bourne shell, its output and a reward each turn)"
_IC_COMPLETION = (
    "InterCode multi-turn completion agent ({}, template v1: each call one text, the first prompt and every earlier "
    "action, output and reward restated; outputs cut to {} characters; at most 10 turns)"
)
_IC_SQL = "SQL (InterCode-SQL: Spider dev, 1,034 questions; a MySQL database, its rows and a reward each turn)"

SOURCES: list[dict[str, Any]] = [
    {
        "name": "tau-bench-gpt4o-airline",
        "kind": "function calling (customer service, with a user simulator)",
        "agent": "tau-bench tool-calling agent",
        "model": "gpt-4o",
        "repo": "sierra-research/tau-bench",
        "commit": "59a200c6d575d595120f1cb70fea53cef0632f6b",
        "licence": "MIT",
        "globs": ["historical_trajectories/gpt-4o-airline.json"],
        "format": "openai",
    },
    {
        "name": "tau2-gemma3-27b-custom",
        "kind": "function calling (15 custom customer-service domains, Spanish, with a user simulator)",
        "agent": "tau2-bench llm_agent",
        "model": "gemma-3-27b-it (user simulator gemma-3-12b-it)",
        "repo": "oscaralvaro/tau2-bench",
        "commit": None,  # every commit: the simulations were committed and removed over the fork's history
        "licence": "MIT (fork of sierra-research/tau2-bench)",
        "globs": ["data/simulations/*.json"],
        "format": "openai",
    },
    {
        "name": "swe-agent-demos",
        "kind": "coding (SWE-bench issues, CTF challenges, HumanEvalFix)",
        "agent": "SWE-agent",
        "model": "gpt-4 and replayed demonstrations",
        "repo": "SWE-agent/SWE-agent",
        "commit": "3ea751c087f32b16e039a2233dd6eefecef325d5",
        "licence": "MIT",
        "globs": ["trajectories/demonstrations/*.traj", "tests/test_data/trajectories/*.traj"],
        "format": "swe-agent",
    },
    {
        "name": "mini-swe-agent-gemini3pro-verified",
        "kind": "coding (SWE-bench Verified, 500 issues, bash only)",
        "agent": "mini-swe-agent 1.15.0",
        "model": "gemini-3-pro-preview",
        "repo": "gruckion/mini-swe-agent",
        "commit": "d12a71affd95403b036b2bdbd827349b77bfffb9",
        "licence": "MIT (fork of SWE-agent/mini-swe-agent; the files are the SWE-bench experiments submission "
        "bash-only/20251118_mini-v1.15.0_gemini-3-pro-preview-20251118)",
        "globs": ["swebench_results/20251118_gemini-3-pro-74pct/trajs/*/*.traj.json"],
        "format": "mini-swe-agent",
    },
    *(
        {
            "name": f"{model}-gsm8k",
            "kind": "math with a code tool (GSM8K test, 1,319 problems; Python interpreter, at most 4 calls)",
            "agent": "ToRA tool-integrated reasoning (greedy decoding)",
            "model": f"{model}-v1.0",
            "repo": "microsoft/ToRA",
            "commit": "213c1c995038c73fab10343814df7a42f990f026",
            "licence": "MIT",
            "globs": [f"src/outputs/llm-agents/{model}-v1.0/gsm8k/*.jsonl"],
            "format": "openai",
            "convert": "tora",
        }
        for model in ("tora-70b", "tora-code-34b")
    ),
    *(
        {
            "name": f"fireact-{name}-hotpotqa",
            "kind": "search (HotpotQA dev, 500 questions; ReAct with a Google search tool, SerpAPI snippets)",
            "agent": "FireAct ReAct agent (fine-tuned, no few-shot prompt)",
            "model": model,
            "repo": "anchen1011/FireAct",
            "commit": "94c6189f04b10fccae6bcd97a4632d6119266899",
            "licence": "MIT",
            "globs": [f"trajs/hotpotqa_dev_0_500_{stem}*.json"],
            "format": "openai",
            "convert": "react",
            # SerpAPI found nothing: the tool printed `None`
            "error_patterns": [r"^Observation: None$"],
            "held_out": True,
        }
        for name, model, stem in (
            (
                "gpt35",
                "gpt-3.5-turbo-0613 fine-tuned on FireAct's trajectories (temperature 0)",
                "ft_gpt-3.5-turbo-0613",
            ),
            (
                "llama2-13b",
                "Llama-2-13B LoRA-fine-tuned on FireAct's trajectories (temperature 0.7)",
                "llama_models_lora_llama-2-13b",
            ),
            (
                "llama2-7b",
                "Llama-2-7B LoRA-fine-tuned on FireAct's trajectories (temperature 0.7)",
                "llama_models_lora_llama-2-7b",
            ),
        )
    ),
    {
        "name": "reflexion-react-davinci003-hotpotqa",
        "kind": "search (HotpotQA distractor sample, 100 questions; ReAct with Wikipedia Search / Lookup tools)",
        "agent": "ReAct (Reflexion's base ReAct agent, 6-shot prompt, at most 6 steps; no reflection)",
        "model": "text-davinci-003 (temperature 0)",
        "repo": "noahshinn/reflexion",
        "commit": "e531a5c0d67bc8969683d0f6fd2ffc080a5c529d",
        "licence": "MIT",
        "globs": ["hotpotqa_runs/root/ReAct/base/100_questions_5_trials.txt"],
        # the agent's prompt template and few-shot examples, read at the same commit (the log has the scratchpads)
        "context": ["hotpotqa_runs/prompts.py", "hotpotqa_runs/fewshots.py"],
        "format": "openai",
        "convert": "reflexion-react",
        # no such page (the tool lists similar titles instead), no further match of a Lookup
        "error_patterns": [r"^Observation \d+: Could not find \[", r"^Observation \d+: No Results$"],
        "held_out": True,
    },
    {
        "name": "webdancer-sft-sample",
        "kind": "search (web information seeking: e2hqa and crawlqa questions; search and visit tools, live web)",
        "agent": "WebDancer ReAct agent (trajectory sampling for SFT)",
        "model": "not stated in the file (the WebDancer paper samples long-CoT trajectories with QwQ-Plus)",
        "repo": "Alibaba-NLP/WebAgent",
        "commit": "d169df3207354a6b6fb8020141ab5b321cc965a5",
        "licence": "MIT",
        "globs": ["WebDancer/datasets/sample_traj.jsonl"],
        "format": "openai",
        "convert": "qwen-tools",
        "held_out": True,
    },
    {
        "name": "react-webshop-davinci002",
        "kind": "web shopping (WebShop, 500 fixed instructions; search, click and think actions on a text web shop)",
        "agent": "ReAct (one-shot prompt, at most 15 actions, context cut to its last 6,400 characters)",
        "model": "text-davinci-002 (temperature 0)",
        "repo": "ysymyth/ReAct",
        "commit": "6bdb3a1fd38b8188fc7ba4102969fe483df8fdc9",
        "licence": "MIT",
        "globs": ["WebShop.ipynb"],
        "format": "openai",
        "convert": "webshop-notebook",
        # an action the shop did not accept (a click on something not on the page)
        "error_patterns": [r"^Observation: Invalid action!$"],
        "held_out": True,
    },
    {
        "name": "react-fever-davinci002",
        "kind": "fact verification (FEVER dev, 500 claims; ReAct with Wikipedia Search / Lookup tools, live pages)",
        "agent": "ReAct (3-shot prompt webthink_simple3, at most 7 steps)",
        "model": "text-davinci-002 (temperature 0)",
        "repo": "ysymyth/ReAct",
        "commit": "6bdb3a1fd38b8188fc7ba4102969fe483df8fdc9",
        "licence": "MIT",
        "globs": ["FEVER.ipynb"],
        "context": ["prompts/fever.json"],  # the few-shot prompts the notebook loads
        "format": "openai",
        "convert": "fever-notebook",
        # no such page (similar titles instead), no further match of a Lookup, an action the tool does not know
        "error_patterns": [
            r"^Observation \d+: Could not find ",
            r"^Observation \d+: No more results\.$",
            r"^Observation \d+: Invalid action:",
        ],
        "held_out": True,
    },
    *(
        {
            "name": f"intercode-{env}-{name}",
            "kind": kind,
            "agent": f"InterCode multi-turn chat agent (template {template}, at most 10 turns, dialogue cut to the "
            f"system prompt, the query and the last {limit} messages)",
            "model": f"{model} (temperature 0)",
            "repo": "princeton-nlp/intercode",
            "commit": "69922e2f331b36a7d94b5da4a7ed10289e6c4c94",  # the commit that added the runs and ran them
            "licence": "MIT",
            "globs": [f"data/results/{env}/{folder}/ic_{env}_multiturn_{folder}_10_turns{tail}.json"],
            # the templates the runs were prompted with, read at the same commit (the logs keep the commands)
            "context": ["experiments/utils/prompts.py"],
            "format": "openai",
            "convert": "intercode",
            "held_out": True,
        }
        for env, name, folder, model, tail, kind, template, limit in (
            ("bash", "gpt4", "gpt-4", "gpt-4", "_fs_*", _IC_BASH, "v2", 7),
            # fs_2 is a large object absent from the snapshot: the other three file systems
            ("bash", "gpt35", "gpt-3.5", "gpt-3.5-turbo", "_fs_[134]", _IC_BASH, "v2", 7),
            ("sql", "gpt4", "gpt-4", "gpt-4", "", _IC_SQL, "game_sql", 5),
            ("sql", "gpt35", "gpt-3.5", "gpt-3.5-turbo", "", _IC_SQL, "game_sql", 5),
        )
    ),
    {
        "name": "intercode-sql-gpt35-tables",
        "kind": f"{_IC_SQL}, with the database's tables and columns given",
        "agent": "InterCode multi-turn chat agent (template game_sql, the tables and their columns as a second system "
        "message, at most 10 turns, dialogue cut to the two system messages and the last 5 messages)",
        "model": "gpt-3.5-turbo (temperature 0)",
        "repo": "princeton-nlp/intercode",
        "commit": "69922e2f331b36a7d94b5da4a7ed10289e6c4c94",
        "licence": "MIT",
        "globs": ["data/results/sql/gpt-3.5/ic_sql_multiturn_gpt-3.5_10_turns_handicap.json"],
        # the templates, and the dataset of the runs (each task's `db_tables`, which the policy was given)
        "context": ["experiments/utils/prompts.py", "data/spider/dev_spider.json"],
        "format": "openai",
        "convert": "intercode-tables",
        "held_out": True,
    },
    {
        "name": "intercode-ctf-gpt4",
        "kind": "capture the flag (InterCode-CTF: 93 of its 100 picoCTF tasks; an Ubuntu shell with the task's files, "
        "its output each turn, reward 1 for the flag)",
        "agent": "InterCode multi-turn chat agent (template ctf, at most 10 turns, dialogue cut to the system prompt, "
        "the task and the last 5 messages)",
        "model": "gpt-4 (temperature 0)",
        "repo": "princeton-nlp/intercode",
        # the commit that last wrote the runs (93 tasks; df76511 had 51 of them); the code of the runs is that of
        # df76511 (CTF and Python experiment code), unchanged there
        "commit": "060f6a00b4edd7d3efb479d284d5deb1f196b07d",
        "licence": "MIT",
        "globs": ["data/results/ctf/ic_ctf_multiturn_gpt-4_10_turns.json"],
        "context": ["experiments/utils/prompts.py"],
        "format": "openai",
        "convert": "intercode",
        "held_out": True,
    },
    *(
        {
            "name": f"intercode-python-{name}",
            "kind": "Python (InterCode-Python: 117-119 of the first 120 of MBPP's 974 tasks; a Python interpreter, its "
            "output, and the tests' verdict and reward on a function)",
            "agent": "InterCode multi-turn chat agent (template function, at most 7 turns)",
            "model": f"{model} (temperature 0)",
            "repo": "princeton-nlp/intercode",
            "commit": "df765119b0feeebe558aaef7482aa54c8f4add9f",  # the commit that added the runs
            "licence": "MIT",
            # both files are in the gpt-3.5 folder; eval_n_turn.py names its log after the model it ran
            "globs": [f"data/results/python/gpt-3.5/ic_python_multiturn_{folder}_7_turns.json"],
            "context": ["experiments/utils/prompts.py"],
            "format": "openai",
            "convert": "intercode",
            "held_out": True,
        }
        for name, folder, model in (("gpt4", "gpt-4", "gpt-4"), ("gpt35", "gpt-3.5", "gpt-3.5-turbo"))
    ),
    *(
        {
            "name": f"medagentbench-{name}",
            "kind": "clinical records (MedAgentBench: 100 tasks of 10 kinds on a FHIR server of patient charts; GET "
            "and POST calls to its REST API, the JSON bundle or an acknowledgement back)",
            "agent": "AgentBench MedAgentBench task (one call per reply, at most 8 rounds)",
            "model": model,
            "repo": "THUDM/AgentBench",
            # the merge commit of pull request #171 (refs/pull/171/merge; MedAgentBench's authors), which added the
            # runs, the task and its data; not on a branch: a mirror must hold the pull request's refs
            "commit": "504ccbdc60233f71873920d2e7ba421768653e0c",
            "licence": "Apache-2.0 (the repository's LICENSE at that commit)",
            "globs": [f"outputs/Jan17v1/{folder}/medagentbench-std/runs.jsonl"],
            # the run's own scores (AgentBench's `calculate_overall`), read at the same commit
            "context": [f"outputs/Jan17v1/{folder}/medagentbench-std/overall.json"],
            "format": "openai",
            "convert": "agentbench-medagent",
            "held_out": True,
        }
        for name, folder, model in (
            # the models of the run's agent configurations (configs/agents/api_agents.yaml at the same commit)
            ("gpt4o", "gpt-4o", "gpt-4o-2024-11-20"),
            ("gpt4o-mini", "gpt-4o-mini", "gpt-4o-mini"),
            ("deepseek-v3", "deepseekv3", "deepseek-ai/DeepSeek-V3 (Together API)"),
            ("llama33-70b", "llama-3.3", "meta-llama/Llama-3.3-70B-Instruct-Turbo (Together API)"),
        )
    ),
    # InterCode's runs of the other models and its ReAct runs, from the commit that added them and ran them;
    # the policy and template of each are read from the repository (docs/corpus.md), not from the logs
    *(
        {
            "name": f"intercode-{env}-{name}",
            "kind": {"bash": _IC_BASH, "sql": _IC_SQL}[env],
            "agent": agent,
            "model": model,
            "repo": "princeton-nlp/intercode",
            "commit": "69922e2f331b36a7d94b5da4a7ed10289e6c4c94",
            "licence": "MIT",
            "globs": [f"data/results/{env}/{folder}/ic_{env}_{run}{'_fs_*' if env == 'bash' else ''}.json"],
            "context": ["experiments/utils/prompts.py"],
            "format": "openai",
            "convert": f"intercode-{policy}",
            "held_out": True,
        }
        for env in ("bash", "sql")
        for name, folder, run, policy, agent, model in (
            (
                "davinci003",
                "text-davinci-003",
                "multiturn_text-davinci-003_10_turns",
                "completion-gpt",
                _IC_COMPLETION.format("CompletionGPTPolicy", 500),
                "text-davinci-003 (temperature 0)",
            ),
            (
                "text-bison",
                "text-bison-001",
                "multiturn_text-bison-001_10_turns",
                "completion-palm",
                _IC_COMPLETION.format("PalmCompletionPolicy", "1,000"),
                "text-bison-001 (PaLM 2, temperature 0)",
            ),
            (
                "chat-bison",
                "chat-bison-001",
                "multiturn_chat-bison-001_10_turns",
                "palm-chat",
                "InterCode multi-turn PaLM chat agent (PalmChatPolicy, template v2 by PROMPT_MAP's comment; not "
                "certain: no script at the commit selects this policy, and the GPT runs on SQL used game_sql; no "
                "dialogue limit, at most 10 turns)",
                "chat-bison-001 (PaLM 2, temperature 0)",
            ),
            (
                "starchat",
                "starchat",
                "multiturn_starchat_10_turns",
                "hf-chat",
                "InterCode multi-turn Hugging Face chat agent (HFChatPolicy, template v4, dialogue cut to its first "
                "two messages and the last 5, at most 10 turns; scripts/expr_n_turn_others.sh; on Bash the same "
                "command is assumed)",
                "StarChat (a Hugging Face text-generation endpoint, temperature 0.01, at most 100 new tokens; the "
                "checkpoint is not stated)",
            ),
            (
                "react-davinci003",
                "gpt-3.5",
                "react_10_turns",
                "react",
                "InterCode ReAct agent (experiments/eval_react.py: TemplateReAct with its 5 demonstrations, one "
                "completion per Thought/Action step, at most 10 steps)",
                "text-davinci-003 (temperature 0; eval_react.py's model, a GPT-3.5 model: the runs sit in the "
                "gpt-3.5 folder)",
            ),
        )
    ),
    # PaLM's SQL runs with the tables given (`--handicap`), same commit: both PaLM policies put the tables text
    # between the system prompt and the query of their first message (`add_to_dialogue`, experiments/policies.py)
    *(
        {
            "name": f"intercode-sql-{name}-tables",
            "kind": f"{_IC_SQL}, with the database's tables and columns given",
            "agent": agent,
            "model": f"{folder} (PaLM 2, temperature 0)",
            "repo": "princeton-nlp/intercode",
            "commit": "69922e2f331b36a7d94b5da4a7ed10289e6c4c94",
            "licence": "MIT",
            "globs": [f"data/results/sql/{folder}/ic_sql_multiturn_{folder}_10_turns_handicap.json"],
            "context": ["experiments/utils/prompts.py", "data/spider/dev_spider.json"],
            "format": "openai",
            "convert": f"intercode-{policy}-tables",
            "held_out": True,
        }
        for name, folder, policy, agent in (
            (
                "text-bison",
                "text-bison-001",
                "completion-palm",
                "InterCode multi-turn completion agent (PalmCompletionPolicy, template v1: each call one text, the "
                "first prompt with the tables and their columns between the system prompt and the query, and every "
                "earlier action, output and reward restated; outputs cut to 1,000 characters; at most 10 turns)",
            ),
            (
                "chat-bison",
                "chat-bison-001",
                "palm-chat",
                "InterCode multi-turn PaLM chat agent (PalmChatPolicy, template v2 as for its runs without the "
                "tables, not certain; the tables and their columns between the system prompt and the query of its "
                "first message, no dialogue limit, at most 10 turns)",
            ),
        )
    ),
    # a coding agent of another harness and model: Moatless Tools on SWE-bench Lite, the run its author committed
    # (removed from the repository two months later); each step's model call is recorded with its input messages
    {
        "name": "moatless-claude35-sonnet-lite",
        "kind": "coding (SWE-bench Lite, 300 issues, one run each; tool calls: code search, view, str_replace edits "
        "with the tests run after each, finish)",
        "agent": "Moatless Tools CodingAgent (the evaluation's name says 0.4; tool-call responses, at most 30 "
        "steps and $1 a run)",
        "model": "claude-3-5-sonnet-20241022 (temperature 0)",
        "repo": "aorwall/moatless-tools",
        "commit": "91f874186e8298e5270c00a334c7a962bb4cdfad",
        "licence": "MIT",
        "globs": ["evaluations/20241117_moatless_claude_3_5_sonnet_20241022/*/trajectory.json"],
        "format": "openai",
        "convert": "moatless",
        "held_out": True,
    },
]


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
        consts.update(intercode.string_constants(text.decode("utf-8")))
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
            consts.update(intercode.string_constants("".join(cell["source"])))
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


# a converter takes the file's bytes (and, for a source with `context`, those files' bytes by path)
CONVERTERS: dict[str, Callable[..., bytes]] = {
    "tora": _tora_messages,
    "react": _react_messages,
    "qwen-tools": _qwen_tools_messages,
    "reflexion-react": _reflexion_react_messages,
    "webshop-notebook": _webshop_messages,
    **intercode.CONVERTERS,
    "fever-notebook": _fever_messages,
    "agentbench-medagent": _medagent_messages,
    "moatless": _moatless_messages,
}


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def _files(repo: Path, commit: str | None, globs: list[str]) -> list[tuple[str, str, str]]:
    """(commit, path, blob) of the files matching `globs`, at `commit` or over all commits (first seen)."""
    commits = [commit] if commit else _git(repo, "rev-list", "--all", "--reverse").decode().split()
    seen: dict[str, tuple[str, str, str]] = {}
    for c in commits:
        for row in _git(repo, "ls-tree", "-r", c).decode().splitlines():
            meta, path = row.split("\t", 1)
            blob = meta.split()[2]
            if any(fnmatch.fnmatch(path, g) for g in globs) and blob not in seen:
                seen[blob] = (c, path, blob)
    return list(seen.values())


CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the default --out, wherever it is run from
HELD_OUT = "held-out"
HELD_OUT_NOTE = (
    "Held-out sources: never used to choose or tune anything; the tests that gate the default router read "
    "OUT/MANIFEST.json only (docs/corpus.md)."
)

SUMS_NOTE = (
    "Two kinds of sum: files[].sha256 is the upstream file as read from the source repository at files[].commit "
    "(provenance); trace_sha256 and trace_bytes are the committed trace `file` in this folder (integrity: "
    "scripts/build_corpus.py --check)."
)


def _write_trace(target: Path, trajectories: list) -> None:
    """The trajectories as gzipped JSON Lines; the gzip header holds no name and no time, so that the same
    trajectories give the same bytes (and the same `trace_sha256`) on every rebuild."""
    with target.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        for t in trajectories:
            gz.write((json.dumps(t.to_json(), separators=(",", ":")) + "\n").encode())


def trace_sums(path: Path) -> dict[str, str | int]:
    """The committed trace's own sums, as a manifest entry records them: `trace_sha256` and `trace_bytes`."""
    data = path.read_bytes()
    return {"trace_sha256": hashlib.sha256(data).hexdigest(), "trace_bytes": len(data)}


def check_traces(root: Path) -> list[str]:
    """One line per committed trace of ROOT (and of ROOT/held-out/) whose bytes are not those its manifest entry
    records (`trace_sha256`, `trace_bytes`), or that is missing, or whose entry records no sums; empty when all
    match."""
    problems = []
    for d in (root, root / HELD_OUT):
        manifest = d / "MANIFEST.json"
        if not manifest.exists():
            continue
        for src in json.loads(manifest.read_text(encoding="utf-8"))["sources"]:
            path = d / src["file"]
            want = {k: src.get(k) for k in ("trace_sha256", "trace_bytes")}
            if None in want.values():
                problems.append(f"{manifest}: source {src['name']!r} records no trace_sha256 / trace_bytes")
            elif not path.is_file():
                problems.append(f"{path}: missing (the manifest lists it for {src['name']!r})")
            elif (got := trace_sums(path)) != want:
                problems.append(
                    f"{path}: {got['trace_bytes']:,} bytes, sha256 {got['trace_sha256']}; the manifest says "
                    f"{want['trace_bytes']:,} bytes, sha256 {want['trace_sha256']}"
                )
    return problems


def build(mirrors: Path, out: Path, only: list[str] | None = None) -> dict:
    """Rebuild every source (or only the named ones, keeping the others' files and manifest entries). Sources
    marked `held_out` go to OUT/held-out/ with a manifest of their own; the others to OUT/. Returns the manifest
    of OUT/."""
    from libra.workloads.importers import DEFAULT_ERROR_PATTERNS, StatusRules, import_files

    dirs = {False: out, True: out / HELD_OUT}
    old = {}
    for d in dirs.values():
        if only and (d / "MANIFEST.json").exists():
            old.update({s["name"]: s for s in json.loads((d / "MANIFEST.json").read_text())["sources"]})
    unknown = set(only or ()) - {s["name"] for s in SOURCES}
    if unknown:
        raise SystemExit(f"unknown source(s): {', '.join(sorted(unknown))}")
    missing = {s["repo"] for s in SOURCES if not only or s["name"] in only} - {
        s["repo"] for s in SOURCES if (mirrors / s["repo"].replace("/", "+") / "repo").is_dir()
    }
    if missing:
        raise SystemExit(f"no mirror of {', '.join(sorted(missing))} in {mirrors} (expected DIR/<owner>+<name>/repo)")
    manifests: dict[bool, dict] = {
        False: {"tokenizer": "o200k_base", "sums": SUMS_NOTE, "sources": []},
        True: {"tokenizer": "o200k_base", "note": HELD_OUT_NOTE, "sums": SUMS_NOTE, "sources": []},
    }
    for src in SOURCES:
        held = bool(src.get("held_out"))
        if only and src["name"] not in only:
            if src["name"] in old:
                manifests[held]["sources"].append(old[src["name"]])
            continue
        repo = mirrors / src["repo"].replace("/", "+") / "repo"
        files = _files(repo, src["commit"], src["globs"])
        rules = StatusRules(error_patterns=(*DEFAULT_ERROR_PATTERNS, *src.get("error_patterns", ())))
        entries, trajectories, seen = [], [], set()
        absent: list[dict] = []
        skipped: list[dict] = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, (commit, path, blob) in enumerate(files):
                if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", blob], capture_output=True).returncode:
                    # a snapshot may lack its largest files (the fetch tool keeps none of 4 MiB or more): say which
                    print(f"skip {src['repo']}:{path}: absent from the snapshot", file=sys.stderr)
                    absent.append({"path": path, "commit": commit, "blob": blob})
                    continue
                data = _git(repo, "cat-file", "-p", blob)
                local = Path(tmp) / f"{i:04d}" / Path(path).name  # its own name: an importer may name the task by it
                local.parent.mkdir()
                try:
                    if "context" in src:  # files the converter needs besides the data, read at the same commit
                        context = {c: _git(repo, "show", f"{commit}:{c}") for c in src["context"]}
                        local.write_bytes(CONVERTERS[src["convert"]](data, context))
                    else:
                        local.write_bytes(CONVERTERS[src["convert"]](data) if "convert" in src else data)
                    got = import_files(src["format"], [local], source=src["name"], rules=rules)
                except Exception as exc:  # a file that is not a trajectory file (e.g. a summary): skip, say so
                    print(f"skip {src['repo']}:{path}: {exc}", file=sys.stderr)
                    if "convert" in src:  # a file the source's own converter refused: listed, with the reason
                        digest = hashlib.sha256(data).hexdigest()
                        skipped.append({"path": path, "commit": commit, "sha256": digest, "reason": str(exc)})
                    continue
                kept = 0
                for t in got:
                    key = hashlib.sha256(json.dumps([t.prompt_id, t.prompt_tokens, t.to_json()["turns"]]).encode())
                    if key.hexdigest() in seen:
                        continue
                    seen.add(key.hexdigest())
                    t.extra["origin"] = {"path": path, "commit": commit}
                    trajectories.append(t)
                    kept += 1
                entries.append(
                    {"path": path, "commit": commit, "sha256": hashlib.sha256(data).hexdigest(), "trajectories": kept}
                )
        dirs[held].mkdir(parents=True, exist_ok=True)
        target = dirs[held] / f"{src['name']}.jsonl.gz"
        _write_trace(target, trajectories)
        info = {k: v for k, v in src.items() if k not in ("globs",)}
        info.update(file=target.name, **trace_sums(target), trajectories=len(trajectories), files=entries)
        info.update({k: v for k, v in (("absent", absent), ("skipped", skipped)) if v})  # only where there are any
        manifests[held]["sources"].append(info)
        print(f"{src['name']}: {len(trajectories)} trajectories from {len(entries)} files", file=sys.stderr)
    for held, manifest in manifests.items():
        if manifest["sources"] or (dirs[held] / "MANIFEST.json").exists():
            dirs[held].mkdir(parents=True, exist_ok=True)
            (dirs[held] / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifests[False]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirrors", type=Path, metavar="DIR", help="bare git snapshots, DIR/<owner>+<name>/repo")
    p.add_argument("--out", default=CORPUS, type=Path, help="corpus folder (default: the repository's data/corpus)")
    p.add_argument("--only", action="append", default=None, help="rebuild only this source (repeatable)")
    p.add_argument("--check", action="store_true", help="check the traces of --out against their manifests; no build")
    args = p.parse_args()
    if args.check:
        problems = check_traces(args.out)
        print("\n".join(problems) or f"every trace in {args.out} matches its manifest", file=sys.stderr)
        return 1 if problems else 0
    if args.mirrors is None:
        p.error("--mirrors DIR is required to build (or pass --check)")
    build(args.mirrors, args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
