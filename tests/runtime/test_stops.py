"""How a run stops and resumes, without engines: SIGTERM and Ctrl-C (also while closing), the only engine dying
mid-rollout, and the one-line refusals of a resume that cannot go on (nothing overwritten, no engine started)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from libra.adapters.errors import EngineDiedError
from libra.adapters.types import EventKind, InstanceSpec, Sampling, StreamEvent
from libra.cli import main
from libra.runtime import Orchestrator, RunConfig
from libra.runtime.clock import Clock
from libra.runtime.rollout import LiveRoutedRollout, run_rollout
from tests.limits import scaled
from tests.runtime.test_rollout_contracts import RequestBook

ROOT = Path(__file__).resolve().parents[2]


# -- SIGTERM and Ctrl-C ----------------------------------------------------------------------------------------------

# `libra run` with an orchestrator that, once "running", sends a signal to its own process: it must stop as for
# Ctrl-C (the engines stopped by close(), one line, an exit code of 128 + the signal), not die on the spot
_SIGNALLED_RUN = """
import os, signal, sys
import libra.runtime

class Orchestrator:
    def __init__(self, config, out, **kwargs):
        self.step = 0
    def run(self):
        os.kill(os.getpid(), signal.{sig})
        signal.pause()  # the signal's handler raises; without one nothing would end the wait
    def close(self):
        print("engines stopped", file=sys.stderr)

libra.runtime.Orchestrator = Orchestrator
from libra.cli import main
sys.exit(main(["run", "--out", sys.argv[1], "--steps", "2", "--quiet"]))
"""


@pytest.mark.parametrize(
    ("sig", "code", "what"), [("SIGTERM", 143, "terminated (SIGTERM)"), ("SIGINT", 130, "interrupted")]
)
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path, sig, code, what) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_RUN.replace("{sig}", sig), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    # before: SIGTERM ended the process at once (-15), its engine processes left running with no parent
    assert proc.returncode == code, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "engines stopped"
    assert lines[1:] == [
        f"libra: {what}; 0 step(s) completed and recorded in {tmp_path / 'run' / 'run.jsonl'}; "
        f"continue with: libra run --resume {tmp_path / 'run'}"
    ]


class _Engines:
    def __init__(self) -> None:
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True


def test_a_ctrl_c_while_closing_is_held_until_the_engines_are_stopped(tmp_path, monkeypatch) -> None:
    import libra.runtime.timeline

    orch = Orchestrator(RunConfig(), tmp_path)
    orch.backend, orch._owns_backend = _Engines(), True
    engines = orch.backend
    orch.clock.mark("rollout-tp1-0", "rollout", 0.0, 1.0, 0)  # a timeline to draw

    def draw(*args, **kwargs) -> None:  # Ctrl-C while the timeline is drawn, before the engines are stopped
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(libra.runtime.timeline, "draw_timeline", draw)
    with pytest.raises(KeyboardInterrupt):
        orch.close()
    assert engines.stopped and orch.backend is None  # before: the interrupt left close() with the engines running


def test_sigterm_with_a_python_handler_is_held_with_the_record_and_its_checkpoint() -> None:
    from libra.runtime.signals import Terminated, deferred_sigint, stop_on_sigterm

    previous = stop_on_sigterm()
    done = []
    try:
        with pytest.raises(Terminated), deferred_sigint():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("record")  # the block runs to its end first
            done.append("checkpoint")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert done == ["record", "checkpoint"]


# -- the only engine dies mid-rollout --------------------------------------------------------------------------------


class _OneEngine(RequestBook):
    """A rollout backend of one instance whose engine dies at the first poll: every request fails (no live instance
    can take it), as `VLLMRolloutBackend` reports it. Restarted, it finishes each request with one token."""

    def __init__(self) -> None:
        self.live = {"i0"}
        self.deaths: list[EngineDiedError] = []
        self.requests: dict[str, dict] = {}
        self.started: list[str] = []
        self.polls = 0

    def instances(self) -> tuple[str, ...]:
        return tuple(sorted(self.live))

    def start_instance(self, spec: InstanceSpec) -> None:
        self.live.add(spec.name)
        self.started.append(spec.name)

    def submit(self, rid: str, instance: str, ids, sampling: Sampling) -> None:
        assert instance in self.live
        self.requests[rid] = {"context": list(ids), "state": "running"}

    def poll(self) -> list[StreamEvent]:
        self.polls += 1
        running = [rid for rid, r in self.requests.items() if r["state"] == "running"]
        if self.polls == 1:
            self.live.clear()
            for rid in running:
                self.requests[rid]["state"] = "failed"
            self.deaths.append(EngineDiedError("i0", "killed", requeued={}, failed=tuple(running)))
            return [
                StreamEvent(request_id=rid, instance="i0", kind=EventKind.FAILED, error="its engine died")
                for rid in running
            ]
        for rid in running:
            self.requests[rid]["context"].append(7)
            self.requests[rid]["state"] = "done"
        return [
            StreamEvent(request_id=rid, instance="i0", kind=EventKind.FINISHED, new_token_ids=(7,), weight_version=0)
            for rid in running
        ]


class _Router:
    buckets = (None,)

    def admit(self, request_id, **kwargs):
        return SimpleNamespace(bucket=0, migrate=False)

    def finish(self, request_id, trajectory) -> None:
        pass

    def abort(self, request_id) -> None:  # a failed attempt (its retry finishes)
        pass


class _Agent:
    def tool(self, request_id, turn_token_ids, turn_index):
        return None

    def reward(self, request_id) -> float:
        return 1.0


def test_the_only_engine_dying_mid_rollout_is_restarted_and_no_trajectory_is_lost(tmp_path, monkeypatch) -> None:
    from libra.runtime import virtual

    spec = InstanceSpec(name="i0", tp=2, max_num_seqs=8, max_model_len=64)
    monkeypatch.setattr(virtual, "instance_specs", lambda placement, config: {"i0": spec})
    orch = Orchestrator(RunConfig(), tmp_path)
    backend = _OneEngine()
    orch.backend, orch.placement, orch.pending, orch._deaths_seen, orch.rolling_step = backend, None, [], 0, 3
    routed = LiveRoutedRollout(backend=backend, router=_Router(), bucket_instances={0: ("i0",)}, revive=orch._revive)
    prompts = {f"s3-p0-{j}": ("p0", j, (1, 2, 3)) for j in range(4)}
    records = run_rollout(
        routed,
        prompts,
        agent=_Agent(),
        sampling=lambda rid, turn: Sampling(max_tokens=1),
        max_turns=1,
        step=3,
        clock=Clock(),
    )
    # before: "no live rollout instance" raised out of the run (libra: internal error), the run lost
    assert sorted(records) == sorted(prompts) and all(r.context == (1, 2, 3, 7) for r in records.values())
    assert all(r.attempts == 2 for r in records.values())  # each retried once, on the restarted engine
    assert backend.started == ["i0"]
    died, started = orch.pending
    assert died["kind"] == "EngineDied" and died["failed"] == 4 and died["step"] == 3
    assert started["kind"] == "StartInstance" and started["source"] == "elastic" and started["worker"] == "i0"
    assert "died mid-rollout" in started["why"] and started["step"] == 3


# -- a resume that cannot go on: one line, nothing written, no engine started -----------------------------------------


def _finished_run(out: Path, steps: int = 2) -> None:
    """The files of a run whose checkpoint is after step `steps - 1` (a stand-in state: nothing may read its
    trainer before the resume is refused)."""
    import torch

    from libra.runtime import checkpoint

    out.mkdir()
    (out / "config.json").write_text(json.dumps(RunConfig(steps=steps).to_dict()))
    (out / "run.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in range(steps)))
    (out / "trace.jsonl").write_text("".join(json.dumps({"step": s, "turns": []}) + "\n" for s in range(steps)))
    (out / checkpoint.DIR).mkdir()
    keys = ("trainer", "router", "plan", "placement", "history", "trained", "losses")
    state = {key: None for key in keys} | {"next_step": steps}
    torch.save(state, out / checkpoint.DIR / checkpoint.FILE)


def _digest(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}


def _refused(args: list[str], out: Path, capsys) -> str:
    before = _digest(out)
    assert main(["run", *args]) == 2
    # the progress bar (cleared when it closes, on a terminal) aside, one line
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "step/s" not in x]
    assert len(err) == 1 and err[0].startswith("libra: error:"), err
    assert _digest(out) == before and not (out / "model").exists()  # nothing written, no model built
    return err[0]


def test_a_resume_that_cannot_go_on_is_one_line_and_changes_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    _finished_run(out)
    # before: the engines started, nothing ran and an empty table was printed
    assert "already completed 2 step(s) and 2 were asked: nothing to do" in _refused(
        ["--resume", str(out)], out, capsys
    )
    assert "and 1 were asked" in _refused(["--resume", str(out), "--steps", "1", "--quiet"], out, capsys)
    # before: --config and --seed were ignored without a word
    for extra in (["--config", str(ROOT / "examples" / "run_config.yaml")], ["--seed", "3"]):
        assert "would be ignored" in _refused(["--resume", str(out), "--steps", "4", *extra], out, capsys)
    # before: a JSONDecodeError as an internal error
    lines = (out / "run.jsonl").read_text().splitlines()
    (out / "run.jsonl").write_text(lines[0] + "\n" + lines[1][:9] + "\n")
    assert "run.jsonl line 2 is not JSON" in _refused(["--resume", str(out), "--steps", "4"], out, capsys)
    (out / "run.jsonl").write_text(lines[0] + "\n")  # a record missing: the resumed records would skip step 1
    assert "holds steps [0]" in _refused(["--resume", str(out), "--steps", "4"], out, capsys)
    # before: torch's "PytorchStreamReader failed reading zip archive" as an internal error
    state = out / "checkpoint" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    assert "the checkpoint is unreadable" in _refused(["--resume", str(out), "--steps", "4"], out, capsys)
