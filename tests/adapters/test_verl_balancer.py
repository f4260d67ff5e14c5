"""`LibraLoadBalancer`'s books without Ray or verl: random interleavings of acquires, releases, tool returns, finishes,
added and removed servers. Servers answer `get_rollout_config()` from a dict here (in verl they are Ray actors; the
verl-environment tests in tests/adapters/verl_plugin run the real thing)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libra.adapters.verl.balancer import LibraLoadBalancer


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
