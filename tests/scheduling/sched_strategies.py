"""Hypothesis strategies shared by the scheduling tests: small random trajectories in the trace schema, bucket limits,
and an option set of the priced rule."""

from __future__ import annotations

from hypothesis import strategies as st

from libra.spec import Bucket
from libra.workloads.trace import Trajectory, Turn

TOOLS = ("search", "bash")


@st.composite
def turns(draw) -> tuple[Turn, ...]:
    num_tool = draw(st.integers(0, 4))
    out = [
        Turn(
            gen_tokens=draw(st.integers(0, 3000)),
            tool=draw(st.sampled_from(TOOLS)),
            tool_status=draw(st.sampled_from(("ok", "error", "timeout"))),
            tool_tokens=draw(st.sampled_from((0, 10, 499, 500, 800, 4999, 5000, 9000))),
        )
        for _ in range(num_tool)
    ]
    if not out or draw(st.booleans()):  # a finished trajectory ends without a tool; a cut one may not
        out.append(Turn(gen_tokens=draw(st.integers(0, 3000))))
    return tuple(out)


@st.composite
def trajectories(draw, *, num_prompts: int = 3) -> Trajectory:
    return Trajectory(
        prompt_id=f"p{draw(st.integers(0, num_prompts - 1))}",
        prompt_tokens=draw(st.integers(1, 2000)),  # a trajectory holds at least one token (the trace schema)
        turns=draw(turns()),
    )


def steps_of_trajectories(max_steps: int = 4, max_per_step: int = 8):
    return st.lists(st.lists(trajectories(), max_size=max_per_step), min_size=1, max_size=max_steps)


# the priced rule moving on any gain (no price, almost no confidence, no budget): an exit taken where another bucket is
# the likeliest misses a move, whatever the margin; every share matters to a decision
EAGER = {
    "budget": None,
    "price": 0.0,
    "confidence": 0.01,
    "cold": "promote",
    "budget_mix": False,
    "repay": None,
    "ceiling": None,
    "hold_first": False,
}

# small windows for the rule's fast paths (test_priced_exits.py, test_published_path.py, test_priced_native.py):
# three prompts, two tools, up to five returns each, and any bucket limits
_window_turn = st.builds(
    Turn,
    gen_tokens=st.integers(1, 3000),
    tool=st.sampled_from(["a", "b"]),
    tool_status=st.sampled_from(["ok", "error"]),
    tool_tokens=st.integers(0, 4000),
)
window_trajectories = st.builds(
    Trajectory,
    prompt_id=st.sampled_from(["p0", "p1", "p2"]),
    prompt_tokens=st.integers(0, 600),
    turns=st.lists(_window_turn, min_size=0, max_size=5).map(lambda ts: (*ts, Turn(gen_tokens=20))),
)


@st.composite
def bucket_limits(draw) -> list[Bucket]:
    """One to four finite limits, then an unbounded last bucket or a finite one."""
    edges = sorted(draw(st.sets(st.integers(300, 15_000), min_size=1, max_size=4)))
    last = draw(st.sampled_from([float("inf"), edges[-1] + 5_000]))
    return [Bucket(tp=2**i, max_tokens=x) for i, x in enumerate([*edges, last])]


#: the priced rule's options and a few steps of small windows, as the tests that compare two paths of the rule draw
#: them: `@given(**SMALL_WINDOW_CASES)` (a few observations a node, any limits: shares far from 0 and 1)
SMALL_WINDOW_CASES = {
    "steps": st.lists(st.lists(window_trajectories, min_size=1, max_size=24), min_size=2, max_size=4),
    "limits": bucket_limits(),
    "shrink": st.sampled_from([0.0, 1.0, 3.0, "auto"]),
    "min_count": st.integers(1, 2),
    "per_step": st.integers(0, 40),
    "eager": st.booleans(),
}
