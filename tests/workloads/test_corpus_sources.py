"""The corpus's source conversions (scripts/build_corpus.py) and the held-out sources (data/corpus/held-out/): the
ReAct transcripts of the search agent split into generations and search returns, and the held-out set kept apart
from the sources that the router's tests gate on."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from libra.workloads.importers import DEFAULT_ERROR_PATTERNS, StatusRules, import_files

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = DEFAULT_CORPUS / "held-out"


@pytest.fixture(scope="module")
def build_corpus():
    spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "scripts" / "build_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_held_out_sources_are_apart_and_complete() -> None:
    """Every held-out source loads with the count and provenance its manifest states (repository, commit, licence,
    sha256 per file), and none of them is in the manifest that the router's tests read."""
    manifest = load_manifest(HELD_OUT)
    corpus = load_corpus(HELD_OUT)
    gated = {s["name"] for s in load_manifest()["sources"]}
    assert manifest["sources"] and not gated & set(corpus)
    for src in manifest["sources"]:
        trajs = corpus[src["name"]]
        assert src["held_out"] and src["licence"] and src["repo"] and len(trajs) == src["trajectories"] >= 100
        assert sum(f["trajectories"] for f in src["files"]) == len(trajs)
        for f in src["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and re.fullmatch(r"[0-9a-f]{40}", f["commit"])
        assert all(t.extra["source"] == src["name"] and t.turns for t in trajs)
        assert {t.extra["origin"]["path"] for t in trajs} <= {f["path"] for f in src["files"]}
