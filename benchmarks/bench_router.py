"""Router overhead (pytest-benchmark): `on_tool_return` latency, step-end prefix-tree update, the default router's
step end after a long history of one-request steps, memory per node.

    python -m pytest benchmarks/bench_router.py --benchmark-only

Targets (issue 16): on_tool_return median < 5 us for every preset (the default `adaptive` included); step-end
update of 8,192 trajectories < 30 ms; 100 consecutive r2e-gym updates < 8 s of CPU (`-k update_sequence_100`).
Nothing here asserts a time; the numbers go to the benchmark report (and memory per node to `extra_info`).
"""

from __future__ import annotations

import itertools

import attrs
import pytest

from libra.scheduling import CMLFQ_PRESETS, CMLFQRouter, PrefixTree, make_router
from libra.scheduling.evaluate import replay
from libra.spec import parse_buckets
from libra.workloads.corpus import DEFAULT_CORPUS, load_trace
from libra.workloads.generators import WorkloadGenerator

BUCKETS = {"search-r1": parse_buckets("2:5000,4:15000,8:inf"), "r2e-gym": parse_buckets("1:4000,2:12000,4:30000,8:inf")}


def _steps(workload: str, first: int, count: int):
    gen = WorkloadGenerator(workload, seed=0, num_prompts=512)
    return [gen.step(s) for s in range(first, first + count)]


@pytest.fixture(scope="module", params=["search-r1", "r2e-gym"])
def history(request):
    workload = request.param
    return workload, _steps(workload, 0, 5)


def _warm(history, preset: str = "published"):
    """A C-MLFQ router whose tree learnt four steps of 512 x 16 trajectories, and the next step's trajectories.
    `PRESET-learnt`: the router itself learnt them, through the router contract (`replay`: admit, tool returns,
    finish, end_step), so its step-end fits ran (the adaptive preset's price, shrinkage and size classes as in a
    run); otherwise only its tree did (`tree.update`: the fits keep their initial values)."""
    workload, (*learnt, current) = history
    name, _, how = preset.partition("-")
    router = make_router("cmlfq", BUCKETS[workload], **CMLFQ_PRESETS[name])
    assert isinstance(router, CMLFQRouter)
    if how == "learnt":
        replay(router, [t for step in learnt for t in step])
    else:
        for step in learnt:
            router.tree.update(step)
    return workload, router, current


@pytest.mark.parametrize("preset", ["published", "accuracy", "priced", "adaptive", "adaptive-learnt"])
def test_on_tool_return(benchmark, history, preset) -> None:
    workload, router, current = _warm(history, preset)
    tool_turns = [(t, k) for t in current for k, turn in enumerate(t.turns) if turn.tool is not None]
    ids = itertools.count()
    cases = itertools.cycle(tool_turns)

    def setup():
        traj, k = next(cases)
        rid = next(ids)
        router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
        for j in range(k):  # walk the request down to the tool return we time
            turn = traj.turns[j]
            router.on_tool_return(
                rid,
                tool=turn.tool,
                tool_tokens=turn.tool_tokens,
                status=turn.tool_status,
                context_tokens=traj.context_after(j + 1),
            )
        turn = traj.turns[k]
        return (rid,), {
            "tool": turn.tool,
            "tool_tokens": turn.tool_tokens,
            "status": turn.tool_status,
            "context_tokens": traj.context_after(k + 1),
        }

    benchmark.extra_info.update(workload=workload, preset=preset)
    benchmark.pedantic(router.on_tool_return, setup=setup, rounds=3000, iterations=1, warmup_rounds=100)


def test_step_with_all_in_flight(benchmark, history) -> None:
    """One step of 512 x 16 trajectories routed by the default with all of them in flight, as in a rollout: every
    request admitted, then the tool returns round by round, then the finishes and the step end. The cost of a move
    must not grow with the number of requests in flight (the ceiling reads a running sum of their contexts)."""
    workload, (*learnt, current) = history

    def setup():
        router = make_router("cmlfq", BUCKETS[workload])
        replay(router, [t for step in learnt for t in step])
        return (router,), {}

    def route(router) -> int:
        for i, t in enumerate(current):
            router.admit(i, prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens)
        moves, k, live = 0, 0, list(range(len(current)))
        while live:
            left = []
            for i in live:
                t = current[i]
                if k < len(t.turns) and t.turns[k].tool is not None:
                    turn = t.turns[k]
                    moves += router.on_tool_return(
                        i,
                        tool=turn.tool,
                        tool_tokens=turn.tool_tokens,
                        status=turn.tool_status,
                        context_tokens=t.context_after(k + 1),
                    ).migrate
                    left.append(i)
                else:
                    router.finish(i, t)
            live, k = left, k + 1
        router.end_step()
        return moves

    benchmark.extra_info.update(workload=workload, trajectories=len(current))
    moves = benchmark.pedantic(route, setup=setup, rounds=3, iterations=1)
    benchmark.extra_info["moves"] = moves


def test_step_end_update(benchmark, history) -> None:
    workload, router, current = _warm(history)
    tree = router.tree
    benchmark.extra_info.update(workload=workload, trajectories=len(current))
    benchmark.pedantic(tree.update, args=(current,), rounds=5, iterations=1)
    benchmark.extra_info.update(nodes=tree.num_nodes, bytes_per_node=tree.memory_bytes() / tree.num_nodes)


@pytest.fixture(scope="module")
def one_request_steps():
    """ToRA-70B / GSM8K from the corpus as steps of one trajectory each (route-eval on such a trace), its runs
    repeated under new prompt ids up to 5,000 steps."""
    trajs = load_trace(DEFAULT_CORPUS / "tora-70b-gsm8k.jsonl.gz")
    runs = itertools.islice(itertools.cycle(trajs), 5000)
    return [attrs.evolve(t, step=i, prompt_id=f"{t.prompt_id}/{i // len(trajs)}") for i, t in enumerate(runs)]


@pytest.mark.parametrize("history", [100, 4000])
def test_end_step_after_long_history(benchmark, one_request_steps, history) -> None:
    """The default router's step end for a step of one request, after `history` such steps. Its fits keep windows
    (the prompt-length bins' last 20,000 requests, the size classes' samples of return sizes) that fill as the
    history grows; a step end reads them in a few numpy passes (it was a Python loop over them: 4 ms a step end
    after 1,300 steps, route-eval quadratic in the number of steps)."""
    router = make_router("cmlfq", parse_buckets("1:201,2:240,4:282,8:inf"))
    replay(router, one_request_steps[:history])
    rest = iter(one_request_steps[history:])
    ids = itertools.count()

    def setup():
        traj, rid = next(rest), f"bench-{next(ids)}"
        router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
        for k, turn in enumerate(traj.turns):
            if turn.tool is not None:
                router.on_tool_return(
                    rid,
                    tool=turn.tool,
                    tool_tokens=turn.tool_tokens,
                    status=turn.tool_status or "ok",
                    context_tokens=traj.context_after(k + 1),
                )
        router.finish(rid, traj)
        return (), {}

    benchmark.extra_info.update(history=history)
    benchmark.pedantic(router.end_step, setup=setup, rounds=500, iterations=1, warmup_rounds=10)


@pytest.mark.parametrize("window", [20, 200])
def test_memory_per_node(benchmark, window) -> None:
    """Not a speed test: builds a tree over 8 steps of search-r1 and reports bytes per node."""
    steps = _steps("search-r1", 0, 8)
    tree = PrefixTree(window=window)

    def build():
        for step in steps:
            tree.update(step)

    benchmark.pedantic(build, rounds=1, iterations=1)
    benchmark.extra_info.update(
        window=window, nodes=tree.num_nodes, bytes_per_node=round(tree.memory_bytes() / tree.num_nodes, 1)
    )


@pytest.fixture(scope="module")
def thirty_steps():
    return _steps("r2e-gym", 0, 30)


def test_update_sequence(benchmark, thirty_steps) -> None:
    """The simulator's pattern: one update per step into one growing tree, 30 steps of r2e-gym (512 x 16), with
    the evictions that the 200K-node cap brings from about step 12 on."""

    _time_update_sequence(benchmark, thirty_steps, rounds=2)


def _time_update_sequence(benchmark, steps, *, rounds: int) -> None:
    """Time building one tree from empty by one update per step; its size and evictions go to extra_info."""

    def build():
        tree = PrefixTree()
        for step in steps:
            tree.update(step)
        return tree

    tree = benchmark.pedantic(build, rounds=rounds, iterations=1)
    benchmark.extra_info.update(workload="r2e-gym", steps=len(steps), nodes=tree.num_nodes, evicted=tree.evicted)


@pytest.fixture(scope="module")
def hundred_steps():
    return _steps("r2e-gym", 0, 100)


def test_update_sequence_100(benchmark, hundred_steps) -> None:
    """Issue 16 item 5c: 100 r2e-gym updates (512 x 16) into one growing tree, the cap's evictions included (from
    step 44 on every update evicts 40-110 K nodes). Slow (about 15 s of CPU a round, 2 GB for the trajectories),
    so one round:

        python -m pytest benchmarks/bench_router.py --benchmark-only -p no:cacheprovider \
            -k update_sequence_100 --benchmark-timer=time.process_time
    """

    _time_update_sequence(benchmark, hundred_steps, rounds=1)
