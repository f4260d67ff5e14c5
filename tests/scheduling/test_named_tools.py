"""A common tool is keyed by its name only while its name says something (`QuantileStateCodec.tool_test`): a
two-sample Kolmogorov-Smirnov test on the tokens left after the tool's first return in each trajectory, against
the same after each other common tool's first returns (the only common tool: against all the others together).
Names that split a kind of return without telling anything apart (a shell tool named after the task's group) share
OTHER_TOOL, as rare tools do (test_rare_tools.py)."""

from __future__ import annotations

import random
import zlib

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling import CMLFQ_PRESETS, PrefixTree, make_router, replay
from libra.scheduling.size_classes import OTHER_TOOL, QuantileStateCodec, ks_critical, ks_distance
from libra.scheduling.sources import quantile_buckets
from libra.spec import SpecError
from libra.workloads import Trajectory, Turn
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus


def _traj(pid: str, returns: list[tuple[str, int]], gen: int = 20) -> Trajectory:
    turns = [Turn(gen_tokens=gen, tool=tool, tool_status="ok", tool_tokens=n) for tool, n in returns]
    return Trajectory(prompt_id=pid, prompt_tokens=100, turns=(*turns, Turn(gen_tokens=gen)))


def _grouped(n: int = 200, groups: int = 10, seed: int = 0) -> list[Trajectory]:
    """`n` runs of a one-tool shell agent whose tool is named after the task's group (`g3/bash`): 1-9 calls of
    30-3,000 tokens, drawn alike for every group."""
    rng = random.Random(seed)
    return [
        _traj(f"t{i}", [(f"g{i % groups}/bash", rng.randint(30, 3000)) for _ in range(rng.randint(1, 9))])
        for i in range(n)
    ]


def test_names_that_tell_nothing_apart_share_one_key() -> None:
    runs = _grouped()
    tested, share_only = QuantileStateCodec(), QuantileStateCodec(tool_test=None)
    for codec in (tested, share_only):
        for step in range(0, len(runs), 50):
            codec.observe(runs[step : step + 50])
    # every group is in a tenth of the runs: the share alone names them all
    assert {share_only.tool_key(f"g{k}/bash") for k in range(10)} == {f"g{k}/bash" for k in range(10)}
    assert {tested.tool_key(f"g{k}/bash") for k in range(10)} == {OTHER_TOOL}


def _two_kinds(groups: int, n: int = 400) -> list[Trajectory]:
    """`n` runs of a search agent, 1-5 `search` returns then one `answer`, every name prefixed by the run's group
    (`g3/search`, `g3/answer`)."""
    rng = random.Random(2)
    out = []
    for i in range(n):
        g = i % groups
        returns = [(f"g{g}/search", rng.randint(50, 900)) for _ in range(rng.randint(1, 5))] + [(f"g{g}/answer", 10)]
        out.append(_traj(f"t{i}", returns))
    return out


@pytest.mark.parametrize("groups", [2, 5, 10])
def test_names_by_group_of_two_kinds_of_tool_share_one_key(groups) -> None:
    """Pair by pair: a group's `search` is not told apart from another group's `search` (nor its `answer` from
    another's), so no name is kept; compared with all the other tools together, each differed from the mix of
    searches and answers and every name was kept, splitting the tree by group."""
    codec = QuantileStateCodec()
    runs = _two_kinds(groups)
    for step in range(0, len(runs), 40):
        codec.observe(runs[step : step + 40])
    assert {codec.tool_key(f"g{g}/{kind}") for g in range(groups) for kind in ("search", "answer")} == {OTHER_TOOL}
    one = QuantileStateCodec()
    runs = _two_kinds(1)
    for step in range(0, len(runs), 40):
        one.observe(runs[step : step + 40])
    assert one.tool_key("g0/search") == "g0/search" and one.tool_key("g0/answer") == "g0/answer"


def test_tools_that_differ_in_what_follows_them_are_named() -> None:
    """A search agent's `search` opens a run, its `answer` closes it: what follows each differs, and both are named;
    a tool with no other tool to compare with is named as before the test."""
    rng = random.Random(1)
    runs = [
        _traj(f"q{i}", [("search", rng.randint(50, 900)) for _ in range(rng.randint(1, 5))] + [("answer", 10)])
        for i in range(60)
    ]
    codec = QuantileStateCodec()
    codec.observe(runs)
    assert codec.tool_key("search") == "search" and codec.tool_key("answer") == "answer"
    alone = QuantileStateCodec()
    alone.observe(_grouped(groups=1))
    assert alone.tool_key("g0/bash") == "g0/bash"


def test_too_few_returns_to_tell_apart_are_not_named_yet() -> None:
    """Two runs of each tool cannot be told apart at the test's level whatever they hold: both share OTHER_TOOL
    until more come (then the one that differs is named)."""
    runs = [_traj(f"a{i}", [("search", 500), ("search", 500), ("answer", 10)]) for i in range(2)]
    codec = QuantileStateCodec()
    codec.observe(runs)
    assert codec.tool_key("search") == codec.tool_key("answer") == OTHER_TOOL
    codec.observe([_traj(f"b{i}", [("search", 500), ("search", 500), ("answer", 10)]) for i in range(6)])
    assert codec.tool_key("search") == "search" and codec.tool_key("answer") == "answer"


def _one_return(pid: str, tool: str, left: int) -> Trajectory:
    """A run with one return of `tool` and `left` tokens generated after it."""
    turns = (Turn(gen_tokens=10, tool=tool, tool_status="ok", tool_tokens=5), Turn(gen_tokens=left))
    return Trajectory(prompt_id=pid, prompt_tokens=100, turns=turns)


def _near_the_threshold() -> tuple[list[Trajectory], list[Trajectory]]:
    """Two steps of two tools: on the first what follows them differs plainly (distance 1); with the second the
    distance over both is 0.25, between the critical values at 0.05 (0.215) and at 0.01 (0.257)."""
    first = [_one_return(f"a{i}", "A", 10 + i) for i in range(20)] + [
        _one_return(f"b{i}", "B", 60 + i) for i in range(20)
    ]
    second = [_one_return(f"c{i}", t, 30 + i) for t in ("A", "B") for i in range(60)]
    return first, second


def test_a_name_is_kept_at_the_looser_level_and_given_at_the_stricter() -> None:
    """Hysteresis: tools named on the first step keep their names while the test tells them apart at 0.05; the same
    returns seen at once, by a codec that named neither, tell them apart only at 0.05, not at 0.01: no names."""
    first, second = _near_the_threshold()
    assert ks_critical(80, 80, 0.05) < 0.25 < ks_critical(80, 80, 0.01)
    stepwise, at_once = QuantileStateCodec(), QuantileStateCodec()
    stepwise.observe(first)
    assert stepwise.tool_key("A") == "A" and stepwise.tool_key("B") == "B"
    stepwise.observe(second)
    at_once.observe(first + second)
    assert stepwise.tool_key("A") == "A" and stepwise.tool_key("B") == "B"
    assert at_once.tool_key("A") == at_once.tool_key("B") == OTHER_TOOL
    # with no band between the levels the first step's names are lost on the second
    strict = QuantileStateCodec(tool_keep=0.01)
    strict.observe(first)
    strict.observe(second)
    assert strict.tool_key("A") == OTHER_TOOL


def test_the_names_kept_travel_with_a_saved_tree(tmp_path) -> None:
    """A loaded tree keys tools as the saved one did, the names kept at the looser level included (they depend on
    which tools had names, not on the returns alone)."""
    first, second = _near_the_threshold()
    tree = PrefixTree(size_edges="quantile:3")
    tree.update(first)
    tree.update(second)
    tree.save(tmp_path / "tree.json")
    loaded = PrefixTree.load(tmp_path / "tree.json")
    assert loaded.codec.tool_key("A") == tree.codec.tool_key("A") == "A"


@pytest.mark.parametrize("keep", [0, 0.005, 1, True, "0.05", float("nan")])
def test_a_bad_keep_level_is_a_one_line_error(keep) -> None:
    with pytest.raises(SpecError, match=r"tool_keep must be a level in \[tool_test, 1\)"):
        QuantileStateCodec(tool_keep=keep)


@pytest.mark.parametrize("level", [0, 1, -0.5, 2.0, True, "0.01", float("nan")])
def test_a_bad_tool_test_level_is_a_one_line_error(level) -> None:
    with pytest.raises(SpecError, match=r"tool_test must be a level in \(0, 1\) or None"):
        QuantileStateCodec(tool_test=level)


def _brute_ks(a: list[int], b: list[int]) -> float:
    return max(abs(sum(x <= v for x in a) / len(a) - sum(y <= v for y in b) / len(b)) for v in a + b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.lists(st.integers(0, 50), min_size=1, max_size=30))
def test_ks_distance_is_the_largest_gap_of_the_distribution_functions(a, b) -> None:
    assert ks_distance(a, b) == pytest.approx(_brute_ks(a, b), abs=1e-12)


def test_ks_critical_values_are_the_textbook_ones() -> None:
    # c(level) for two samples of n = m: c * sqrt(2 / n); c(0.05) = 1.358, c(0.01) = 1.628, c(0.001) = 1.949
    for level, c in ((0.05, 1.358), (0.01, 1.628), (0.001, 1.949)):
        assert ks_critical(50, 50, level) == pytest.approx(c * (2 / 50) ** 0.5, rel=1e-3)


def test_the_first_returns_travel_with_a_saved_tree(tmp_path) -> None:
    tree = PrefixTree(size_edges="quantile:3")
    tree.update(_grouped(groups=1) + [_traj(f"x{i}", [("search", 300), ("answer", 5)]) for i in range(30)])
    tree.save(tmp_path / "tree.json")
    loaded = PrefixTree.load(tmp_path / "tree.json")
    assert loaded.codec.state()["tools"] == tree.codec.state()["tools"]
    assert [loaded.codec.tool_key(t) for t in ("g0/bash", "search", "answer")] == [
        tree.codec.tool_key(t) for t in ("g0/bash", "search", "answer")
    ]
    # a tree saved before the test names its common tools by their share alone
    data = tree.to_dict()
    for key in ("test", "keep", "named", "first_returns"):
        del data["size_class_state"]["tools"][key]
    old = PrefixTree.from_dict(data)
    assert old.codec.tool_test is None and old.codec.tool_key("answer") == "answer"


def test_a_shell_agent_with_tools_named_by_group_routes_as_with_one_name() -> None:
    """InterCode Bash / GPT-4 (one `bash` tool, 200 runs) with the tool named after the task's group of 20 (a tenth
    of the runs each, as a log whose tool names carry a category would give): the default routes as with the real
    name (34.5 % single-shot accuracy, 8.3 % of the tokens moved). By the share alone each group's name split the
    tree: 33.0 % at 7.2 %, its margin over the best baseline +5.0 -> +3.5."""
    trajs = load_corpus(DEFAULT_CORPUS / "held-out")["intercode-bash-gpt4"]
    tasks = sorted({t.prompt_id for t in trajs}, key=lambda p: (zlib.crc32(p.encode()), p))
    group = {task: i // 20 for i, task in enumerate(tasks)}
    renamed = [
        attrs.evolve(
            t, turns=tuple(attrs.evolve(u, tool=f"g{group[t.prompt_id]}/{u.tool}") if u.tool else u for u in t.turns)
        )
        for t in trajs
    ]
    buckets = quantile_buckets(trajs)
    results = [replay(make_router("cmlfq", buckets, **CMLFQ_PRESETS["adaptive"]), tr) for tr in (trajs, renamed)]
    assert results[1].routing_accuracy == pytest.approx(results[0].routing_accuracy, abs=0.005)
    assert results[1].migrated_token_fraction == pytest.approx(results[0].migrated_token_fraction, abs=0.005)


def test_a_codec_pickled_before_the_test_names_by_the_share_alone() -> None:
    """A checkpoint written before the test (no first returns, no levels) restores as a codec of the share rule:
    it keys by name the tools the share names, and goes on so after more steps."""
    codec = QuantileStateCodec()
    codec.observe(_grouped()[:100])
    fields, own = codec.__getstate__()
    for key in ("_first_tools", "_first_lefts", "tool_test", "tool_keep"):
        del own[key]
    restored = QuantileStateCodec.__new__(QuantileStateCodec)
    restored.__setstate__((fields, own))
    assert restored.tool_test is None
    restored.observe(_grouped(seed=1)[:50])
    assert restored.tool_key("g3/bash") == "g3/bash" and codec.tool_key("g3/bash") == OTHER_TOOL
