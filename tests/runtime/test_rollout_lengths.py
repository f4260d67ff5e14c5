"""The rollout loop against the engine's `max_model_len` and its idle bound, engine-free (libra/runtime/rollout.py):
a turn never asks for more tokens than its instance has room for, a trajectory whose context fills the engine ends
as `truncated` (recorded in trace.jsonl and counted in run.jsonl) instead of failing on every retry, and a rollout
without engine events is bounded by seconds of the runtime's clock, not by a count of polls."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from libra.adapters.errors import RequestFailedError
from libra.adapters.routing import ToolReturn
from libra.adapters.types import EventKind, InstanceSpec, Sampling, StreamEvent
from libra.runtime import RunConfig
from libra.runtime.clock import Clock
from libra.runtime.config import RunConfigError
from libra.runtime.records import step_record
from libra.runtime.rollout import LiveRoutedRollout, RolloutStalled, check_prompts_fit, run_rollout
from libra.scheduling import make_router
from libra.spec import Bucket
from tests.limits import scaled
from tests.runtime.test_rollout_contracts import RequestBook


class _Bounded(RequestBook):
    """One instance holding `limit` tokens; each poll gives every running request one token, until its turn has its
    `max_tokens` or the context reaches the limit (vLLM stops a turn at the length). Like the vLLM and Ray backends
    it refuses a turn whose context already fills the limit; `strict` also refuses one whose context plus
    `max_tokens` exceeds it (as an OpenAI-compatible server answers 400). `asked`: (context, max_tokens) of every
    turn started."""

    def __init__(self, limit: int, *, strict: bool = False) -> None:
        self.limit, self.strict = limit, strict
        self.requests: dict[str, dict] = {}
        self.asked: list[tuple[int, int]] = []

    def instances(self) -> tuple[str, ...]:
        return ("i0",)

    def spec(self, name: str) -> InstanceSpec:
        return InstanceSpec(name=name, tp=1, max_num_seqs=8, max_model_len=self.limit)

    def instance_of(self, rid: str) -> str:
        return "i0"

    def num_requests(self, name: str) -> int:
        return len(self.requests)

    def submit(self, rid: str, instance: str, ids, sampling: Sampling) -> None:
        self.requests[rid] = {"context": list(ids), "state": "between", "left": 0}
        self._start(rid, sampling)

    def resume(self, rid: str, appended, sampling: Sampling) -> None:
        self.requests[rid]["context"].extend(appended)
        self._start(rid, sampling)

    def _start(self, rid: str, sampling: Sampling) -> None:
        r = self.requests[rid]
        room = self.limit - len(r["context"])
        self.asked.append((len(r["context"]), sampling.max_tokens))
        if room < 1 or (self.strict and sampling.max_tokens > room):
            r["state"] = "failed"
            raise RequestFailedError(rid, f"{len(r['context'])} + {sampling.max_tokens} tokens > {self.limit}")
        r["state"], r["left"] = "running", min(sampling.max_tokens, room)

    def poll(self) -> list[StreamEvent]:
        events = []
        for rid, r in self.requests.items():
            if r["state"] != "running":
                continue
            r["context"].append(7)
            r["left"] -= 1
            if r["left"] == 0:
                r["state"] = "between"
            kind = EventKind.TOKENS if r["left"] else EventKind.FINISHED
            events.append(StreamEvent(request_id=rid, instance="i0", kind=kind, new_token_ids=(7,), weight_version=0))
        return events


class _Searcher:
    """Calls a tool after every turn; each output is `output` tokens. `calls`: the turn index of every call."""

    def __init__(self, output: int = 2) -> None:
        self.output = output
        self.calls: list[int] = []

    def tool(self, request_id, turn_token_ids, turn_index) -> ToolReturn:
        self.calls.append(turn_index)
        return ToolReturn(tool="search", status="ok", output_token_ids=(5,) * self.output)

    def reward(self, request_id) -> float:
        return 1.0


def _rollout(backend, agent, prompts, *, max_tokens: int, max_turns: int = 10, clock: Clock | None = None, **kw):
    router = make_router("cmlfq", (Bucket(tp=1, max_tokens=math.inf),))
    routed = LiveRoutedRollout(backend=backend, router=router, bucket_instances={0: ("i0",)})
    return run_rollout(
        routed,
        prompts,
        agent=agent,
        sampling=lambda rid, turn: Sampling(max_tokens=max_tokens),
        max_turns=max_turns,
        step=0,
        clock=clock or Clock(),
        **kw,
    )


@pytest.mark.parametrize("strict", [False, True], ids=["engine-clamps", "engine-refuses"])
def test_a_trajectory_that_fills_the_context_ends_truncated_and_no_turn_asks_past_the_limit(strict) -> None:
    backend, agent = _Bounded(16, strict=strict), _Searcher(output=2)
    records = _rollout(backend, agent, {"r0": ("p0", 0, (1, 2, 3))}, max_tokens=6)
    # 3 + 6 = 9; the tool output is cut to leave the next turn its 6 tokens (none left: 0 of 2); 9 + 6 = 15; the
    # third turn has room for 1 token, asks for 1, and fills the 16 tokens: the trajectory ends there.
    # Before: the third turn asked for 6 (refused by a strict engine) or, clamped by the engine, filled the context
    # and the next turn was refused; either way the trajectory was retried from its prompt, failed the same way
    # each time, and the rollout raised RolloutLost after 3 attempts.
    assert backend.asked == [(3, 6), (9, 6), (15, 1)]
    assert all(context + max_tokens <= 16 for context, max_tokens in backend.asked)
    rec = records["r0"]
    assert (rec.attempts, len(rec.context), rec.mask) == (1, 16, (0, 0, 0) + (1,) * 13)
    assert [(t.gen_tokens, t.tool, t.tool_tokens) for t in rec.turns] == [
        (6, "search", 0),
        (6, "search", 0),
        (1, None, 0),
    ]
    assert agent.calls == [0, 1]  # no tool is called for a turn that no turn could follow
    assert rec.truncated == "its context of 16 tokens fills max_model_len 16"
    assert rec.trajectory().extra["truncated"] == rec.truncated


def test_a_prompt_with_no_room_for_max_tokens_is_admitted_with_the_room_left() -> None:
    backend, agent = _Bounded(8, strict=True), _Searcher()
    records = _rollout(backend, agent, {"r0": ("p0", 0, (1, 2, 3, 4, 5))}, max_tokens=6)
    # before: 5 + 6 > 8 was submitted as it was; the engine refused it and RequestFailedError ended the rollout
    assert backend.asked == [(5, 3)]
    assert [t.gen_tokens for t in records["r0"].turns] == [3] and records["r0"].truncated is not None
    assert agent.calls == []


def test_a_prompt_that_alone_fills_the_engine_is_refused_before_the_run_starts() -> None:
    check_prompts_fit(("short", "long"), ([1, 2], [1] * 7), 8)  # 7 tokens leave one to generate
    with pytest.raises(RunConfigError) as err:
        check_prompts_fit(("short", "search the topic documents"), ([1, 2], [1] * 8), 8)
    assert str(err.value) == (
        "prompts[1] ('search the topic documents') is 8 tokens: engine.max_model_len 8 leaves no room to generate; "
        "raise engine.max_model_len above 8 or shorten the prompt"
    )


def test_a_trajectory_that_fits_is_not_truncated_and_the_step_record_counts_those_that_were() -> None:
    prompts = {"short": ("p0", 0, (1, 2)), "long": ("p1", 0, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10))}
    records = _rollout(_Bounded(16), _Searcher(output=1), prompts, max_tokens=2, max_turns=2)
    assert records["short"].truncated is None and "truncated" not in records["short"].trajectory().extra
    assert [(t.gen_tokens, t.tool_tokens) for t in records["short"].turns] == [(2, 1), (2, 0)]
    assert records["long"].truncated is None  # 10 + 2 + 0 + 2 = 14 (the tool output cut to leave 2 + 2 tokens)
    full = _rollout(_Bounded(12), _Searcher(), {"full": ("p0", 0, (1,) * 10)}, max_tokens=2, max_turns=2)
    trajectories = [records["short"].trajectory(), records["long"].trajectory(), full["full"].trajectory()]
    result = SimpleNamespace(step=0, version=1, loss=0.0, start=0.0, end=1.0)
    info = {"plan": {}, "decisions": [], "expected": 3, "retried": 0, "requeued": 0, "rollout_window_s": [0.0, 1.0]}
    info["workers"] = {}
    everything = {**records, **full}
    rec = step_record(RunConfig(), result, info, everything, trajectories, 0, {}, main={}, wall=1.0)
    assert rec["trajectories"]["truncated"] == 1 and rec["trajectories"]["finished"] == 3


# -- the idle bound: seconds of the runtime's clock ------------------------------------------------------------------


class _Silent(RequestBook):
    """Accepts every request and answers `silent_polls` polls with no event (a busy engine, or a stuck one), then
    finishes each running request with one token."""

    def __init__(self, silent_polls: float) -> None:
        self.requests: dict[str, dict] = {}
        self.silent_polls, self.polls = silent_polls, 0

    def instances(self) -> tuple[str, ...]:
        return ("i0",)

    def submit(self, rid: str, instance: str, ids, sampling: Sampling) -> None:
        self.requests[rid] = {"context": list(ids), "state": "running"}

    def poll(self) -> list[StreamEvent]:
        self.polls += 1
        if self.polls <= self.silent_polls:
            return []
        events = []
        for rid, r in self.requests.items():
            if r["state"] == "running":
                r["context"].append(7)
                r["state"] = "done"
                events.append(StreamEvent(request_id=rid, instance="i0", kind=EventKind.FINISHED, new_token_ids=(7,)))
        return events


class _Ticking(Clock):
    """A clock that moves `tick` seconds each time it is read."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick, self.t = tick, 0.0

    def now(self) -> float:
        self.t += self.tick
        return self.t


PROMPT = {"r0": ("p0", 0, (1, 2, 3))}


def test_a_rollout_without_events_stops_after_max_idle_s_of_its_clock() -> None:
    backend = _Silent(silent_polls=math.inf)
    with pytest.raises(RolloutStalled, match=r"^rollout of step 0 made no progress for 1[01]\.0 s \(") as err:
        _rollout(backend, _Searcher(), PROMPT, max_tokens=1, clock=_Ticking(1.0), max_idle_s=10.0)
    assert "the bound is 10 s" in str(err.value) and backend.polls <= 11  # 1 s a poll: about 10 polls
    assert not backend.requests  # released on the way out


def test_a_stalled_rollout_stops_on_the_real_clock_too() -> None:
    backend = _Silent(silent_polls=math.inf)
    with pytest.raises(RolloutStalled, match="the bound is"):
        _rollout(backend, _Searcher(), PROMPT, max_tokens=1, max_idle_s=scaled(0.2))


def test_many_quick_polls_without_events_are_not_a_stall() -> None:
    """A backend that polls fast (the Ray backend waits 50 ms a poll, a paused engine not at all) used up the old
    bound of 200,000 polls within seconds: 'made no progress in 200000 polls' on a rollout that was progressing.
    On a clock that does not move, polls alone end nothing."""
    backend = _Silent(silent_polls=200_001)
    records = _rollout(backend, _Searcher(), PROMPT, max_tokens=1, max_turns=1, clock=_Ticking(0.0))
    assert records["r0"].context == (1, 2, 3, 7)


def test_the_old_count_of_polls_still_bounds_with_a_deprecation_warning() -> None:
    backend = _Silent(silent_polls=math.inf)
    with pytest.deprecated_call(match="max_idle_polls"), pytest.raises(RolloutStalled, match=r"or 5 polls\)$"):
        _rollout(backend, _Searcher(), PROMPT, max_tokens=1, clock=_Ticking(0.0), max_idle_polls=5)
    assert backend.polls == 6


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "60"])
def test_max_idle_s_must_be_finite_positive_seconds(value) -> None:
    with pytest.raises(ValueError, match=r"^max_idle_s must be finite seconds > 0, got "):
        _rollout(_Silent(silent_polls=0), _Searcher(), PROMPT, max_tokens=1, max_idle_s=value)
