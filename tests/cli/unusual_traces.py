"""Valid but unusual traces: shapes the corpus does not have, each a named case (docs/trace-schema.md).

Every case is a function of nothing that returns the trajectories of one trace; each trajectory passes the
schema's checks (the `Trajectory` constructor applies the loader's rules), so a command given the written file
must answer it or refuse it in one line: never a traceback, a hang, NaN/inf in its JSON or a number over nothing.
`write_case(name, folder)` writes one to `folder/<name>.jsonl`; `CASES` names them all; `SLOW_CASES` are the
ones too big for the quick tests (20,000 trajectories).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from libra.workloads.trace import MAX_TOKENS, MAX_TOOL_LATENCY_S, MAX_TURNS, Trajectory, Turn, write_trace

_TOOLS = ("search", "python", "bash")


def _turns(rng: random.Random, num_tools: int, *, status: str = "ok", latency: float | None = 1.0) -> list[Turn]:
    """`num_tools` tool turns (drawn sizes, `status`, `latency` seconds each or none) and a final answer turn."""
    extra = {} if latency is None else {"tool_latency_s": float(latency)}
    tools = [
        Turn(
            gen_tokens=rng.randint(20, 600),
            tool=rng.choice(_TOOLS),
            tool_status=status,
            tool_tokens=rng.randint(0, 3000),
            extra=dict(extra),
        )
        for _ in range(num_tools)
    ]
    return [*tools, Turn(gen_tokens=rng.randint(20, 800))]


def _mixed(count: int, *, seed: int = 0, prompt_ids: int = 8, step_of=None, **kw) -> list[Trajectory]:
    """`count` ordinary trajectories of 0-6 tool calls over `prompt_ids` prompts (`step_of(i)` labels the step)."""
    rng = random.Random(seed)
    return [
        Trajectory(
            prompt_id=f"p-{i % prompt_ids}",
            sample=i // prompt_ids,
            step=None if step_of is None else step_of(i),
            prompt_tokens=rng.randint(100, 2000),
            turns=tuple(_turns(rng, rng.randint(0, 6), **kw)),
            reward=float(rng.random() < 0.5),
        )
        for i in range(count)
    ]


def one_trajectory() -> list[Trajectory]:
    return _mixed(1)


def all_identical() -> list[Trajectory]:
    one = _mixed(1, seed=3)[0]
    return [one] * 64


def single_prompt() -> list[Trajectory]:
    """One task, many runs: every trajectory has the same prompt id."""
    return _mixed(64, prompt_ids=1, seed=4)


def distinct_prompts() -> list[Trajectory]:
    """Every prompt id distinct (one run per task, as agent logs come)."""
    return _mixed(64, prompt_ids=64, seed=5)


def no_tool_turns() -> list[Trajectory]:
    """One generation each: nothing to route on at a tool return."""
    rng = random.Random(6)
    return [
        Trajectory(
            prompt_id=f"p-{i % 8}", prompt_tokens=rng.randint(50, 500), turns=(Turn(gen_tokens=rng.randint(1, 9000)),)
        )
        for i in range(64)
    ]


def many_turns() -> list[Trajectory]:
    """250 turns each, and one at the schema's most (4,096)."""
    rng = random.Random(7)
    out = []
    for i in range(16):
        tools = 249 if i else MAX_TURNS - 1
        turns = [Turn(gen_tokens=rng.randint(5, 60), tool="bash", tool_tokens=rng.randint(0, 80)) for _ in range(tools)]
        out.append(Trajectory(prompt_id=f"p-{i % 4}", prompt_tokens=300, turns=(*turns, Turn(gen_tokens=40))))
    return out


def zero_tool_tokens() -> list[Trajectory]:
    trajs = _mixed(48, seed=8)
    return [
        Trajectory(
            prompt_id=t.prompt_id,
            prompt_tokens=t.prompt_tokens,
            turns=tuple(
                Turn(gen_tokens=u.gen_tokens, tool=u.tool, tool_status=u.tool_status, extra=u.extra) for u in t.turns
            ),
        )
        for t in trajs
    ]


def huge_tool_returns() -> list[Trajectory]:
    """Tool returns near the schema's bound on a trajectory (10,000,000 tokens in all)."""
    out = []
    for i in range(8):
        big = MAX_TOKENS - 1000 - 200 * i
        turns = (
            Turn(gen_tokens=100, tool="search", tool_tokens=big, extra={"tool_latency_s": 3.0}),
            Turn(gen_tokens=100),
        )
        out.append(Trajectory(prompt_id=f"p-{i % 2}", prompt_tokens=800 - 100, turns=turns))
    return out


def zero_prompts() -> list[Trajectory]:
    trajs = _mixed(48, seed=9)
    return [Trajectory(prompt_id=t.prompt_id, prompt_tokens=0, turns=t.turns) for t in trajs]


def max_prompts() -> list[Trajectory]:
    """Prompts at the schema's bound: the whole trajectory is its prompt (one generation of 0 tokens)."""
    return [Trajectory(prompt_id=f"p-{i}", prompt_tokens=MAX_TOKENS, turns=(Turn(gen_tokens=0),)) for i in range(4)]


def all_tool_errors() -> list[Trajectory]:
    return _mixed(48, seed=10, status="error")


def all_tool_timeouts() -> list[Trajectory]:
    return _mixed(48, seed=11, status="timeout")


def latency_absent() -> list[Trajectory]:
    return _mixed(48, seed=12, latency=None)


def latency_zero() -> list[Trajectory]:
    return _mixed(48, seed=13, latency=0.0)


def latency_max() -> list[Trajectory]:
    return _mixed(48, seed=14, latency=MAX_TOOL_LATENCY_S)


def rewards_absent() -> list[Trajectory]:
    return [
        Trajectory(prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens, turns=t.turns) for t in _mixed(48, seed=15)
    ]


def steps_absent() -> list[Trajectory]:
    return _mixed(96, seed=16)


def steps_contiguous() -> list[Trajectory]:
    return _mixed(96, seed=17, step_of=lambda i: i // 32)


def steps_gapped() -> list[Trajectory]:
    """Step labels 0, 7, 100."""
    return _mixed(96, seed=18, step_of=lambda i: (0, 7, 100)[i // 32])


def one_quartile() -> list[Trajectory]:
    """Every trajectory the same length with different turns: the quartiles are all one number."""
    rng = random.Random(19)
    out = []
    for i in range(64):
        tools = rng.randint(0, 4)
        gen = [1000 // (tools + 1)] * (tools + 1)
        gen[-1] += 1000 - sum(gen)
        turns = [Turn(gen_tokens=g, tool="search", tool_tokens=0) for g in gen[:-1]]
        out.append(Trajectory(prompt_id=f"p-{i % 8}", prompt_tokens=500, turns=(*turns, Turn(gen_tokens=gen[-1]))))
    return out


def over_context() -> list[Trajectory]:
    """Totals past a 40,960-token context (the CLI's default --max-len), as a log of a longer-context model."""
    rng = random.Random(20)
    out = []
    for i in range(32):
        turns = [Turn(gen_tokens=2000, tool="python", tool_tokens=rng.randint(8000, 20000)) for _ in range(5)]
        out.append(Trajectory(prompt_id=f"p-{i % 4}", prompt_tokens=4000, turns=(*turns, Turn(gen_tokens=500))))
    return out


def twenty_thousand() -> list[Trajectory]:
    """20,000 trajectories over 10 steps (the long case: timed, not in the quick tests)."""
    return _mixed(20_000, seed=21, prompt_ids=500, step_of=lambda i: i // 2000)


def zero_generation() -> list[Trajectory]:
    """The policy generates nothing (0 tokens every turn); the context grows by prompts and tool returns only."""
    rng = random.Random(22)
    out = []
    for i in range(32):
        turns = [Turn(gen_tokens=0, tool="search", tool_tokens=rng.randint(1, 500)) for _ in range(rng.randint(1, 4))]
        out.append(Trajectory(prompt_id=f"p-{i % 4}", prompt_tokens=100, turns=(*turns, Turn(gen_tokens=0))))
    return out


def one_token_each() -> list[Trajectory]:
    """The smallest trajectories the schema allows: one token in all."""
    return [Trajectory(prompt_id=f"p-{i % 4}", prompt_tokens=0, turns=(Turn(gen_tokens=1),)) for i in range(16)]


def ends_on_tool() -> list[Trajectory]:
    """Every trajectory cut off by a turn limit: its last turn is a tool call."""
    rng = random.Random(23)
    return [
        Trajectory(prompt_id=f"p-{i % 8}", prompt_tokens=400, turns=tuple(_turns(rng, rng.randint(1, 5))[:-1]))
        for i in range(48)
    ]


def steps_mixed() -> list[Trajectory]:
    """Step labels on some lines only: file order is time order."""
    return _mixed(64, seed=24, step_of=lambda i: i // 16 if i % 3 else None)


def steps_uneven() -> list[Trajectory]:
    """Steps of 1, 60 and 3 trajectories."""
    sizes = (1, 60, 3)
    labels = [s for s, n in enumerate(sizes) for _ in range(n)]
    return _mixed(len(labels), seed=25, step_of=lambda i: labels[i])


def one_per_step() -> list[Trajectory]:
    """Forty steps of one trajectory each."""
    return _mixed(40, seed=26, step_of=lambda i: i)


def latency_mixed() -> list[Trajectory]:
    """Some tool calls timed, the others not."""
    rng = random.Random(27)
    out = []
    for t in _mixed(48, seed=27):
        turns = tuple(
            Turn(
                gen_tokens=u.gen_tokens,
                tool=u.tool,
                tool_status=u.tool_status,
                tool_tokens=u.tool_tokens,
                extra={"tool_latency_s": rng.uniform(0, 30)} if u.tool and rng.random() < 0.5 else {},
            )
            for u in t.turns
        )
        out.append(Trajectory(prompt_id=t.prompt_id, prompt_tokens=t.prompt_tokens, turns=turns))
    return out


def many_tools() -> list[Trajectory]:
    """A thousand distinct tool names, one of them 10,000 characters long, and extra keys everywhere."""
    rng = random.Random(28)
    out = []
    for i in range(64):
        turns = [
            Turn(
                gen_tokens=rng.randint(10, 300),
                tool=f"tool-{rng.randrange(1000)}-\u00e9",
                tool_tokens=rng.randint(0, 900),
                extra={"note": {"k": [1, 2]}},
            )
            for _ in range(rng.randint(1, 20))
        ]
        turns[0] = Turn(gen_tokens=5, tool="x" * 10_000, tool_tokens=7)
        out.append(
            Trajectory(
                prompt_id=f"p-{i % 8}",
                sample=MAX_TOKENS,
                prompt_tokens=200,
                turns=(*turns, Turn(gen_tokens=9)),
                reward=-1e308,
                extra={"source": "odd"},
            )
        )
    return out


CASES: dict[str, Callable[[], list[Trajectory]]] = {
    f.__name__: f
    for f in (
        one_trajectory,
        all_identical,
        single_prompt,
        distinct_prompts,
        no_tool_turns,
        many_turns,
        zero_tool_tokens,
        huge_tool_returns,
        zero_prompts,
        max_prompts,
        all_tool_errors,
        all_tool_timeouts,
        latency_absent,
        latency_zero,
        latency_max,
        rewards_absent,
        steps_absent,
        steps_contiguous,
        steps_gapped,
        one_quartile,
        over_context,
        zero_generation,
        one_token_each,
        ends_on_tool,
        steps_mixed,
        steps_uneven,
        one_per_step,
        latency_mixed,
        many_tools,
        twenty_thousand,
    )
}
SLOW_CASES = frozenset({"twenty_thousand"})


def write_case(name: str, folder: Path) -> Path:
    path = Path(folder) / f"{name}.jsonl"
    write_trace(path, CASES[name]())
    return path
