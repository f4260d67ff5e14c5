"""`LibraLoadBalancer`'s books without Ray or verl: random interleavings of acquires, releases, tool returns, finishes,
added and removed servers. Servers answer `get_rollout_config()` from a dict here (in verl they are Ray actors; the
verl-environment tests in tests/adapters/verl_plugin run the real thing)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.adapters.verl.balancer import LibraLoadBalancer
from libra.spec import SpecError


def published_options() -> dict:
    """Router options that select C-MLFQ's published rule (start small, promote on overflow) whichever preset is the
    project's default: the books checked here do not depend on the preset, and the moves asserted below need one."""
    from libra.scheduling import cmlfq

    return {"preset": "published"} if hasattr(cmlfq.CMLFQRouter, "create") else {}


YAML = {
    "policy": "cmlfq",
    "options": published_options(),
    "buckets": [{"tp": 1, "max_tokens": 300}, {"tp": 2, "max_tokens": 900}, {"tp": 4}],
}


class DictBalancer(LibraLoadBalancer):
    """Servers are (tp, bucket) tuples standing for their rollout config."""

    def _rollout_configs(self, handles):
        return [{"tensor_model_parallel_size": tp, "custom": {"libra": {"bucket": b}}} for tp, b in handles]


SERVERS = {"a": (1, 0), "b": (1, 0), "c": (2, 1), "d": (4, 2)}

op = st.one_of(
    st.tuples(st.just("turn"), st.integers(0, 5), st.integers(0, 1200), st.sampled_from(["ok", "error", "timeout"])),
    st.tuples(st.just("finish"), st.integers(0, 5)),
    st.tuples(st.just("remove"), st.sampled_from(sorted(SERVERS))),
    st.tuples(st.just("add"), st.sampled_from(sorted(SERVERS))),
    st.tuples(st.just("clear")),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=60))
def test_every_turn_goes_to_the_routed_bucket_and_in_flight_returns_to_zero(ops) -> None:
    lb = DictBalancer(dict(SERVERS), YAML)
    live = dict(SERVERS)
    context: dict[int, int] = {}
    for o in ops:
        if o[0] == "turn":
            _, r, tokens, status = o
            rid = f"r{r}"
            if r not in context:
                lb.report_start(rid, f"p{r % 2}", 50)
                context[r] = 50
            if not live:
                continue
            sid, handle = lb.acquire_server(rid)
            assert handle == live[sid]
            want = lb.router.bucket_of(rid)
            have = {b for _, b in live.values()}
            # the router's bucket when it has a server, else the nearest one that has
            expect = want if want in have else min(have, key=lambda b: (abs(b - want), b < want))
            assert live[sid][1] == expect
            lb.release_server(sid, rid)
            context[r] += tokens + 20
            d = lb.report_tool_return(rid, "search", tokens, status, context[r])
            assert d["bucket"] >= want  # C-MLFQ only promotes
        elif o[0] == "finish":
            r = o[1]
            if r in context:
                record = {"prompt_id": f"p{r % 2}", "prompt_tokens": 50, "turns": [{"gen_tokens": 20}]}
                lb.report_finish(f"r{r}", record)
                del context[r]
        elif o[0] == "remove":
            lb.remove_servers([o[1]])
            live.pop(o[1], None)
        elif o[0] == "add":
            lb.add_servers({o[1]: SERVERS[o[1]]})
            live[o[1]] = SERVERS[o[1]]
        else:
            assert lb.clear_sticky_cache()["cleared_entries"] >= 0
        assert lb.get_total_inflight() == 0
        assert sorted(lb.get_all_servers()) == sorted(live)
    lb.end_step()
    assert lb.router.num_active == len(context)


def test_a_trajectory_sticks_to_its_server_until_the_router_moves_it() -> None:
    lb = DictBalancer(dict(SERVERS), YAML)
    lb.report_start("x", "p", 40)
    first, _ = lb.acquire_server("x")
    other, _ = lb.acquire_server("y")  # a second request takes the other TP-1 server (least loaded)
    assert {first, other} == {"a", "b"}
    lb.release_server(first)
    assert lb.acquire_server("x")[0] == first  # sticky
    lb.release_server(first)
    d = lb.report_tool_return("x", "search", 500, "ok", 600)  # outgrows the 300-token bucket
    assert d["migrate"] and d["bucket"] == 1
    assert lb.acquire_server("x")[0] == "c"
    assert lb.get_status()["libra"]["counts"]["server_moves"] == 1


@pytest.mark.parametrize(
    "config, words",
    [
        (None, "must be a mapping"),  # an empty YAML file
        ({"buckets": {"tp": 1}}, "must be a list"),
        ({"buckets": [4]}, "buckets[0] must be a mapping"),
        ({"buckets": [{"max_tokens": 300}, {"tp": 2}]}, "buckets[0].tp must be an integer"),
        ({"buckets": [{"tp": "2"}]}, "buckets[0].tp must be an integer"),
        ({"buckets": [{"tp": 1, "max_tokens": "300"}, {"tp": 2}]}, "buckets[0].max_tokens must be a number"),
        # a null limit in the middle used to become a second open-ended bucket
        ({"buckets": [{"tp": 1}, {"tp": 2, "max_tokens": 900}, {"tp": 4}]}, "only the last bucket is open-ended"),
        ({"buckets": [{"tp": 1}], "options": ["preset"]}, "'options' must be a mapping"),
    ],
)
def test_a_malformed_router_yaml_is_refused_in_one_line(config, words) -> None:
    with pytest.raises(SpecError) as err:
        DictBalancer({}, config)
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


def test_router_yaml_options_may_be_null() -> None:
    lb = DictBalancer(dict(SERVERS), {**YAML, "options": None})  # `options:` with nothing after it in the YAML
    assert [b.tp for b in lb.buckets] == [1, 2, 4]


def test_aborted_and_unparsed_trajectories_leave_the_books_without_teaching_the_router() -> None:
    lb = DictBalancer(dict(SERVERS), YAML)
    lb.report_start("x", "p", 40)
    sid, _ = lb.acquire_server("x")
    lb.release_server(sid, "x")
    lb.report_abort("x")
    lb.report_abort("x")  # twice, or for a request never admitted: nothing to do
    lb.report_abort("never")
    assert lb.router.num_active == 0 and lb.get_total_inflight() == 0
    lb.report_start("y", "p", 40)
    lb.report_finish("y", {"prompt_id": "p", "turns": []})  # a record the trace schema refuses
    assert lb.router.num_active == 0 and lb.get_total_inflight() == 0
    counts = lb.get_status()["libra"]["counts"]
    assert (counts["aborted"], counts["unparsed"], counts.get("finished", 0)) == (1, 1, 0)
    nodes = lb.router.tree.num_nodes
    lb.end_step()
    assert lb.router.tree.num_nodes == nodes and not lb.router.tree.prompts  # no prompt learnt from either
    lb.report_start("x", "p", 40)  # the same id may start again (verl's resume after an abort)
    assert lb.router.num_active == 1


@pytest.mark.parametrize(
    "bad, words",
    [
        ((1, 7), "says bucket 7"),  # out of the router YAML's range
        ((1, "x"), "says bucket 'x'"),
        ((3, None), "TP-3 server matches no bucket"),
    ],
)
def test_a_server_that_fits_no_bucket_is_refused_before_any_is_added(bad, words) -> None:
    class Servers(DictBalancer):
        def _rollout_configs(self, handles):  # (tp, bucket); a None bucket: the server names none
            return [
                {"tensor_model_parallel_size": tp, **({} if b is None else {"custom": {"libra": {"bucket": b}}})}
                for tp, b in handles
            ]

    lb = Servers({"a": (1, 0)}, YAML)
    with pytest.raises(SpecError) as err:
        lb.add_servers({"e": (1, 0), "bad": bad})
    assert "\n" not in str(err.value) and words in str(err.value) and "bad" in str(err.value), str(err.value)
    status = lb.get_status()
    assert status["registered_handles"] == ["a"] and lb.get_all_servers() == ["a"]  # "e" was not added either
