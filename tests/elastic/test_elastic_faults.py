"""Fault injection (>= 100 seeded runs) and 1,000 join/leave cycles over the TCP side channel."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

import elastic_faults as F  # noqa: E402
import elastic_harness as H  # noqa: E402

from libra.elastic.wire import free_port  # noqa: E402
from tests.limits import scaled  # noqa: E402

NUM_RUNS = 120
SEED = 2026
TIMEOUT_S = scaled(0.5)  # side-channel receive timeout of the core in these runs


def _report(name: str, data: dict) -> None:
    """Write a JSON summary where ``LIBRA_ELASTIC_REPORT`` points (used to fill docs/elastic.md)."""
    target = os.environ.get("LIBRA_ELASTIC_REPORT")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / f"{name}.json").write_text(json.dumps(data, indent=1))


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(scaled(400))
def test_killing_the_hybrid_never_stops_or_corrupts_the_core(tmp_path):
    ctx = mp.get_context("spawn")
    requests, replies = ctx.Queue(), ctx.Queue()
    world_port = free_port()
    core0, core1, zygote = H.run_processes(
        [
            (F.fault_core, (0, world_port, requests, replies, NUM_RUNS, SEED, TIMEOUT_S)),
            (F.fault_core, (1, world_port, None, None, NUM_RUNS, SEED, TIMEOUT_S)),
            (F.zygote, (requests, replies, TIMEOUT_S)),
        ],
        tmp=tmp_path,
        timeout_s=scaled(360),
    )
    runs = core0["runs"]
    assert len(runs) == NUM_RUNS == len(core1["runs"])  # the core finished every step of every run
    assert core0["corrupted"] == 0 and core1["corrupted"] == 0, [r for r in runs if r["bad_steps"]]
    assert core0["new_group_calls"] == core1["new_group_calls"] == 1
    phases = {r["phase"] for r in runs}
    assert phases == set(F.PHASES)
    # The faults really happened: most hybrids were killed or frozen, and some did contribute before dying.
    died = [r for r in runs if r["outcome"].startswith("killed (") or r["outcome"] == "frozen"]
    assert len(died) >= NUM_RUNS // 2, [r["outcome"] for r in runs]
    assert any(r["hybrid_steps"] > 0 for r in died)
    warm, end = core0["probes"]["warm"], core0["probes"]["end"]
    # (rank 0 has one extra Python thread of its own from the start: the multiprocessing queue feeder)
    assert end["py_threads"] <= warm["py_threads"] and end["fds"] <= warm["fds"], (warm, end)
    waits = core0["waits"]
    by_phase = {}
    for p in F.PHASES:
        rows = [r for r in runs if r["phase"] == p]
        by_phase[p] = {
            "runs": len(rows),
            "hybrid_died": sum(1 for r in rows if r["outcome"].startswith("killed (") or r["outcome"] == "frozen"),
            "frozen": sum(1 for r in rows if r["outcome"] == "frozen"),
            "detached_by_core": sum(1 for r in rows if "failed" in r["states"]),
            "hybrid_contributed_steps": sum(r["hybrid_steps"] for r in rows),
            "corrupted_steps": sum(len(r["bad_steps"]) for r in rows),
        }
    outcomes = {}
    for r in runs:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    _report(
        "faults",
        {
            "runs": len(runs),
            "corrupted_steps": core0["corrupted"] + core1["corrupted"],
            "core_steps": 2 * len(runs) * F.STEPS,
            "runs_by_phase": by_phase,
            "outcomes": outcomes,
            "hybrid_contributing_steps": sum(r["hybrid_steps"] for r in runs),
            "core_wait_s": {
                "n": len(waits),
                "p50": H.percentile(waits, 50),
                "p99": H.percentile(waits, 99),
                "max": max(waits, default=0.0),
            },
            "timeout_s": TIMEOUT_S,
        },
    )


NUM_CYCLES = 1000


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(scaled(400))
def test_thousand_tcp_join_leave_cycles_create_no_groups_and_leak_nothing(tmp_path):
    world_port, port_queue = free_port(), mp.get_context("spawn").Queue()
    core0, core1, hybrid = H.run_processes(
        [
            (F.tcp_cycles_core, (0, world_port, port_queue, NUM_CYCLES)),
            (F.tcp_cycles_core, (1, world_port, port_queue, NUM_CYCLES)),
            (F.tcp_cycles_hybrid, (port_queue, NUM_CYCLES)),
        ],
        tmp=tmp_path,
        timeout_s=scaled(360),
    )
    assert core0["new_group_calls"] == core1["new_group_calls"] == 1
    assert core0["cycles"] == hybrid["cycles"] == NUM_CYCLES
    assert not core0["stalled"] and core0["failures"] == 0 and core0["final_state"] == "rollout"
    for name, out in (("core0", core0), ("hybrid", hybrid)):
        warm, end = out["probes"]["warm"], out["probes"]["end"]
        # (core rank 0 keeps one Python thread of its own: the feeder of the queue that published its port)
        assert end["py_threads"] <= warm["py_threads"] <= 2 and end["threads"] <= warm["threads"], (name, warm, end)
        assert end["fds"] <= warm["fds"], (name, warm, end)
        assert end["rss_bytes"] - warm["rss_bytes"] < 32 << 20, (name, warm, end)
    _report(
        "cycles",
        {"cycles": NUM_CYCLES, "core_steps": core0["steps"], "core0": core0["probes"], "hybrid": hybrid["probes"]},
    )
