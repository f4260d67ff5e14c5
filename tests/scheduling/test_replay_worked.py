"""`libra route-eval`'s replay and its metrics worked out by hand on four trajectories, with the baselines whose
decisions can be written down in advance (classic MLFQ, fcfs in turn, the oracle, the predictor's majorities)."""

from __future__ import annotations

import pytest

from libra.scheduling import make_router
from libra.scheduling.evaluate import replay
from libra.spec import Bucket
from libra.workloads.trace import Trajectory, Turn

BUCKETS = (Bucket(tp=1, max_tokens=100.0), Bucket(tp=2, max_tokens=300.0), Bucket(tp=4, max_tokens=float("inf")))


def _trace() -> list[Trajectory]:
    """Two steps. Step 0: `a` ends at 60 tokens (bucket 0), `b` generates 150 tokens over two turns and ends at 240
    (bucket 1), `c` ends at 500 after generating 350 (bucket 2). Step 1: `a` again, 90 tokens (bucket 0)."""
    return [
        Trajectory(prompt_id="a", prompt_tokens=20, turns=(Turn(gen_tokens=40),), step=0),
        Trajectory(
            prompt_id="b",
            prompt_tokens=30,
            turns=(Turn(gen_tokens=50, tool="bash", tool_status="ok", tool_tokens=60), Turn(gen_tokens=100)),
            step=0,
        ),
        Trajectory(
            prompt_id="c",
            prompt_tokens=50,
            turns=(Turn(gen_tokens=150, tool="bash", tool_status="error", tool_tokens=100), Turn(gen_tokens=200)),
            step=0,
        ),
        Trajectory(prompt_id="a", prompt_tokens=20, turns=(Turn(gen_tokens=70),), step=1),
    ]


def test_classic_mlfq_promotes_a_level_each_time_service_crosses_its_limit() -> None:
    """mlfq (service = generated tokens, checked every 512 tokens and at each generation's end, and at each tool
    return): `b` has generated 50 after turn 1 and 150 at its end: one promotion, carrying its 240-token context;
    `c` crosses 100 at the end of its first generation (context 200: promoted to bucket 1), then 300 at its end
    (context 500: bucket 2). Single-shot right: `a` twice and `b` (3 of 4); `c` ends right after two moves."""
    r = replay(make_router("mlfq", BUCKETS), _trace(), progress_every=512)
    assert r.trajectories == 4 and r.steps == 2
    assert r.confusion == ((2, 0, 0), (0, 1, 0), (0, 0, 1))
    assert r.routing_accuracy == 3 / 4 and r.final_bucket_accuracy == 1.0
    assert r.migrations_per_trajectory == 3 / 4
    assert r.migrated_tokens == 240 + 200 + 500
    assert r.total_tokens == 60 + 240 + 500 + 90
    assert r.migrated_token_fraction == pytest.approx(940 / 890)


def test_fcfs_deals_buckets_in_turn_and_never_moves() -> None:
    r = replay(make_router("fcfs", BUCKETS), _trace())
    # a -> 0 (right), b -> 1 (right), c -> 2 (right), a again -> 0 (right)
    assert r.confusion == ((2, 0, 0), (0, 1, 0), (0, 0, 1)) and r.routing_accuracy == 1.0
    assert r.migrated_tokens == 0 and r.migrations_per_trajectory == 0.0
    fixed = replay(make_router("fcfs", BUCKETS, bucket=2), _trace())
    assert fixed.confusion == ((0, 0, 2), (0, 0, 1), (0, 0, 1)) and fixed.routing_accuracy == 1 / 4


def test_the_oracle_is_always_right_and_a_warmup_step_is_not_scored() -> None:
    r = replay(make_router("oracle", BUCKETS), _trace())
    assert r.routing_accuracy == r.final_bucket_accuracy == 1.0 and r.migrated_tokens == 0
    warm = replay(make_router("oracle", BUCKETS), _trace(), warmup_steps=1)
    assert warm.trajectories == 1 and warm.steps == 1 and warm.total_tokens == 90
    assert warm.confusion == ((1, 0, 0), (0, 0, 0), (0, 0, 0))


def test_the_predictor_learns_majorities_only_between_steps() -> None:
    """Step 0 has nothing learnt: everything to bucket 0 (`a` right, `b` and `c` wrong). Step 1: `a`'s own history
    says bucket 0 (right); `most_common` says the commonest final bucket of step 0, a tie of one each broken
    toward the smaller bucket: 0 (right)."""
    for mode in ("history", "most_common"):
        r = replay(make_router("predictor", BUCKETS, mode=mode), _trace())
        assert r.confusion == ((2, 0, 0), (1, 0, 0), (1, 0, 0)), mode
        assert r.routing_accuracy == 2 / 4 and r.migrated_tokens == 0


def test_progress_reports_every_so_many_tokens_move_a_request_earlier() -> None:
    """With progress every 64 tokens `c` is seen at 64, 128 (> 100 generated: promoted at context 178), ... and
    during its second generation at 250+64k: 314 generated > 300 at context 464: moved with less context."""
    coarse = replay(make_router("mlfq", BUCKETS), _trace(), progress_every=512)
    fine = replay(make_router("mlfq", BUCKETS), _trace(), progress_every=64)
    assert fine.confusion == coarse.confusion
    assert fine.migrated_tokens < coarse.migrated_tokens


def test_a_decision_to_stay_says_so_and_a_promotion_says_why() -> None:
    router = make_router("mlfq", BUCKETS)
    assert router.admit("r", prompt_id="p", prompt_tokens=10).reason == "admit"
    stay = router.on_progress("r", context_tokens=90)  # 80 generated: under the first limit
    assert (stay.bucket, stay.migrate, stay.reason, stay.migrated_tokens) == (0, False, "stay", 0)
    back = router.on_tool_return("r", tool="bash", tool_tokens=30, status="ok", context_tokens=120)
    assert (back.bucket, back.migrate, back.reason) == (0, False, "stay")  # tool tokens are no service
    up = router.on_progress("r", context_tokens=150)  # 110 generated
    assert (up.bucket, up.migrate, up.from_bucket, up.migrated_tokens, up.reason) == (1, True, 0, 150, "promote")
    assert router.bucket_of("r") == 1 and router.migrations_of("r") == 1
    fcfs = make_router("fcfs", BUCKETS)
    fcfs.admit("s", prompt_id="p", prompt_tokens=10)
    assert fcfs.on_progress("s", context_tokens=5_000).reason == "stay"  # a rule without a progress rule stays


def test_bad_arguments_name_what_is_wrong() -> None:
    from libra.scheduling.evaluate import compare
    from libra.spec import SpecError

    with pytest.raises(SpecError, match="at least one Bucket"):
        make_router("mlfq", ())
    with pytest.raises(SpecError, match="increase strictly"):
        make_router("mlfq", (BUCKETS[1], BUCKETS[0]))
    with pytest.raises(SpecError, match=r"index in 0\.\.2, got 3"):
        make_router("fcfs", BUCKETS, bucket=3)
    router = make_router("mlfq", BUCKETS)
    with pytest.raises(SpecError, match="prompt_tokens must be a non-negative integer, got -1"):
        router.admit("r", prompt_id="p", prompt_tokens=-1)
    router.admit("r", prompt_id="p", prompt_tokens=10)
    with pytest.raises(SpecError, match="tool must be a non-empty string"):
        router.on_tool_return("r", tool="", tool_tokens=5, status="ok", context_tokens=20)
    with pytest.raises(SpecError, match="tool_tokens must be a non-negative integer, got -5"):
        router.on_tool_return("r", tool="bash", tool_tokens=-5, status="ok", context_tokens=20)
    with pytest.raises(SpecError, match="context_tokens must be a non-negative integer, got 2.5"):
        router.on_tool_return("r", tool="bash", tool_tokens=5, status="ok", context_tokens=2.5)
    with pytest.raises(SpecError, match="route evaluation needs at least one trajectory"):
        replay(make_router("mlfq", BUCKETS), [])
    with pytest.raises(SpecError, match="progress_every must be >= 1, got 0"):
        replay(make_router("mlfq", BUCKETS), _trace(), progress_every=0)
    results = compare(lambda p: make_router(p, BUCKETS), ["oracle", "fcfs"], _trace())
    assert [(r.policy, r.trajectories, r.routing_accuracy) for r in results] == [("oracle", 4, 1.0), ("fcfs", 4, 1.0)]
    warm = compare(lambda p: make_router(p, BUCKETS), ["oracle"], _trace(), warmup_steps=1)
    assert warm[0].trajectories == 1  # the options reach every replay


def test_names_and_counts_of_subclasses_of_str_and_int_are_accepted() -> None:
    """A tool name of a `str` subclass (an enum's value, say) and counts of an `int` subclass take the checked path
    and pass it; an empty name, zero tool tokens and a zero context are all fine where they are real."""

    class Name(str):
        pass

    class Count(int):
        pass

    router = make_router("mlfq", BUCKETS)
    router.admit("r", prompt_id="p", prompt_tokens=0)
    d = router.on_tool_return("r", tool=Name("bash"), tool_tokens=Count(5), status="ok", context_tokens=Count(5))
    assert d.bucket == 0 and router.context_in_flight == 5
    router.on_tool_return("r", tool="bash", tool_tokens=0, status="timeout", context_tokens=5)
    router.admit("q", prompt_id="p", prompt_tokens=0)
    assert router.on_tool_return("q", tool="bash", tool_tokens=0, status="ok", context_tokens=0).bucket == 0


def test_a_tool_call_without_a_status_is_replayed_as_ok() -> None:
    plain = [
        Trajectory(
            prompt_id="x",
            prompt_tokens=10,
            turns=(Turn(gen_tokens=20, tool="bash", tool_tokens=400), Turn(gen_tokens=5)),
        )
    ]
    ok = [
        Trajectory(
            prompt_id="x",
            prompt_tokens=10,
            turns=(Turn(gen_tokens=20, tool="bash", tool_status="ok", tool_tokens=400), Turn(gen_tokens=5)),
        )
    ]
    for policy in ("mlfq", "cmlfq"):
        assert replay(make_router(policy, BUCKETS), plain) == replay(make_router(policy, BUCKETS), ok)


def test_the_predictor_keeps_the_window_of_a_prompt_and_its_length_deciles() -> None:
    """`window` last runs of a prompt vote; `num_length_bins` prompt-length bins (deciles by default: 9 edges) back
    an unseen prompt; `most_common` takes the majority of every run seen."""
    runs = [
        Trajectory(prompt_id="a", prompt_tokens=10 + i, turns=(Turn(gen_tokens=50 if i < 30 else 200),), step=0)
        for i in range(40)
    ]  # 30 runs of "a" end in bucket 0, the 10 latest in bucket 1
    newest = Trajectory(prompt_id="a", prompt_tokens=10, turns=(Turn(gen_tokens=200),), step=1)
    assert replay(make_router("predictor", BUCKETS), [*runs, newest], warmup_steps=1).confusion[1] == (1, 0, 0)
    one = replay(make_router("predictor", BUCKETS, window=10), [*runs, newest], warmup_steps=1)
    assert one.confusion[1] == (0, 1, 0)  # its last 10 runs: bucket 1
    common = replay(make_router("predictor", BUCKETS, mode="most_common"), [*runs, newest], warmup_steps=1)
    assert common.confusion[1] == (1, 0, 0)  # 30 of 40 in bucket 0
    router = make_router("predictor", BUCKETS)
    for i, t in enumerate(runs):
        router.admit(i, prompt_id=f"u{i}", prompt_tokens=t.prompt_tokens)
        router.finish(i, t)
    router.end_step()
    assert len(router._edges) == 9  # deciles of 40 distinct prompt lengths
    single = make_router("predictor", BUCKETS, num_length_bins=1)  # one bin: the prompt length says nothing
    assert single.num_length_bins == 1


def test_an_unseen_prompt_on_a_length_edge_takes_the_bin_from_that_edge_up() -> None:
    """Ten runs with 10-token prompts end in bucket 0, ten with 20-token prompts in bucket 2: the length edges are
    10, 15 and 20, and a new prompt of exactly 20 tokens belongs to the bin from 20 up (bucket 2), not to the empty
    bin below it (which would fall back to the tie of the whole population: bucket 0)."""
    router = make_router("predictor", BUCKETS)
    for i in range(20):
        prompt = 10 if i < 10 else 20
        t = Trajectory(prompt_id=f"p{i}", prompt_tokens=prompt, turns=(Turn(gen_tokens=20 if i < 10 else 400),))
        router.admit(i, prompt_id=t.prompt_id, prompt_tokens=prompt)
        router.finish(i, t)
    router.end_step()
    assert list(router._edges) == [10.0, 15.0, 20.0]
    assert router.admit("new", prompt_id="new", prompt_tokens=20).bucket == 2
    assert router.admit("short", prompt_id="short", prompt_tokens=12).bucket == 0
