"""`QuantileStateCodec.absorb` (merging another rank's learnt size classes), checked where mutation testing found it
unchecked (`LIBRA_MUTATION_ONLY='*absorb__mutmut*' scripts/mutation.sh size_classes`, docs/testing.md): a codec
that absorbs another's samples ends as one codec that observed its own returns and then the other's would."""

from __future__ import annotations

from libra.scheduling.size_classes import QuantileStateCodec
from libra.workloads.trace import Trajectory, Turn


def _codec() -> QuantileStateCodec:
    # medians (two classes) over at most 30 returns per tool; a tool's own edges from 10 returns on
    # (every tool keyed by its name, a closed set: rare tools' grouping is test_rare_tools.py's)
    return QuantileStateCodec(classes=2, sample=30, min_samples=10, method="quantile", tools=("search", "fetch"))


def _returns(tool: str, sizes: list[int]) -> list[Trajectory]:
    turns = tuple(Turn(gen_tokens=5, tool=tool, tool_status="ok", tool_tokens=n) for n in sizes)
    return [Trajectory(prompt_id="p", prompt_tokens=10, turns=(*turns, Turn(gen_tokens=5)))]


def _observed(*batches: list[Trajectory]) -> QuantileStateCodec:
    codec = _codec()
    for batch in batches:
        codec.observe(batch)
    return codec


def test_a_tool_only_the_other_codec_saw_is_taken_in_with_its_edges() -> None:
    ours, theirs = _returns("search", [10 * (i + 1) for i in range(12)]), _returns("fetch", [7 * i for i in range(12)])
    a, b = _observed(ours), _observed(theirs)
    a.absorb(b)
    both = _observed(ours, theirs)
    assert a.state() == both.state()
    assert a.edges_for("fetch") == both.edges_for("fetch") != a.edges_for("search")


def test_the_samples_of_a_tool_new_to_us_keep_the_sample_limit() -> None:
    """Absorbed, a tool's 30 returns fill its sample; 10 more observed then push out its 10 oldest (the large ones),
    as in one codec that observed them in that order."""
    ours = _returns("search", [100] * 12)
    theirs = _returns("fetch", [5000 + i for i in range(10)] + [100 + i for i in range(20)])
    later = _returns("fetch", [1 + i for i in range(10)])
    a, b = _observed(ours), _observed(theirs)
    a.absorb(b)
    a.observe(later)
    both = _observed(ours, theirs, later)
    assert a.state() == both.state()
    assert a.edges_for("fetch")[0] < 200  # the median of the last 30 (none of the large ones)


def test_samples_that_reach_the_minimum_only_together_give_the_tool_its_edges() -> None:
    """5 returns here and 5 there make the 10 a tool needs for edges of its own; 4 and 5 do not."""
    for n_ours, has_edges in ((5, True), (4, False)):
        ours = _returns("fetch", [10 * (i + 1) for i in range(n_ours)])
        theirs = _returns("fetch", [1000 * (i + 1) for i in range(5)])
        a, b = _observed(ours), _observed(theirs)
        a.absorb(b)
        both = _observed(ours, theirs)
        assert a.state() == both.state()
        assert ("fetch" in a.state()["edges"]) is has_edges


def test_loaded_edges_of_a_tool_give_way_to_too_few_samples_as_observing_them_would() -> None:
    """A loaded codec has edges but no samples: 3 returns of the tool absorbed leave it below the minimum, so its
    edges are dropped (the pooled ones classify it), exactly as observing those 3 returns drops them."""
    loaded = {"edges": {"fetch": [50.0]}, "pooled": [20.0]}
    few = _returns("fetch", [300, 400, 500])
    a, b, observer = _codec(), _observed(few), _codec()
    a.load_state(loaded)
    observer.load_state(loaded)
    a.absorb(b)
    observer.observe(few)
    assert a.state() == observer.state()
    assert "fetch" not in a.state()["edges"]
    assert a.edges_for("fetch") == a.edges_for("other") == (400.0,)


def test_our_loaded_edges_stay_where_the_other_codec_has_loaded_edges_too() -> None:
    """Neither has samples of the tool: ours are kept; theirs are taken only for a tool we have no edges of."""
    a, b = _codec(), _codec()
    a.load_state({"edges": {"fetch": [50.0]}, "pooled": []})
    b.load_state({"edges": {"fetch": [900.0], "search": [70.0]}, "pooled": [30.0]})
    a.absorb(b)
    assert a.edges_for("fetch") == (50.0,)
    assert a.edges_for("search") == (70.0,)
    assert a.edges_for("other") == (30.0,)
