"""The rollout loop's contracts under faults, engine-free (libra/runtime/rollout.py): with the run's real router and a
scripted rollout backend (the engines themselves cannot fail on cue here), every request finishes exactly once, a
failed attempt is retried under a new request id and teaches the router nothing, and a rollout stopped by Ctrl-C
leaves no request behind, neither on the engines nor in the router's books."""

from __future__ import annotations

import math

import pytest

from libra.adapters.errors import EngineDiedError, RequestFailedError
from libra.adapters.types import EventKind, Sampling, StreamEvent
from libra.runtime.clock import Clock
from libra.runtime.rollout import LiveRoutedRollout, run_rollout
from libra.scheduling import make_router
from libra.spec import Bucket


class RequestBook:
    """A scripted backend's requests (`requests[rid]`: its `context` and `state`, running, done or failed), as the
    rollout loop reads them back."""

    requests: dict[str, dict]

    def context(self, rid: str) -> tuple[int, ...]:
        return tuple(self.requests[rid]["context"])

    def release(self, rid: str) -> tuple[int, ...]:
        r = self.requests.pop(rid)
        if r["state"] == "failed":
            raise RequestFailedError(rid, "its engine died")
        return tuple(r["context"])

    def has_running(self) -> bool:
        return any(r["state"] == "running" for r in self.requests.values())


class _Scripted(RequestBook):
    """Instances `names`; each poll gives every running request one token, the `length`-th finishes its turn.
    `die(name)` kills an instance: at the next poll its requests fail (as `VLLMRolloutBackend` reports a death
    that no live instance took over) and it leaves `instances()`; `hand_over(name, to)`: at the next poll it
    leaves and its requests go on on `to` (re-queued, as a death whose requests a live instance took)."""

    def __init__(self, length: int = 3, names: tuple[str, ...] = ("i0", "i1")) -> None:
        self.live = list(names)
        self.length = length
        self.requests: dict[str, dict] = {}
        self.dying: set[str] = set()
        self.handing: dict[str, str] = {}
        self.deaths: list[EngineDiedError] = []
        self.submitted: list[str] = []

    def instances(self) -> tuple[str, ...]:
        return tuple(self.live)

    def num_requests(self, name: str) -> int:
        return sum(1 for r in self.requests.values() if r["instance"] == name)

    def submit(self, rid: str, instance: str, ids, sampling: Sampling) -> None:
        assert instance in self.live and rid not in self.requests
        self.submitted.append(rid)
        self.requests[rid] = {"instance": instance, "context": list(ids), "made": 0, "state": "running"}

    def die(self, name: str) -> None:
        self.dying.add(name)

    def hand_over(self, name: str, to: str) -> None:
        self.handing[name] = to

    def poll(self) -> list[StreamEvent]:
        events = []
        for name, to in sorted(self.handing.items()):
            self.live.remove(name)
            moved = [rid for rid, r in self.requests.items() if r["instance"] == name and r["state"] == "running"]
            for rid in moved:
                self.requests[rid]["instance"] = to
                events.append(StreamEvent(request_id=rid, instance=to, kind=EventKind.REQUEUED))
            self.deaths.append(EngineDiedError(name, "killed", requeued=dict.fromkeys(moved, to), failed=()))
        self.handing.clear()
        for name in sorted(self.dying):
            self.live.remove(name)
            failed = [rid for rid, r in self.requests.items() if r["instance"] == name and r["state"] == "running"]
            for rid in failed:
                self.requests[rid]["state"] = "failed"
                events.append(StreamEvent(request_id=rid, instance=name, kind=EventKind.FAILED, error="died"))
            self.deaths.append(EngineDiedError(name, "killed", requeued={}, failed=tuple(failed)))
        self.dying.clear()
        for rid, r in self.requests.items():
            if r["state"] != "running":
                continue
            r["context"].append(7)
            r["made"] += 1
            done = r["made"] == self.length
            r["state"] = "done" if done else "running"
            kind = EventKind.FINISHED if done else EventKind.TOKENS
            events.append(StreamEvent(request_id=rid, instance=r["instance"], kind=kind, new_token_ids=(7,)))
        return events


class _Agent:
    def tool(self, request_id, turn_token_ids, turn_index):
        return None

    def reward(self, request_id) -> float:
        return 1.0


def _rollout(backend: _Scripted, router, prompts, on_poll):
    routed = LiveRoutedRollout(backend=backend, router=router, bucket_instances={0: ("i0", "i1")})
    return run_rollout(
        routed,
        prompts,
        agent=_Agent(),
        sampling=lambda rid, turn: Sampling(max_tokens=3),
        max_turns=1,
        step=0,
        clock=Clock(),
        on_poll=on_poll,
    )


def _router_finishing_into(finished: list):
    """The run's router (C-MLFQ), each trajectory it is told finished also appended to `finished`."""
    from libra.scheduling.cmlfq import CMLFQRouter

    class Recording(CMLFQRouter):
        def finish(self, request_id, trajectory) -> None:
            finished.append((request_id, trajectory))
            super().finish(request_id, trajectory)

    return Recording.create((Bucket(tp=1, max_tokens=math.inf),))


PROMPTS = {f"s0-p0-{j}": ("p0", j, (1, 2, 3)) for j in range(6)}


def test_a_failed_attempt_is_retried_and_teaches_the_router_nothing() -> None:
    backend, finished = _Scripted(), list[tuple]()
    router = _router_finishing_into(finished)
    polls = []

    def kill_i0_at_the_second_poll() -> None:
        polls.append(1)
        if len(polls) == 2:
            backend.die("i0")

    records = _rollout(backend, router, PROMPTS, kill_i0_at_the_second_poll)
    assert sorted(records) == sorted(PROMPTS)  # every request finished once, none dropped
    retried = sorted(rid for rid, r in records.items() if r.attempts == 2)
    assert retried and all(f"{rid}~2" in backend.submitted for rid in retried)
    assert all(r.context == (1, 2, 3, 7, 7, 7) and len(r.turns) == 1 for r in records.values())
    # before: the failed attempts were finished in the router too, each a trajectory of no turn (the tree and the
    # price learned requests that never happened)
    assert sorted(t.turns[0].gen_tokens for _, t in finished) == [3] * len(PROMPTS)
    assert len({rid.split("~")[0] for rid, _ in finished}) == len(finished) == len(PROMPTS)
    assert router.num_active == 0 and not backend.requests


def test_the_requeues_of_a_failed_attempt_stay_counted() -> None:
    backend = _Scripted(length=5, names=("i0", "i1", "i2"))
    router = make_router("cmlfq", (Bucket(tp=1, max_tokens=math.inf),))
    polls: list[int] = []
    on_i0: list[str] = []

    def hand_over_i0_then_kill_i1() -> None:
        polls.append(1)
        if len(polls) == 2:
            on_i0.extend(rid for rid, r in backend.requests.items() if r["instance"] == "i0")
            backend.hand_over("i0", "i1")
        if len(polls) == 3:
            backend.die("i1")

    records = _rollout(backend, router, PROMPTS, hand_over_i0_then_kill_i1)
    assert sorted(records) == sorted(PROMPTS) and on_i0
    # re-queued on i1, failed there with it, retried on i2: one re-queue each (before: 0, the first attempt's
    # re-queue went with its record, and the step's `requeued` undercounted)
    assert {rid: (r.requeues, r.attempts) for rid, r in records.items() if rid in on_i0} == dict.fromkeys(on_i0, (1, 2))
    assert sum(r.requeues for r in records.values()) == len(on_i0)


def test_an_interrupted_rollout_leaves_no_request_on_the_engines_or_in_the_router() -> None:
    backend, finished = _Scripted(length=50), list[tuple]()
    router = _router_finishing_into(finished)
    polls = []

    def ctrl_c_at_the_third_poll() -> None:
        polls.append(1)
        if len(polls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _rollout(backend, router, PROMPTS, ctrl_c_at_the_third_poll)
    assert not backend.requests and not finished
    # before: the router still held the 6 requests (its context in flight counted them for the next rollout)
    assert router.num_active == 0


# -- the orchestrator's records of a death ---------------------------------------------------------------------------


def _orchestrator_on(backend: _Scripted, tmp_path, *, steps: int):
    """An orchestrator set up by hand on `backend` (what `_setup` builds, without a model or engines)."""
    from types import SimpleNamespace

    from libra.planning.placement import place
    from libra.runtime import Orchestrator, RunConfig, virtual
    from libra.runtime.trainer import TrainerThread

    config = RunConfig(steps=steps, prompts=("a b", "c d"), samples_per_prompt=2, max_turns=1, max_tokens=3)
    orch = Orchestrator(config, tmp_path, agent_factory=lambda step, tokenizer: _Agent())
    orch.backend, orch._deaths_seen, orch.watch, orch.hybrids = backend, 0, None, None
    orch.tokenizer, orch.prompt_ids = SimpleNamespace(pad_token_id=0), [[1, 2], [3, 4]]
    orch.pending, orch.history, orch.ready = [], {}, {}
    orch.plan = virtual.virtual_planner(config).plan(virtual.prior_profile(config, [2, 2]))
    orch.placement = place(orch.plan, virtual.virtual_cluster(config))
    router = make_router("cmlfq", (Bucket(tp=1, max_tokens=math.inf),))
    orch.routed = LiveRoutedRollout(backend=backend, router=router, bucket_instances={0: ("i0", "i1")})
    orch.train = TrainerThread(None, clock_t0=orch.clock.t0)
    orch._target = steps
    return orch


def _kill_i0_at_the_second_poll(backend: _Scripted):
    polls = []

    def hook(orch) -> None:
        polls.append(1)
        if len(polls) == 2:
            backend.die("i0")

    return hook


def test_an_engine_death_in_the_last_rollout_of_a_run_is_recorded(tmp_path) -> None:
    backend = _Scripted()
    orch = _orchestrator_on(backend, tmp_path, steps=1)
    orch.on_poll = _kill_i0_at_the_second_poll(backend)
    orch._rollout(0)
    _, records, info = orch.ready[0]
    assert sorted(records) == ["s0-p0-0", "s0-p0-1", "s0-p1-0", "s0-p1-1"]
    (death,) = backend.deaths
    assert death.failed and info["retried"] == len(death.failed)
    # before: no boundary follows the last rollout, and the death was recorded nowhere (the run's records showed
    # retried trajectories and no cause)
    died = [d for d in info["decisions"] if d["kind"] == "EngineDied"]
    assert [(d["source"], d["step"], d["worker"], d["failed"]) for d in died] == [
        ("elastic", 0, "i0", len(death.failed))
    ]


def test_an_engine_death_in_an_earlier_rollout_is_left_to_the_next_boundary(tmp_path) -> None:
    backend = _Scripted()
    orch = _orchestrator_on(backend, tmp_path, steps=2)
    orch.on_poll = _kill_i0_at_the_second_poll(backend)
    orch._rollout(0)
    assert not [d for d in orch.ready[0][2]["decisions"] if d["kind"] == "EngineDied"]
    orch._note_deaths(1)  # what the boundary before rollout 1 records (then restarts the instance)
    assert [(d["kind"], d["step"], d["worker"]) for d in orch.pending] == [("EngineDied", 1, "i0")]
