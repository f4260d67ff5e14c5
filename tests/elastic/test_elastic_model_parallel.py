"""A core replica with two model-parallel ranks (TP = 2): each rank's CoreExchange pairs with the same coordinate
of a hybrid replica, the ranks of one hybrid replica are promoted at one boundary and detached together, and a
gradient counts only where it arrived valid at every coordinate (`model_parallel_group`). Two spawned processes
over gloo; the hybrid's ranks are threads beside them."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import elastic_harness as H  # noqa: E402
import elastic_scenarios as S  # noqa: E402

from libra.elastic.wire import free_port  # noqa: E402
from tests.limits import scaled  # noqa: E402


def _two_coordinates(scenario, tmp_path) -> list:
    """``scenario(rank, port)`` in two spawned processes (the two coordinates, a gloo world on ``port``)."""
    port = free_port()
    return H.run_processes([(scenario, (r, port)) for r in (0, 1)], tmp=tmp_path, timeout_s=scaled(200))


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_the_ranks_of_a_hybrid_replica_are_promoted_counted_and_detached_together(tmp_path):
    coords = _two_coordinates(S.model_parallel_promotion, tmp_path)
    # coordinate 0's rank attached at step 1 but waits as a placeholder until coordinate 1's attaches (step 3);
    # coordinate 1's rank sent a stale gradient at step 4, so neither coordinate counted the hybrid at step 4;
    # coordinate 0 alone detached it before step 5, and coordinate 1 followed at that boundary
    want = {
        0: [[1, "placeholder"], [2, "placeholder"], [3, "active"], [4, "active"]],
        1: [[3, "active"], [4, "active"]],
    }
    for rank, c in enumerate(coords):
        assert [[s, m] for s, m, _ in c["seen"]] == want[rank], rank
        assert all(d == c["digests"][str(s)] for s, _, d in c["seen"]), rank  # bitwise its coordinate's core
        assert c["counted"] == [[0, 1], [1, 1], [2, 1], [3, 2], [4, 1], [5, 1], [6, 1]], rank
        assert c["skipped"] == 1, rank  # coordinate 1: the stale one; coordinate 0: the valid one left out
        assert c["hybrid_left"], rank
        caught_up = [t for w, e, t in c["transitions"] if e == "caught_up"]
        assert caught_up == [3], rank
    left = [
        (w, e, t, why)
        for (w, e, t), why in zip(coords[1]["transitions"], coords[1]["whys"], strict=True)
        if e in ("leave", "cancel", "fail")
    ]
    assert left == [("h", "leave", 5, "a rank of this hybrid replica is not active at every coordinate")]


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_a_rank_whose_replica_never_joins_at_another_coordinate_is_detached_after_the_catchup_bound(tmp_path):
    coords = _two_coordinates(S.model_parallel_rank_missing, tmp_path)
    first, second = coords
    # restored and attached at boundary 1, a placeholder while coordinate 1 has no rank of it: 1, 2 and 3 within
    # max_catchup_steps=3, detached at the fourth such boundary (step 4)
    assert first["seen"] == [[1, "placeholder"], [2, "placeholder"], [3, "placeholder"]]
    left = [(w, e, t) for w, e, t, _ in first["transitions"] if e in ("leave", "cancel", "fail")]
    assert left == [("h", "cancel", 4)] and first["hybrid_left"]
    assert all(n == 1 for _, n in first["counted"]) and all(n == 1 for _, n in second["counted"])
    assert second["transitions"] == []
