"""`RayRolloutBackend` on a real local Ray with real actors (the engine in each actor is scripted, see
`tests/runtime/ray_hosts.py`): actors answer concurrently, a slow reply within the grace is not a death, an actor
that stays silent past the grace or is SIGKILLed is a dead instance whose requests are re-queued and finish on a
live one, and weight versions are checked on both sides."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest

from libra.adapters.types import EventKind, InstanceSpec, Sampling, WeightUpdate
from tests.limits import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(240))]
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from libra.adapters.ray_host import connect

    started = connect("local", nodes=1)
    yield
    if started:
        ray.shutdown()


def _backend(tmp_path, *, gated=(), grace_s=600.0):
    from libra.adapters.ray_rollout import RayRolloutBackend
    from tests.runtime.ray_hosts import ScriptedHost

    gates = {name: str(tmp_path / f"{name}.go") for name in gated}
    backend = RayRolloutBackend(
        model="scripted", host=functools.partial(ScriptedHost, gates=gates), grace_s=grace_s, poll_wait_s=0.02
    )
    return backend, gates


def _poll_until(backend, done, what: str, seen: list) -> None:
    deadline = time.monotonic() + scaled(60)
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; events {seen[-5:]}"
        seen.extend(backend.poll())


def test_a_slow_actor_is_waited_on_while_the_others_answer(local_ray, tmp_path) -> None:
    backend, gates = _backend(tmp_path, gated=["slow"])
    try:
        for name in ("slow", "fast"):
            backend.start_instance(InstanceSpec(name=name))
        backend.submit("r-slow", "slow", PROMPT, Sampling(max_tokens=3))
        backend.submit("r-fast", "fast", PROMPT, Sampling(max_tokens=3))
        seen: list = []
        finished = lambda rid: any(e.request_id == rid and e.kind == EventKind.FINISHED for e in seen)  # noqa: E731
        _poll_until(backend, lambda: finished("r-fast"), "the fast actor", seen)
        # the fast actor finished its turn while the slow one has not answered a single poll: not a death
        assert {e.request_id for e in seen} == {"r-fast"} and backend.is_running("r-slow")
        assert backend.instances() == ("fast", "slow") and backend.deaths == []
        assert backend.context("r-fast") == (*PROMPT, 3, 4, 5)
        open(gates["slow"], "w").close()  # the slow engine answers now
        _poll_until(backend, lambda: finished("r-slow"), "the slow actor", seen)
        assert backend.release("r-slow") == (*PROMPT, 3, 4, 5) and backend.deaths == []
    finally:
        backend.shutdown()


def test_silent_past_the_grace_or_killed_is_dead_and_its_requests_finish_elsewhere(local_ray, tmp_path) -> None:
    backend, _ = _backend(tmp_path, gated=["hung"], grace_s=scaled(5))  # a live actor answers well within it
    try:
        for name in ("hung", "live"):
            backend.start_instance(InstanceSpec(name=name))
        backend.submit("r1", "hung", PROMPT, Sampling(max_tokens=4))
        seen: list = []
        _poll_until(backend, lambda: any(e.kind == EventKind.FINISHED for e in seen), "r1 on the live actor", seen)
        assert [(e.kind, e.instance) for e in seen if e.kind != EventKind.TOKENS] == [
            (EventKind.REQUEUED, "live"),
            (EventKind.FINISHED, "live"),
        ]
        (death,) = backend.deaths
        assert death.instance == "hung" and "no reply" in death.cause and death.requeued == {"r1": "live"}
        assert backend.release("r1") == (*PROMPT, 3, 4, 5, 6) and backend.instances() == ("live",)
        # SIGKILL of an actor mid-turn: Ray reports it gone, its request moves on with its context kept
        backend.start_instance(InstanceSpec(name="spare"))
        backend.submit("r2", "live", PROMPT, Sampling(max_tokens=6))
        _poll_until(backend, lambda: len(backend.context("r2")) > len(PROMPT), "r2's first token", seen)
        kept = len(backend.context("r2"))
        os.kill(backend.actor_pid("live"), signal.SIGKILL)
        seen.clear()
        _poll_until(backend, lambda: any(e.kind == EventKind.FINISHED for e in seen), "r2 on the spare", seen)
        assert backend.deaths[-1].instance == "live" and "Actor" in backend.deaths[-1].cause
        assert backend.deaths[-1].requeued == {"r2": "spare"}
        # the spare continued the turn from the kept context: 6 tokens in all, none lost or repeated
        assert kept > len(PROMPT) and backend.release("r2") == (*PROMPT, 3, 4, 5, 6, 7, 8)
    finally:
        backend.shutdown()


def test_weight_versions_are_checked_on_both_sides(local_ray, tmp_path) -> None:
    """The driver checks the version each actor reports, a new actor gets the newest weights, and an actor's
    refusal of an older version reaches the caller (the refusal itself is the host's: `EngineHost.load` refuses the
    same way; its real engine is exercised by the `ray_run` test)."""
    import ray

    backend, _ = _backend(tmp_path)
    try:
        backend.start_instance(InstanceSpec(name="a"))
        assert backend.load_weights(WeightUpdate(version=2, buckets=(b"w2",))) == 2
        assert backend.weight_version("a") == 2
        backend.start_instance(InstanceSpec(name="b"))  # a new actor gets the newest weights
        assert backend.weight_version("b") == 2
        with pytest.raises(ray.exceptions.RayTaskError, match="refusing older 1"):  # the actor refuses to go back
            backend.load_weights(WeightUpdate(version=1, buckets=(b"w1",)))
        assert backend.weight_version("a") == 2
    finally:
        backend.shutdown()
