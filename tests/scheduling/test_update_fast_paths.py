"""The step-end update's fast paths (issue 16 row 5b) against the plain forms they replace: a node built by `leaf`
against `Node(first, step)`, and a batch's tool returns classified by one `encode_trajectories` call against each
return classified by `encode`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from sched_strategies import trajectories

from libra.scheduling.node import Node, leaf
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.states import StateCodec, trajectory_returns

_SLOTS = Node.__slots__


@given(first=st.integers(0, 60_000), step=st.integers(-1, 50))
def test_leaf_is_a_node_built_with_its_first_observation(first, step) -> None:
    made, plain = leaf(first, step), Node(first, step)
    assert type(made) is Node
    assert [getattr(made, name) for name in _SLOTS] == [getattr(plain, name) for name in _SLOTS]
    assert made.ordered is made.window  # (one list, as `Node(first, step)` makes it: `refresh_all` relies on it)
    assert made.children is not plain.children


@given(batch=st.lists(trajectories(), max_size=8), limit=st.integers(1, 6), quantile=st.booleans())
def test_encode_trajectories_classifies_each_return_as_encode_does(batch, limit, quantile) -> None:
    fast = QuantileStateCodec() if quantile else StateCodec()
    plain = QuantileStateCodec() if quantile else StateCodec()
    if quantile:  # (edges learnt from the batch, so that size classes differ)
        fast.observe(batch)
        plain.observe(batch)
    paths = fast.encode_trajectories(batch, limit)
    assert paths == [[plain.encode(*r) for r in trajectory_returns(t.turns[:limit])] for t in batch]
    assert [fast.encode_turns(t.turns, limit) for t in batch] == paths
    assert [fast.decode(c) for c in range(len(fast._states))] == [plain.decode(c) for c in range(len(plain._states))]
