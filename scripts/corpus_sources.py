"""The sources of the corpus (data/corpus/), for scripts/build_corpus.py, which loads this file from beside it: data
only, one dict per source. An entry's keys:

- `name`: the source's name, that of its trace (OUT/<name>.jsonl.gz) and of its manifest entry;
- `kind`, `agent`, `model`: what the trajectories are (the task and its tools, the harness, the model), as the
  manifest records them;
- `repo`, `commit`, `licence`: where the files are read (a GitHub repository, mirrored as DIR/<owner>+<name>/repo)
  and under what licence; `commit` None reads every commit (the file's first version seen);
- `globs`: the files of the trajectories, `fnmatch` patterns of paths at that commit;
- `format`: the format `libra.workloads.importers` reads them as (`openai`, `swe-agent`, `mini-swe-agent`, ...);
- `convert` (optional): the converter that rewrites each file first, by its name in build_corpus.py's CONVERTERS
  (scripts/corpus_convert.py and scripts/corpus_intercode.py);
- `context` (optional): other files of the repository read at the same commit (prompts, templates, scores) and
  given to the converter, their bytes by path;
- `error_patterns` (optional): regular expressions of a tool's returns that are errors, added to the importers'
  defaults;
- `held_out` (optional): never used to choose or tune anything; built into OUT/held-out/ with a manifest of its
  own.
"""

from __future__ import annotations

from typing import Any

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
