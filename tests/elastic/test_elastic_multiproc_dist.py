"""Multi-process proofs over torch.distributed (gloo, CPU): 2 core replicas + 1 hybrid in a fixed world."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import elastic_harness as H  # noqa: E402
import elastic_scenarios as S  # noqa: E402

from libra.elastic.wire import free_port  # noqa: E402
from tests.limits import scaled  # noqa: E402

NUM_CYCLES = 200  # the 1,000-cycle run is the TCP test (test_elastic_faults.py)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist_world")
    port = free_port()
    return H.run_processes([(S.dist_world, (r, port, NUM_CYCLES)) for r in range(3)], tmp=tmp, timeout_s=scaled(240))


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_placeholder_run_is_bitwise_identical_to_core_alone(world):
    core0, core1, hybrid = (w["placeholder"] for w in world)
    gathered = core0["gathered"]
    ref0, ref1 = gathered[0]["reference"], gathered[1]["reference"]
    run0, run1 = gathered[0]["digests"], gathered[1]["digests"]
    assert ref0 == run0 and ref1 == run1 and run0 == run1
    hyb = gathered[2]["digests"]
    assert len(hyb) >= 3, "the hybrid should have spent several steps in placeholder"
    for step, digest in hyb.items():
        assert digest == run0[step], f"hybrid state differs from the core after step {step}"
    # no step counted the placeholder
    assert all(n == 2 and not contributors for _, n, contributors in core0["records"])
    assert "placeholder" in {s for _, s in hybrid["states"]} and "active" not in {s for _, s in hybrid["states"]}


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_active_hybrid_matches_ddp_and_training_continues_after_leave(world):
    # The assertions (tolerance per step, alignment before contributing) ran inside every process.
    ddp = world[0]["ddp"]
    assert ddp["first_active"] >= 2
    assert world[0]["ddp"]["digest"] == world[1]["ddp"]["digest"]
    assert ddp["worst_abs_diff"]["three_replicas"] < 1e-6


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(300))
def test_dist_join_leave_cycles_create_no_groups_and_leak_nothing(world):
    for rank, w in enumerate(world):
        assert w["new_group_calls"] == 1, f"rank {rank} called new_group {w['new_group_calls']} times"
        c = w["cycles"]
        if rank == 1:  # rank 1 only steps in lockstep; rank 0 counts removals, rank 2 (the hybrid) joins
            continue
        assert c["cycles"] == NUM_CYCLES
        warm, end = c["probes"]["warm"], c["probes"]["end"]
        assert end["py_threads"] == 1 and end["threads"] <= warm["threads"] and end["fds"] <= warm["fds"], (warm, end)
        assert end["rss_bytes"] - warm["rss_bytes"] < 32 << 20, (warm, end)
    assert world[0]["cycles"]["failures"] == 0 and not world[0]["cycles"]["stalled"]
