"""`RoutedRollout` and the request book on the shared real vLLM engines, used the way that goes wrong: a tool output
that does not fit the instance, a bucket whose instances are not live, a router choosing a bucket nobody serves,
unknown request ids, an instance told to hand its requests to itself. Every mistake is one typed error or a failed
result; nothing is left running on the engines."""

from __future__ import annotations

import pytest

from libra.adapters import EventKind, InstanceNotFound, InstanceSpec, RequestFailedError, Sampling, UnsupportedConfig
from libra.adapters.errors import RequestNotFound
from libra.adapters.routing import RoutedRollout, ToolReturn
from tests.limits import scaled

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

TURN = Sampling(max_tokens=4, ignore_eos=True)


def _router(spec: str):
    from libra.scheduling import make_router
    from libra.spec import parse_buckets

    return make_router("fcfs", parse_buckets(spec))


def _flood(request_id, turn_ids, turn_index):
    """`big` gets a tool output longer than the small instance's whole context (256 tokens); `ok` a short one."""
    size = 300 if request_id == "big" else 3
    return ToolReturn(tool="search", status="ok", output_token_ids=tuple(40 + k % 7 for k in range(size)))


def _idle(backend) -> None:
    assert [backend.num_requests(n) for n in backend.instances()] == [0, 0], "requests left on the engines"
    assert not backend.has_running()


def test_run_returns_a_failed_result_for_a_tool_output_that_does_not_fit(vllm_backend):
    """The resume of `big` cannot start on `small` (context 256); `run()` used to raise out of the loop with
    `ok` still generating on the engine; now `big` ends with its error and `ok` finishes."""
    rollout = RoutedRollout(backend=vllm_backend, router=_router("1:inf"), bucket_instances={0: ["small"]})
    prompts = {rid: (f"p-{rid}", [5, 6, 7, 8]) for rid in ("big", "ok")}
    results = rollout.run(prompts, sampling=TURN, tool=_flood, max_turns=2)
    assert results["big"].error == "context of 308 tokens fills max_model_len 256"
    assert results["big"].context == () and len(results["big"].trajectory.turns) == 1
    assert results["ok"].error is None and len(results["ok"].context) == 4 + 4 + 3 + 4
    _idle(vllm_backend)


def test_a_bucket_without_a_live_instance_fails_its_requests_by_name(vllm_backend):
    rollout = RoutedRollout(backend=vllm_backend, router=_router("1:inf"), bucket_instances={0: ["gone"]})
    with pytest.raises(RequestFailedError) as exc:
        rollout.admit("r-1", prompt_id="p", prompt_token_ids=[5, 6], sampling=TURN)
    assert str(exc.value) == (
        "request 'r-1' failed: bucket 0's instances ['gone'] are not live (live: ['large', 'small'])"
    )
    results = rollout.run({"r-2": ("p", [5, 6])}, sampling=TURN, tool=_flood, max_turns=2)
    assert results["r-2"].error == "bucket 0's instances ['gone'] are not live (live: ['large', 'small'])"
    _idle(vllm_backend)


def test_a_router_choosing_a_bucket_nobody_serves_is_refused_and_nothing_is_left_behind(vllm_backend):
    class _Wrong:
        """FCFS whose admissions say bucket 2 (it has buckets 0 and 1)."""

        def __init__(self):
            self.inner = _router("1:60,2:inf")
            self.buckets = self.inner.buckets

        def admit(self, request_id, **kwargs):
            import attrs

            decision = self.inner.admit(request_id, **kwargs)
            return attrs.evolve(decision, bucket=2) if request_id == "second" else decision

        def __getattr__(self, name):
            return getattr(self.inner, name)

    rollout = RoutedRollout(backend=vllm_backend, router=_Wrong(), bucket_instances={0: ["small"], 1: ["large"]})
    with pytest.raises(UnsupportedConfig, match=r"^the router chose bucket 2; instances serve \[0, 1\]$"):
        rollout.run({"first": ("p", [5, 6]), "second": ("p", [5, 6])}, sampling=TURN, tool=_flood, max_turns=2)
    _idle(vllm_backend)  # `first` was submitted before the failure: released, not left generating


def test_unknown_requests_and_a_stop_that_hands_requests_to_itself(vllm_backend):
    b = vllm_backend
    with pytest.raises(RequestNotFound) as exc:
        b.context("nobody")
    assert str(exc.value) == "unknown request 'nobody'; it was never submitted or is released"
    with pytest.raises(RequestNotFound):
        b.migrate("nobody", "large")
    b.submit("held", "small", [5, 6, 7], TURN)
    try:
        with pytest.raises(ValueError, match="instance 'small' cannot hand its requests to itself"):
            b.stop_instance("small", migrate_to="small")  # it used to stop, leaving 'held' on no instance
        with pytest.raises(InstanceNotFound, match="no live instance 'elsewhere'"):
            b.stop_instance("small", migrate_to="elsewhere")
        assert b.instances() == ("large", "small") and b.instance_of("held") == "small"
    finally:
        b.release("held")
    _idle(b)


def test_a_turn_the_engine_refuses_leaves_no_request_behind(vllm_backend):
    """vLLM refuses an empty prompt and token ids outside its vocabulary at `add_request`; the refused request used
    to stay in the book (not running, never finishing) and its id stayed taken; a refused resume kept the tool
    output in the context."""
    b = vllm_backend
    with pytest.raises(ValueError, match=r"^request 'empty' has an empty prompt; an engine needs at least one token$"):
        b.submit("empty", "small", [], TURN)
    with pytest.raises(Exception, match="out of vocabulary"):  # vLLM's VLLMValidationError
        b.submit("oov", "small", [5, 10**6], TURN)
    for rid in ("empty", "oov"):
        with pytest.raises(RequestNotFound):
            b.context(rid)
    _idle(b)
    b.submit("oov", "small", [5, 6], TURN)  # the id is free again
    try:
        while b.is_running("oov"):
            b.poll()
        done = b.context("oov")
        with pytest.raises(Exception, match="out of vocabulary"):  # vLLM's VLLMValidationError
            b.resume("oov", [7, -3], TURN)
        assert b.context("oov") == done and not b.is_running("oov")
        b.resume("oov", [7], TURN)  # a good tool output resumes as before
        while b.is_running("oov"):
            b.poll()
        assert b.context("oov")[: len(done) + 1] == (*done, 7) and len(b.context("oov")) == len(done) + 1 + 4
    finally:
        b.release("oov")
    _idle(b)


def test_run_refuses_a_turn_limit_that_allows_no_turn(vllm_backend):
    rollout = RoutedRollout(backend=vllm_backend, router=_router("1:inf"), bucket_instances={0: ["small"]})
    for bad in (0, 1.5):  # 0 used to run one turn anyway
        with pytest.raises(ValueError, match=rf"^RoutedRollout.run: max_turns must be a whole number >= 1, got {bad}$"):
            rollout.run({"r": ("p", [5, 6])}, sampling=TURN, tool=_flood, max_turns=bad)
    assert not rollout.decisions
    _idle(vllm_backend)


def test_a_failover_policy_naming_an_unknown_instance_fails_the_request_and_not_the_poll(vllm_backend):
    """The instance a failover policy names for a dead engine's request is checked: "ghost" used to raise a bare
    KeyError out of `poll()` half-way through the death (the death unrecorded, the other requests unhandled)."""
    import os
    import signal

    b = vllm_backend
    b.start_instance(InstanceSpec(name="doomed", tp=1, max_num_seqs=2, max_model_len=128))
    default = b.failover
    b.failover = lambda dead, live, rid: "ghost"
    try:
        b.submit("g0", "doomed", [5, 6, 7], Sampling(max_tokens=64, ignore_eos=True))
        while len(b.context("g0")) < 4:
            b.poll()
        for pid in b.engine_pids("doomed"):
            os.kill(pid, signal.SIGKILL)
        events = []
        while not events:
            events = [e for e in b.poll() if e.request_id == "g0" and e.kind == EventKind.FAILED]
        assert "doomed" not in b.instances() and b.deaths[-1].failed == ("g0",)
        assert "the failover policy chose 'ghost', which is not a live awake instance (live: ['large', 'small'])" in (
            events[0].error
        )
        with pytest.raises(RequestFailedError, match="chose 'ghost'"):
            b.release("g0")
    finally:
        b.failover = default
        if "doomed" in b.instances():
            b.stop_instance("doomed")
    _idle(b)
