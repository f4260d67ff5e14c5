"""The random replay orders of scripts/eval_corpus.py (`--orders K`): every trajectory exactly once, its turns
untouched, and the runs of one task (prompt id) in their file order, since a retry comes after the first run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.workloads.trace import Trajectory, Turn
from tests.scripts import load_script


@pytest.fixture(scope="module")
def eval_corpus():
    return load_script("eval_corpus")


def _log(tasks: list[int]) -> list[Trajectory]:
    """One run per entry, of task `tasks[i]`; each run is told apart by its own turns (i + 1 generated tokens, then
    a search of 2 * i + 1 tokens and the answer)."""
    return [
        Trajectory(
            prompt_id=f"task-{task}",
            prompt_tokens=10,
            turns=(
                Turn(gen_tokens=i + 1, tool="search", tool_status="ok", tool_tokens=2 * i + 1),
                Turn(gen_tokens=5),
            ),
        )
        for i, task in enumerate(tasks)
    ]


@settings(max_examples=60, deadline=None)
@given(tasks=st.lists(st.integers(0, 6), min_size=1, max_size=40), seed=st.integers(0, 2**32 - 1))
def test_every_run_once_and_a_tasks_runs_in_file_order(eval_corpus, tasks, seed) -> None:
    log = _log(tasks)
    order = eval_corpus.shuffled_runs(log, np.random.default_rng(seed))
    assert sorted(map(id, order)) == sorted(map(id, log))  # the same objects (turns and all), each once
    for task in set(tasks):
        runs = [t for t in log if t.prompt_id == f"task-{task}"]
        assert [t for t in order if t.prompt_id == f"task-{task}"] == runs


def test_orders_mix_the_tasks(eval_corpus) -> None:
    """Not file order, nor tasks kept together: over ten orders of 4 tasks x 5 runs, some order starts with each
    task and none is the file order."""
    log = _log([t for t in range(4) for _ in range(5)])
    orders = eval_corpus.source_orders("a-source", log, 10, seed=0)
    assert all(order != log for order in orders)
    assert {order[0].prompt_id for order in orders} == {f"task-{t}" for t in range(4)}
    assert any(order[1].prompt_id != order[0].prompt_id for order in orders)


def test_a_sources_orders_depend_on_its_name_and_the_seed_only(eval_corpus) -> None:
    log = _log(list(range(30)))
    again = eval_corpus.source_orders("a-source", log, 3, seed=7)
    assert eval_corpus.source_orders("a-source", log, 3, seed=7) == again
    assert eval_corpus.source_orders("other", log, 3, seed=7) != again
    assert eval_corpus.source_orders("a-source", log, 3, seed=8) != again


def test_every_variant_is_a_router_the_default_is_not(eval_corpus) -> None:
    """`--variants`: each one-option variant builds a router (an option renamed in the router fails here, not
    after minutes of replay) and differs from the default in exactly its option."""
    from libra.scheduling import make_router
    from libra.spec import parse_buckets

    options = eval_corpus.variant_options(list(eval_corpus.VARIANTS))
    buckets = parse_buckets("1:100,2:200,4:inf")
    for name, opts in options.items():
        make_router("cmlfq", buckets, **opts)
        if name != "default":
            changed = {k for k in opts if opts[k] != eval_corpus.BASE[k]}
            assert changed == set(eval_corpus.VARIANTS[name]), name


def test_a_variants_gap_is_its_own(eval_corpus) -> None:
    """The summary reads each router's own result: on a small log the default and `tree admission` differ."""
    from libra.spec import parse_buckets

    log = _log([i % 7 for i in range(70)])
    out = eval_corpus.gaps(log, parse_buckets("1:50,2:100,4:inf"), ["tree admission", "no repay"])
    assert set(out) == {"default", "tree admission", "no repay"}
    assert all(-1.0 <= g <= 1.0 and 0.0 <= m <= 1.0 for g, m, _ in out.values())
    assert out["default"][:2] != out["tree admission"][:2]
    assert out["default"][2] == out["tree admission"][2]  # the same baselines in the same order
