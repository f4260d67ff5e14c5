"""`Turn` and `Trajectory` built in code obey the loader's rules, with its messages; what the writer writes, the loader
reads back equal (or the writer refuses it in one line)."""

from __future__ import annotations

import json
import math
import re

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.spec import SpecError
from libra.workloads import TraceError, Trajectory, Turn, group_by_step, load_trace, write_trace
from libra.workloads.trace import MAX_TOKENS, MAX_TURNS

TOOL_TURN = {"gen_tokens": 5, "tool": "bash", "tool_status": "ok", "tool_tokens": 3}
LAST_TURN = {"gen_tokens": 7, "tool": None, "tool_status": None, "tool_tokens": 0}
LINE = {"prompt_id": "p", "prompt_tokens": 10, "turns": [TOOL_TURN, LAST_TURN]}

# a bad turn (as the first of two) and the field the loader names
BAD_TURNS = [
    ({**TOOL_TURN, "gen_tokens": -3}, "gen_tokens"),
    ({**TOOL_TURN, "gen_tokens": True}, "gen_tokens"),
    ({**TOOL_TURN, "gen_tokens": 2.0}, "gen_tokens"),
    ({**TOOL_TURN, "gen_tokens": MAX_TOKENS + 1}, "gen_tokens"),
    ({**TOOL_TURN, "tool": ""}, "tool"),
    ({**TOOL_TURN, "tool": 3}, "tool"),
    ({**TOOL_TURN, "tool_status": "crashed"}, "tool_status"),
    ({**TOOL_TURN, "tool_status": None}, "tool_status"),
    ({**LAST_TURN, "tool_status": "ok"}, "tool_status"),
    ({**LAST_TURN, "tool_tokens": 4}, "tool_tokens"),
    ({**TOOL_TURN, "tool_tokens": -1}, "tool_tokens"),
    ({**TOOL_TURN, "tool_latency_s": -1}, "tool_latency_s"),
    ({**TOOL_TURN, "tool_latency_s": 86_400.5}, "tool_latency_s"),
    ({**TOOL_TURN, "tool_latency_s": "2s"}, "tool_latency_s"),
    ({**TOOL_TURN, "tool_latency_s": True}, "tool_latency_s"),
    ({**TOOL_TURN, "tool_latency_s": 10**400}, "tool_latency_s"),
]
# a bad trajectory: the line's changes, and the field the loader names
BAD_LINES = [
    ({"prompt_id": ""}, "prompt_id"),
    ({"prompt_tokens": -1}, "prompt_tokens"),
    ({"prompt_tokens": 1.5}, "prompt_tokens"),
    ({"turns": [LAST_TURN, LAST_TURN]}, "turns[0].tool"),
    ({"turns": [LAST_TURN] * (MAX_TURNS + 1)}, "turns"),
    ({"prompt_tokens": 0, "turns": [{**LAST_TURN, "gen_tokens": 0}]}, None),
    ({"prompt_tokens": MAX_TOKENS, "turns": [LAST_TURN]}, None),
    ({"sample": -1}, "sample"),
    ({"step": True}, "step"),
    ({"step": MAX_TOKENS + 1}, "step"),
    ({"reward": "high"}, "reward"),
    ({"reward": 10**400}, "reward"),
    ({"reward": False}, "reward"),
]


def _load_error(tmp_path, line: dict) -> TraceError:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    return info.value


def _turn(raw: dict) -> Turn:
    known = {k: raw[k] for k in ("gen_tokens", "tool", "tool_status", "tool_tokens") if k in raw}
    return Turn(**known, extra={k: v for k, v in raw.items() if k not in known})


def _trajectory(line: dict) -> Trajectory:
    known = ("prompt_id", "prompt_tokens", "sample", "step", "reward")
    turns = tuple(_turn(t) for t in line["turns"])
    return Trajectory(**{k: line[k] for k in known if k in line}, turns=turns)


@pytest.mark.parametrize(("turn", "field"), BAD_TURNS)
def test_a_turn_built_in_code_is_refused_as_the_loader_refuses_it(tmp_path, turn, field) -> None:
    loaded = _load_error(tmp_path, {**LINE, "turns": [turn, LAST_TURN]})
    assert loaded.field == f"turns[0].{field}"  # (the turn's index: it said 'gen_tokens' alone for counts)
    with pytest.raises(TraceError) as info:
        _turn(turn)
    built = info.value
    assert (built.field, built.message) == (field, loaded.message)
    assert str(built) == f"Turn: field {field!r}: {loaded.message}" and "\n" not in str(built)
    assert isinstance(built, SpecError) and isinstance(built, TraceError)


@pytest.mark.parametrize(("change", "field"), BAD_LINES)
def test_a_trajectory_built_in_code_is_refused_as_the_loader_refuses_it(tmp_path, change, field) -> None:
    loaded = _load_error(tmp_path, {**LINE, **change})
    assert loaded.field == field
    with pytest.raises(TraceError) as info:
        _trajectory({**LINE, **change})
    assert (info.value.field, info.value.message) == (field, loaded.message)
    assert str(info.value).startswith("Trajectory: ")


def _good() -> Trajectory:
    return _trajectory(LINE)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"turns": [_turn(LAST_TURN)]}, "turns", "must be a tuple of Turn values, got list"),
        ({"turns": ()}, "turns", "must be a non-empty list of turns"),
        ({"turns": (LAST_TURN,)}, "turns[0]", "must be a Turn, got dict"),
        ({"prompt_id": 17}, "prompt_id", "must be a non-empty string, got 17"),
        ({"extra": {"prompt_id": "q"}}, "extra", "key 'prompt_id' is a field of the schema"),
        ({"extra": {1: "x"}}, "extra", "keys must be strings"),
        ({"extra": None}, "extra", "must be a dict"),
    ],
)
def test_what_only_code_can_build_is_refused_too(change, field, message) -> None:
    """Values a line cannot hold: a list of turns (unhashable, mutable), an extra key that the writer would write
    over the field of that name, an extra that JSON keys cannot be."""
    with pytest.raises(TraceError, match=f"^Trajectory: field '{re.escape(field)}': {re.escape(message)}"):
        attrs.evolve(_good(), **change)


def test_a_status_that_is_not_a_string_is_refused_in_one_line() -> None:
    with pytest.raises(
        TraceError, match=r"^Turn: field 'tool_status': must be one of ok, error, timeout, got \['ok'\]$"
    ):
        Turn(gen_tokens=1, tool="bash", tool_status=["ok"])  # type: ignore[arg-type]  # (not: unhashable type)


def test_a_turn_extra_key_that_shadows_a_field_is_refused() -> None:
    with pytest.raises(TraceError, match="^Turn: field 'extra': key 'tool_tokens' is a field of the schema"):
        Turn(gen_tokens=1, tool="bash", tool_status="ok", extra={"tool_tokens": 9})


def test_a_tool_call_without_a_status_is_ok_unless_the_status_is_said_to_be_none() -> None:
    assert Turn(gen_tokens=1, tool="bash").tool_status == "ok"
    assert Turn(gen_tokens=1).tool_status is None
    with pytest.raises(TraceError, match="tool_status"):
        Turn(gen_tokens=1, tool="bash", tool_status=None)


def test_the_reward_is_the_float_the_loader_gives_back(tmp_path) -> None:
    """An integer past 2**53 written out reads back as a float that is not equal to it."""
    t = attrs.evolve(_good(), reward=2**53 + 1)
    assert type(t.reward) is float and attrs.evolve(t, reward=None).reward is None
    write_trace(tmp_path / "r.jsonl", [t])
    assert load_trace(tmp_path / "r.jsonl") == [t]


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"a": {1, 2}}, "a"), ({"a": [math.nan]}, "a"), ({"a": object()}, "a")],
)
def test_the_writer_refuses_what_json_cannot_hold_in_one_line_and_writes_nothing(tmp_path, extra, field) -> None:
    path = tmp_path / "w.jsonl"
    bad = attrs.evolve(_good(), extra=extra)
    with pytest.raises(TraceError) as info:
        write_trace(path, [_good(), bad])
    assert (info.value.line, info.value.field) == (2, field)
    assert "cannot be written as JSON" in str(info.value) and "\n" not in str(info.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    turn = attrs.evolve(_good().turns[0], extra={"tool_latency_s": 1.0, "meta": math.inf})
    with pytest.raises(TraceError) as info:
        write_trace(path, [attrs.evolve(_good(), turns=(turn, _good().turns[1]))])
    assert (info.value.line, info.value.field) == (1, "turns[0].meta")


def test_the_writer_names_what_is_not_a_trajectory_and_a_path_it_cannot_write(tmp_path) -> None:
    with pytest.raises(TraceError, match=r"w\.jsonl:1: cannot write a dict: a Trajectory is wanted$"):
        write_trace(tmp_path / "w.jsonl", [LINE])  # type: ignore[list-item]
    with pytest.raises(TraceError, match=r"cannot write trace: Is a directory$"):
        write_trace(tmp_path, [_good()])
    with pytest.raises(TraceError, match=r"no/w\.jsonl: cannot write trace: No such file or directory$"):
        write_trace(tmp_path / "no" / "w.jsonl", [_good()])


def test_group_by_step_refuses_a_number_of_chunks_below_one() -> None:
    with pytest.raises(SpecError, match="^steps_without_label must be an integer >= 1, got 0$"):
        group_by_step([_good()], steps_without_label=0)


# JSON values the extra fields may hold: what the loader gives back equal (strings as keys, lists not tuples)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
_counts = st.integers(0, 50_000)


@st.composite
def _turns(draw) -> tuple[Turn, ...]:
    tools = draw(st.lists(st.sampled_from(["search", "bash", "ü"]), max_size=6))
    turns = [
        Turn(
            gen_tokens=draw(_counts),
            tool=tool,
            tool_status=draw(st.sampled_from(["ok", "error", "timeout"])),
            tool_tokens=draw(_counts),
            extra=draw(
                st.fixed_dictionaries(
                    {},
                    optional={"tool_latency_s": st.floats(0, 3600) | st.integers(0, 3600), "note": _json},
                )
            ),
        )
        for tool in tools
    ]
    if not turns or draw(st.booleans()):
        turns.append(Turn(gen_tokens=draw(st.integers(1, 50_000)), extra=draw(st.dictionaries(st.just("x"), _json))))
    return tuple(turns)


trajectories = st.builds(
    Trajectory,
    prompt_id=st.text(min_size=1, max_size=8),
    prompt_tokens=st.integers(1, 100_000),
    turns=_turns(),
    sample=st.none() | st.integers(0, MAX_TOKENS),
    step=st.none() | st.integers(0, MAX_TOKENS),
    reward=st.none() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False),
    extra=st.dictionaries(
        st.text(max_size=6).filter(lambda k: k not in LINE and k not in ("sample", "step", "reward")), _json, max_size=3
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(trajectories, min_size=1, max_size=4), st.booleans())
def test_write_then_load_gives_the_same_trajectories(tmp_path_factory, trajs, gz) -> None:
    path = tmp_path_factory.mktemp("rt") / ("t.jsonl.gz" if gz else "t.jsonl")
    assert write_trace(path, trajs) == len(trajs)
    again = load_trace(path)
    assert again == trajs
    assert [t.to_json() for t in again] == [t.to_json() for t in trajs]  # (`extra` takes no part in ==)
    assert [[u.extra for u in t.turns] for t in again] == [[u.extra for u in t.turns] for t in trajs]
