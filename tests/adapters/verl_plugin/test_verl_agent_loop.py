"""Libra inside verl 0.9.1's rollout, on CPU: verl's real `AgentLoopWorker`, `LLMServerClient`, `LLMServerManager`,
router loader (`get_router_handle` from the emitted YAML) and Ray; fake token servers (`verl_fake_server.py`) stand
in for vLLM, which verl can only start on a GPU build.

A mixed-TP plan (2 x TP-1 up to 250 tokens, 1 x TP-2 up to 600, 1 x TP-4 above) is emitted with
`emit_verl_config`, composed by verl's Hydra config, and its servers are started by `build_bucket_managers` (the
`libra_separate_async` trainer's code) through a fake `RolloutReplica`. `LibraToolAgentLoop` runs scripted
trajectories (search / a failing calculator / a tool that times out) and reports every tool return to
`LibraLoadBalancer`, whose C-MLFQ router moves a trajectory's next turn when its context outgrows its bucket.

One pytest process imports verl (the Ray actors here do not: each verl import costs 10-25 s on this machine).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import ray
import verl
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from limits import scaled  # tests/limits.py (verl and TransferQueue install a top-level `tests` that shadows ours)
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutReplica
from verl_fake_server import FakeTokenServer

from libra.adapters.tiny_model import build_tiny_model
from libra.adapters.verl import emit_verl_config, export_batch, write_trace
from libra.adapters.verl.trainer import build_bucket_managers
from libra.spec import ClusterSpec, InstanceGroup, Plan, RLSettings, RolloutConfig, TrainConfig, get_gpu

HERE = Path(__file__).parent
ROOT = HERE.parent.parent.parent
BUCKETS = "1:250,2:600,4:inf"
TOOL_TIMEOUT_S = 1.0


def published_options() -> dict:
    """C-MLFQ's published rule whichever preset is the project's default (`preset` exists once presets do)."""
    from libra.scheduling import cmlfq

    return {"preset": "published"} if hasattr(cmlfq.CMLFQRouter, "create") else {}


class FakeReplica(RolloutReplica):
    """verl's replica life cycle with a fake token server in place of a GPU vLLM server."""

    tokenizer_dir: str = ""
    delay_s: float = 0.02

    async def launch_servers(self) -> None:  # pragma: no cover - init_standalone does it
        raise NotImplementedError

    async def init_standalone(self) -> None:
        rollout_config = {
            "tensor_model_parallel_size": self.config.tensor_model_parallel_size,
            "custom": self.config.custom,
        }
        name = f"fake-r{self.replica_rank}-tp{self.config.tensor_model_parallel_size}"
        self._server_handle = (
            ray.remote(FakeTokenServer)
            .options(num_cpus=0, max_concurrency=64)
            .remote(name, rollout_config, self.tokenizer_dir, self.delay_s)
        )
        self._server_address = name


class FakeManager(LLMServerManager):
    rollout_replica_class = FakeReplica


def _start_ray(attempts: int = 3) -> None:
    """Start local Ray, again if it times out starting: Ray waits a fixed 30 s for its raylet to register, which a
    machine at load average 30 (this one, at times) can miss. Starting the cluster is not what these tests check."""
    for attempt in range(attempts):
        ray_dir = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's socket paths have a length limit
        try:
            ray.init(num_cpus=4, include_dashboard=False, _temp_dir=ray_dir, log_to_driver=False)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise


def _plan() -> tuple[Plan, ClusterSpec, RLSettings]:
    groups = ((1, 2, 250.0), (2, 1, 600.0), (4, 1, math.inf))
    instances = tuple(InstanceGroup(tp=tp, count=c, max_tokens=m) for tp, c, m in groups)
    plan = Plan(
        train=TrainConfig(num_gpus=4, tp=1, pp=1, dp=4, micro_batch=1),
        rollout=RolloutConfig(num_gpus=8, time_s=1.0, instances=instances),
        makespan_s=1.0,
    )
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
    return plan, cluster, RLSettings(num_prompts=4, samples_per_prompt=2, max_model_len=4096)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """Ray, a tiny model's tokenizer, the composed verl config, the bucket managers and an AgentLoopWorker."""
    tmp = tmp_path_factory.mktemp("verl_rig")
    model_dir = build_tiny_model(tmp / "model")
    FakeReplica.tokenizer_dir = str(model_dir)
    plan, cluster, rl = _plan()
    vc = emit_verl_config(
        plan,
        cluster=cluster,
        rl=rl,
        model_path=str(model_dir),
        strategy="fsdp",
        max_prompt_tokens=1024,
        config_dir=tmp / "verl",
        tool_timeout_s=TOOL_TIMEOUT_S,
        router_options=published_options(),  # start small, promote on overflow: the moves asserted below
    )
    vc.write(tmp / "verl")
    overrides = list(vc.overrides) + [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={HERE / 'verl_fake_tools.py'}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=8",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=4096",
    ]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name=vc.config_name, overrides=overrides)
    GlobalHydra.instance().clear()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    _start_ray()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        managers, combined = loop.run_until_complete(build_bucket_managers(cfg, manager_cls=FakeManager))
        client = combined.get_client()
        worker = AgentLoopWorker(config=cfg, llm_client=client)
        yield {
            "cfg": cfg,
            "managers": managers,
            "combined": combined,
            "worker": worker,
            "tmp": tmp,
            "model": model_dir,
            "loop": loop,
        }
    finally:
        ray.shutdown()
        loop.close()


def _batch(scripts: list[str], *, first: int = 0) -> DataProto:
    """One trajectory per script; `uid` groups the samples of a prompt as verl does."""
    prompts = [[{"role": "user", "content": f"[traj {first + i}] calls: {s}"}] for i, s in enumerate(scripts)]
    n = len(scripts)
    raw_prompt = np.empty(n, dtype=object)
    for i, messages in enumerate(prompts):
        raw_prompt[i] = messages
    return DataProto.from_single_dict(
        {
            "raw_prompt": raw_prompt,
            "agent_name": np.array(["libra_tool_agent"] * n, dtype=object),
            "uid": np.array([f"p{(first + i) // 2}" for i in range(n)], dtype=object),
            "index": np.arange(first, first + n),
        }
    )


def _run(rig, batch: DataProto) -> DataProto:
    return rig["loop"].run_until_complete(rig["worker"].generate_sequences(batch))


def _server_calls(rig) -> dict[str, list[dict]]:
    handles = dict(zip(rig["combined"].server_addresses, rig["combined"].server_handles))
    return {sid: ray.get(h.stats.remote()) for sid, h in handles.items()}


SCRIPTS = [
    "search:5",  # short: stays in the TP-1 bucket
    "search:5",
    "search:120 search:2",  # outgrows 250 tokens at its first tool return: TP-2 from turn 1
    "search:120 search:2",
    "calc:1/0",  # the tool raises: status error
    "calc:6/3",
    "slow:30",  # past tool_timeout_s: status timeout
    "search:400 search:2",  # straight to the open-ended TP-4 bucket
]


def test_cmlfq_routes_verl_trajectories_into_buckets_and_moves_them_at_turn_boundaries(rig):
    balancer = rig["combined"].global_load_balancer
    out = _run(rig, _batch(SCRIPTS))
    assert len(out) == len(SCRIPTS)
    status = ray.get(balancer.get_status.remote())
    assert status["total_inflight"] == 0, status  # every acquire was released
    buckets = status["libra"]["server_buckets"]
    assert sorted(buckets.values()) == [0, 0, 1, 2], buckets  # servers mapped from their own rollout config
    counts = status["libra"]["counts"]
    assert counts["admitted"] == len(SCRIPTS) and counts["finished"] == len(SCRIPTS), counts
    assert counts["admitted_bucket_0"] == len(SCRIPTS)  # C-MLFQ admits into the smallest bucket
    assert counts["tool_ok"] == 9 and counts["tool_error"] == 1 and counts["tool_timeout"] == 1, counts
    assert counts["migrations"] == 3, counts

    records = export_batch(out, step=0)
    statuses = [[t["tool_status"] for t in r["turns"] if t["tool"]] for r in records]
    assert statuses == [["ok"], ["ok"], ["ok", "ok"], ["ok", "ok"], ["error"], ["ok"], ["timeout"], ["ok", "ok"]]
    assert [r["prompt_id"] for r in records] == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
    assert all(r["turns"][-1]["tool"] is None for r in records)  # every trajectory finished with an answer

    # which bucket served each turn, from the servers' own logs: it follows the router, and moves only between turns
    served: dict[tuple[int, int], int] = {}
    for sid, calls in _server_calls(rig).items():
        for c in calls:
            assert (c["traj"], c["turn"]) not in served, "a turn was generated twice"
            served[(c["traj"], c["turn"])] = buckets[sid]
    for traj, record in enumerate(records):
        expected = 0
        moves = {d["turn"]: d["bucket"] for d in record["decisions"] if d.get("migrate")}
        for turn in range(len(record["turns"])):
            expected = moves.get(turn, expected)
            assert served[(traj, turn)] == expected, (traj, turn, record["decisions"])
    assert [served[(t, 1)] for t in (2, 3, 7)] == [1, 1, 2]
    assert [served[(t, 0)] for t in range(len(SCRIPTS))] == [0] * len(SCRIPTS)

    # the trainer's step end: the router learns from the finished trajectories
    assert ray.get(balancer.end_step.remote())["steps"] == 1
    rig["step0"] = records


def test_servers_removed_and_added_mid_run_lose_no_request(rig):
    balancer = rig["combined"].global_load_balancer
    before = ray.get(balancer.get_status.remote())["libra"]["server_buckets"]
    tp1 = sorted(s for s, b in before.items() if b == 0)
    tp2 = [s for s, b in before.items() if b == 1]
    for h in rig["combined"].server_handles:
        ray.get(h.stats.remote())
    fresh = (
        ray.remote(FakeTokenServer)
        .options(num_cpus=0, max_concurrency=64)
        .remote(
            "fake-added-tp1",
            {"tensor_model_parallel_size": 1, "custom": {"libra": {"bucket": 0}}},
            str(rig["model"]),
            0.2,
        )
    )
    scripts = ["search:3 search:3 search:120 search:3"] * 4 + ["search:3 search:3 search:3"] * 4
    results = {}

    async def run_and_change():
        task = asyncio.ensure_future(rig["worker"].generate_sequences(_batch(scripts, first=100)))
        await asyncio.sleep(0.3)
        await balancer.remove_servers.remote([tp1[0]] + tp2)
        await balancer.add_servers.remote({"fake-added-tp1": fresh})
        results["cleared"] = await balancer.clear_sticky_cache.remote()
        results["out"] = await asyncio.wait_for(task, timeout=scaled(120))

    for h in rig["combined"].server_handles:
        ray.get(h.__ray_call__.remote(lambda self: setattr(self, "delay_s", 0.2)))
    rig["loop"].run_until_complete(run_and_change())
    out = results["out"]
    assert len(out) == len(scripts)
    records = export_batch(out, step=1)
    assert [sum(1 for t in r["turns"] if t["tool"]) for r in records] == [4] * 4 + [3] * 4  # every turn ran
    status = ray.get(balancer.get_status.remote())
    assert status["total_inflight"] == 0
    assert tp1[0] not in status["servers"] and "fake-added-tp1" in status["servers"]
    assert results["cleared"]["cleared_entries"] >= 1
    assert len(ray.get(fresh.stats.remote())) >= 1  # the added server took turns
    assert status["libra"]["counts"]["bucket_fallbacks"] >= 1  # the TP-2 bucket had no server left: nearest one
    rig["step1"] = records


def test_exported_verl_traces_are_accepted_by_libra_plan_and_route_eval(rig):
    records = rig.get("step0", []) + rig.get("step1", [])
    assert records, "run the routing tests first (same module)"
    path = rig["tmp"] / "verl_trace.jsonl"
    assert write_trace(path, records) == len(records)
    python = os.environ.get("LIBRA_MAIN_PYTHON") or sys.executable  # scripts/test.sh: the main venv's python
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (
        ["route-eval", "--trace", str(path), "--policy", "cmlfq", "--buckets", BUCKETS, "--json"],
        ["plan", "--trace", str(path), "--gpus", "16", "--prompts", "8", "--samples", "2", "--json"],
    ):
        done = subprocess.run(
            [python, "-m", "libra", *args], capture_output=True, text=True, env=env, timeout=scaled(300)
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        if args[0] == "route-eval":
            assert result["trajectories"] == len(records)
        else:
            assert result["train"]["gpus"] + result["rollout"]["gpus"] <= 16


def test_a_trajectory_that_fails_leaves_the_routers_books(rig):
    """verl's v1 trainers log a failed trajectory and go on (`_run_prompt` marks its group a failure); the balancer
    must not keep it in flight for the rest of the run."""
    balancer = rig["combined"].global_load_balancer
    before = ray.get(balancer.get_status.remote())["libra"]
    with pytest.raises(Exception, match="scripted failure"):
        _run(rig, _batch(["search:3 fail:1"], first=200))
    after = ray.get(balancer.get_status.remote())["libra"]
    assert after["requests_in_flight"] == before["requests_in_flight"]
    assert after["counts"]["aborted"] == before["counts"].get("aborted", 0) + 1
    assert after["counts"]["finished"] == before["counts"]["finished"]  # nothing learnt from it


def test_a_hand_written_tool_timeout_is_checked() -> None:
    """`custom.libra.tool_timeout_s` written by hand: null crashed the agent loop, <= 0 timed every call out."""
    from libra.adapters.verl import VerlConfigError
    from libra.adapters.verl.agent_loop import DEFAULT_TOOL_TIMEOUT_S, tool_timeout_of

    assert tool_timeout_of({}) == DEFAULT_TOOL_TIMEOUT_S
    assert tool_timeout_of({"tool_timeout_s": 30}) == 30.0
    for bad in (None, 0, -1.0, float("nan"), "30", True):
        with pytest.raises(VerlConfigError, match="custom.libra.tool_timeout_s must be a finite number"):
            tool_timeout_of({"tool_timeout_s": bad})
