"""`libra trace import`'s readers (pytest-benchmark): 1,000 chat logs of 3-30 tool calls each (synthetic: fixed
texts, seeded lengths), and the same runs dumped as verl's `rollout_data_dir` writes them (a prompt and a response
in text, each tool result inline as Search-R1's `<information>`), counted with `bytes4` (the tokenizer is not what
is timed here).

    python -m pytest benchmarks/bench_import.py --benchmark-only

Nothing here asserts a time.
"""

from __future__ import annotations

import json
import random

import pytest

from libra.workloads.importers import import_files


def _runs(n: int = 1_000, seed: int = 0) -> list[tuple[int, list[int]]]:
    """(prompt words, result lines per call) of n runs."""
    rng = random.Random(seed)
    return [(rng.randint(50, 400), [rng.randint(1, 200) for _ in range(rng.randint(3, 30))]) for _ in range(n)]


def _chat(i: int, words: int, results: list[int]) -> dict:
    messages = [{"role": "system", "content": "sys " * 200}, {"role": "user", "content": "task " * words}]
    for k, lines in enumerate(results):
        call = {"id": f"c{k}", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
        messages.append({"role": "assistant", "content": "think " * 40, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": "out line\n" * lines})
    messages.append({"role": "assistant", "content": "done"})
    return {"id": f"t{i}", "messages": messages}


def _dumped(i: int, words: int, results: list[int]) -> dict:
    calls = "".join(
        f"<search>q{k}</search><information>{'doc text ' * lines}</information>" for k, lines in enumerate(results)
    )
    return {
        "input": f"question {i % 100} " + "task " * words,
        "output": calls + "<answer>a</answer>",
        "score": 1.0,
        "step": 1,
    }


@pytest.mark.parametrize("shape", ["chat", "rollout-dump"])
def test_import(benchmark, tmp_path, shape) -> None:
    write = _chat if shape == "chat" else _dumped
    path = tmp_path / f"{shape}.jsonl"
    path.write_text("".join(json.dumps(write(i, *run)) + "\n" for i, run in enumerate(_runs())))
    runs = benchmark.pedantic(
        import_files, args=("openai", [path]), kwargs={"tokenizer": "bytes4"}, rounds=3, iterations=1
    )
    benchmark.extra_info.update(
        shape=shape, trajectories=len(runs), turns=sum(len(t.turns) for t in runs), mib=path.stat().st_size / 2**20
    )
