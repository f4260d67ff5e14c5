"""Hypothesis strategies shared by the scheduling tests: small random trajectories in the trace schema."""

from __future__ import annotations

from hypothesis import strategies as st

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
        prompt_tokens=draw(st.integers(0, 2000)),
        turns=draw(turns()),
    )


def steps_of_trajectories(max_steps: int = 4, max_per_step: int = 8):
    return st.lists(st.lists(trajectories(), max_size=max_per_step), min_size=1, max_size=max_steps)
