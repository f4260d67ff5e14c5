"""Bad input to the scheduling package's public API beyond the router's request contract: every one is a single
SpecError that names the bad value, raised before anything changes."""

from __future__ import annotations

import pytest

from libra.scheduling import PrefixTree, StateCodec, make_router, replay
from libra.scheduling.sources import leave_one_source_out, quantile_buckets, score_source
from libra.spec import SpecError, parse_buckets
from libra.workloads.generators import generate

BUCKETS = parse_buckets("2:5000,4:15000,8:inf")


@pytest.fixture(scope="module")
def trace():
    return generate("search-r1", num_steps=2, seed=3, num_prompts=4, samples_per_prompt=2)


@pytest.mark.parametrize("preset", ["adaptive", "published"])
@pytest.mark.parametrize(
    ("option", "value"),
    [
        # a bool for a number would pass as 0 or 1 (ceiling=True: a 100 % ceiling, repay=True: one step)
        ("ceiling", True),
        ("repay", True),
        ("confidence", True),
        ("price", True),
        ("admit_margin", True),
        ("cost_ratio", True),
        ("admit_min_count", True),
        ("shrink", True),
        ("seed", True),
        # NaN and strings for numbers
        ("price", float("nan")),
        ("cost_ratio", float("nan")),
        ("confidence", "0.9"),
        ("seed", float("nan")),
        ("seed", "0"),
        # a flag that is not True/False: "false" and "no" are truthy strings
        ("overflow", "false"),
        ("budget_mix", "no"),
        ("admit_select", 1),
        ("hold_first", "false"),
    ],
)
def test_cmlfq_option_of_wrong_type(preset, option, value) -> None:
    with pytest.raises(SpecError, match=rf"^cmlfq\.{option} must be .*got {value!r}".replace("(", r"\(")):
        make_router("cmlfq", BUCKETS, preset=preset, **{option: value})


def test_cmlfq_numpy_numbers_still_accepted() -> None:
    np = pytest.importorskip("numpy")
    router = make_router("cmlfq", BUCKETS, confidence=np.float64(0.8), price=np.float32(0.5), seed=np.int64(4))
    assert router.confidence == pytest.approx(0.8) and router.price == pytest.approx(0.5)


@pytest.mark.parametrize("tools", ["search", ["search", 1], ["search", ""]])
def test_tool_set_must_be_names(tools) -> None:
    # tools="search" was the set of its letters, so the tool "search" itself was then refused as unknown
    with pytest.raises(SpecError, match="tools must be a collection of tool names"):
        PrefixTree(tools=tools)
    with pytest.raises(SpecError, match="tools must be a collection of tool names"):
        make_router("cmlfq", BUCKETS, preset="published", tools=tools)


def test_tool_set_from_a_generator() -> None:
    assert StateCodec(tools=(t for t in ("search", "python"))).tools == frozenset({"search", "python"})


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("num_chunks", 0),
        ("num_chunks", -1),
        ("num_chunks", True),
        ("num_chunks", 1.5),
        ("progress_every", 1.5),
        ("progress_every", float("nan")),
        ("progress_every", True),
        ("warmup_steps", 0.5),
        ("warmup_steps", True),
    ],
)
def test_replay_option_of_wrong_type(trace, option, value) -> None:
    router = make_router("cmlfq", BUCKETS)
    with pytest.raises(SpecError, match=rf"{option} must be .*got {value!r}"):
        replay(router, trace, **{option: value})
    assert router.num_active == 0 and router.tree.agnostic.count == 0  # nothing was replayed


def test_replay_needs_a_router(trace) -> None:
    with pytest.raises(SpecError, match="replay needs a Router.*got str"):
        replay("cmlfq", trace)  # type: ignore[arg-type]


def test_merge_into_itself_is_refused(trace) -> None:
    tree = PrefixTree()
    tree.update(trace)
    count = tree.agnostic.count
    with pytest.raises(SpecError, match="cannot merge a prefix tree into itself"):
        tree.merge(tree)
    assert tree.agnostic.count == count  # merging it anyway counted every observation twice


def test_merge_needs_a_tree() -> None:
    with pytest.raises(SpecError, match="merge needs another PrefixTree, got dict"):
        PrefixTree().merge({})  # type: ignore[arg-type]


def test_quantile_buckets_of_nothing(trace) -> None:
    with pytest.raises(SpecError, match="quantile buckets need at least one trajectory"):
        quantile_buckets([])
    with pytest.raises(SpecError, match="at least one TP degree"):
        quantile_buckets(trace, tps=())


def test_leave_one_source_out_needs_two_sources(trace) -> None:
    scores = score_source(trace, quantile_buckets(trace), {"default": {}})
    # one source: the choice was the mean of no margins (NaN), so the first candidate won silently
    with pytest.raises(SpecError, match=r"at least two sources and one candidate, got 1 source\(s\) and 1"):
        leave_one_source_out({"only": scores}, ["default"])
    with pytest.raises(SpecError, match=r"got 2 source\(s\) and 0 candidate"):
        leave_one_source_out({"a": scores, "b": scores}, [])
    assert leave_one_source_out({"a": scores, "b": scores}, ["default"])["a"]["chosen"] == "default"
