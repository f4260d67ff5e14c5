"""The runtime as an integrator builds on it in Python, misused: configurations built in code with values of the wrong
type or range, checkpoints that cannot be resumed, an orchestrator reused after `close()`. Each is refused in one
line before anything is built (no model, no engine); a checkpoint write that fails is not lost. No engine starts."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs
import pytest

from libra.runtime import Orchestrator, RunConfig, RunConfigError, checkpoint, config_from_dict
from libra.runtime.config import (
    EngineSettings,
    HybridSettings,
    ReplanSettings,
    VirtualSettings,
)

# -- configurations built in code ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        # before: a string became the tuple of its letters (5 one-letter prompts)
        (lambda: RunConfig(prompts="hello"), "prompts must be a list of non-empty strings, got 'hello'"),
        (lambda: RunConfig(prompts=(1, 2)), "prompts must be a list of non-empty strings, got (1, 2)"),
        (lambda: RunConfig(prompts=("",)), "prompts must be a list of non-empty strings, got ('',)"),
        (lambda: RunConfig(prompts=None), "prompts must be a list of non-empty strings, got None"),
        # before: accepted, and the router was built (or failed) only once the model was built
        (lambda: RunConfig(router_size_edges="8"), "router_size_edges must be a list of increasing whole numbers"),
        (lambda: RunConfig(router_size_edges=(32, 8)), "got (32, 8)"),
        (lambda: RunConfig(router_size_edges=(float("nan"),)), "got (nan,)"),
        # before: accepted; vLLM seeds numpy with it (32 bits) and torch takes 64
        (lambda: RunConfig(seed=2**64), f"seed must be an integer in [0, 4294967295], got {2**64}"),
        # before: a section of the wrong type was accepted and failed where the run first read it
        (lambda: RunConfig(virtual={"gpus": 4}), "virtual must be a VirtualSettings (config_from_dict builds one"),
        (lambda: RunConfig(engine=None), "engine must be an EngineSettings, got None"),
        (lambda: RunConfig(waits=None), "waits must be a WaitSettings, got None"),
        (lambda: RunConfig(ray="local"), "ray must be a RaySettings or None, got 'local'"),
        (lambda: RunConfig(shift="x"), "shift must be a WorkloadShift or None, got 'x'"),
        (lambda: config_from_dict({"hybrid": None}), "hybrid must be a HybridSettings, got None"),
        (lambda: VirtualSettings(tp_degrees="12"), "tp_degrees must be a list of increasing whole numbers >= 1"),
        (lambda: VirtualSettings(tp_degrees=(-1,)), "got (-1,)"),
        (lambda: VirtualSettings(tp_degrees=()), "tp_degrees must hold at least one TP degree"),
        (lambda: VirtualSettings(gpu="nope"), "unknown GPU 'nope'"),
        (lambda: VirtualSettings(model="nope"), "unknown model 'nope'"),
        (lambda: VirtualSettings(gpu=3), "gpu must be a non-empty name, got 3"),
        (lambda: VirtualSettings(gpus=7, gpus_per_node=6), "GPUs per node (6) must divide the number of GPUs (7)"),
        (lambda: EngineSettings(dtype="nonsense"), "dtype must be one of auto, float32"),
        (lambda: EngineSettings(dtype=3), "got 3"),
        # before: "false" was true, NaN and negative gains reached the gate
        (lambda: ReplanSettings(enabled="false"), "enabled must be true or false, got 'false'"),
        (lambda: ReplanSettings(min_relative_gain=float("nan")), "min_relative_gain must be a number >= 0, got nan"),
        (lambda: ReplanSettings(to_rollout_s=-5), "to_rollout_s must be a number >= 0, got -5"),
        (lambda: ReplanSettings(to_rollout_s="5"), "to_rollout_s must be a number >= 0, got '5'"),
        # before: a TypeError from the comparison (and True was a fraction of 1)
        (lambda: HybridSettings(min_idle_fraction="0.5"), "min_idle_fraction must be in [0, 1], got '0.5'"),
        (lambda: HybridSettings(min_idle_fraction=True), "min_idle_fraction must be in [0, 1], got True"),
    ],
)
def test_bad_values_built_in_code_are_refused_in_one_line(build, needle) -> None:
    with pytest.raises(RunConfigError) as err:
        build()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_defaults_and_lists_still_build() -> None:
    c = RunConfig(prompts=["a", "b"], router_size_edges=[4, 16], virtual=VirtualSettings(tp_degrees=[1, 2, 4]))
    assert c.prompts == ("a", "b") and c.router_size_edges == (4, 16) and c.virtual.tp_degrees == (1, 2, 4)
    assert config_from_dict(RunConfig().to_dict() | {"ray": None}) == RunConfig()


def test_an_orchestrator_refuses_what_is_not_a_config(tmp_path) -> None:
    # before: AttributeError: 'dict' object has no attribute 'shift'
    with pytest.raises(RunConfigError, match="config must be a RunConfig"):
        Orchestrator({"steps": 2}, tmp_path)
    # before: accepted; the TypeError came at the first engine poll, or after the first step's record
    for hook in ("on_step", "on_poll", "agent_factory"):
        with pytest.raises(RunConfigError, match=f"{hook} must be a callable or None, got 'print'"):
            Orchestrator(RunConfig(), tmp_path, **{hook: "print"})


# -- nothing may be built after a refusal: the model builder fails the test if the run goes on ------------------------


@pytest.fixture
def no_build(monkeypatch):
    import libra.adapters.tiny_model

    def build(*args, **kwargs):
        raise AssertionError("the run went on to build its model")

    monkeypatch.setattr(libra.adapters.tiny_model, "build_tiny_model", build)


def _digest(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}


def _checkpointed_run(out: Path, config: RunConfig, steps: int = 2) -> None:
    """The records and checkpoint of a run of `config` after step `steps - 1` (a stand-in trainer state: nothing
    may read it before the resume is refused)."""
    import torch

    from libra.runtime.records import write_jsonl

    out.mkdir()
    write_jsonl(out / "run.jsonl", [{"step": s, "loss": 0.1} for s in range(steps)])
    write_jsonl(out / "trace.jsonl", [{"step": s, "turns": []} for s in range(steps)])
    (out / checkpoint.DIR).mkdir()
    state = {key: None for key in checkpoint.KEYS} | {"next_step": steps, "config": config.to_dict()}
    torch.save(state, out / checkpoint.DIR / checkpoint.FILE)


def test_a_resume_with_another_configuration_is_refused(tmp_path, no_build) -> None:
    out = tmp_path / "run"
    _checkpointed_run(out, RunConfig())
    before = _digest(out)
    other = RunConfig(steps=4, samples_per_prompt=2, lr=0.5)
    # before: the run went on with the checkpoint's trainer and another batch, learning rate, ...
    with pytest.raises(RunConfigError) as err:
        Orchestrator(other, out, resume=True).run()
    assert "lr=0.001 -> 0.5, samples_per_prompt=4 -> 2" in str(err.value) and "nothing was changed" in str(err.value)
    assert _digest(out) == before


def test_a_resume_may_change_the_steps_staleness_ray_and_waits(tmp_path, no_build) -> None:
    out = tmp_path / "run"
    _checkpointed_run(out, RunConfig())
    same_job = attrs.evolve(
        RunConfig(), steps=5, max_staleness=0, waits=attrs.evolve(RunConfig().waits, engine_check_s=1)
    )
    with pytest.raises(AssertionError, match="went on to build"):  # past every check
        Orchestrator(same_job, out, resume=True).run()


@pytest.mark.parametrize("step", ["2", 0, -1, True, 2.0])
def test_a_checkpoint_with_a_bad_step_counter_is_refused(tmp_path, step) -> None:
    import torch

    out = tmp_path / "run"
    _checkpointed_run(out, RunConfig())
    path = out / checkpoint.DIR / checkpoint.FILE
    torch.save(torch.load(path, weights_only=False) | {"next_step": step}, path)
    # before: int("2") resumed; 0 and -1 started a run over the records of the completed steps
    with pytest.raises(RunConfigError, match=f"next_step must be a whole number >= 1, got {step!r}"):
        checkpoint.load(out)


def test_a_new_run_into_a_folder_that_holds_a_run_is_refused(tmp_path, no_build) -> None:
    out = tmp_path / "run"
    _checkpointed_run(out, RunConfig())
    before = _digest(out)
    # before: the new run went on and its first record replaced run.jsonl, trace.jsonl and the checkpoint
    with pytest.raises(RunConfigError, match=r"already holds a run \(run.jsonl, checkpoint/state.pt\)"):
        Orchestrator(RunConfig(), out).run()
    assert _digest(out) == before


@pytest.mark.parametrize("steps", [0, -1, "3", 2.5, float("nan")])
def test_run_refuses_a_bad_number_of_steps_before_anything_is_built(tmp_path, no_build, steps) -> None:
    # before: the model was built and the engines started, then the run did nothing (0, nan) or failed ("3")
    with pytest.raises(RunConfigError, match="steps must be a whole number >= 1"):
        Orchestrator(RunConfig(), tmp_path).run(steps)


def test_a_closed_orchestrator_does_not_run_again(tmp_path, monkeypatch) -> None:
    orch = Orchestrator(RunConfig(), tmp_path)
    orch.close()

    def setup(target: int) -> None:
        raise AssertionError("a closed orchestrator set the run up again")

    monkeypatch.setattr(orch, "_setup", setup)
    # before: a second setup, from step 0 (a new trainer) over the files of the run it had closed
    with pytest.raises(RunConfigError, match="is closed: build a new one"):
        orch.run()


# -- a checkpoint write that fails ------------------------------------------------------------------------------------


def test_a_failed_checkpoint_write_is_raised_not_lost(tmp_path) -> None:
    (tmp_path / checkpoint.DIR).write_text("a file where the checkpoint folder goes")
    writer = checkpoint.BackgroundWriter(tmp_path)
    writer.save({"next_step": 3})
    # before: the error ended the writer's thread unseen; the run went on and reported steps no checkpoint held
    with pytest.raises(checkpoint.CheckpointError) as err:
        writer.wait()
    assert "the checkpoint after step 2 was not written" in str(err.value) and "FileExistsError" in str(err.value)
    writer.wait()  # raised once


def test_the_previous_checkpoint_is_kept_when_a_write_fails(tmp_path) -> None:
    writer = checkpoint.BackgroundWriter(tmp_path)
    good = {key: None for key in checkpoint.KEYS} | {"next_step": 1}
    writer.save(good)
    writer.wait()
    writer.save({"next_step": 2, "unpicklable": lambda: None})
    with pytest.raises(checkpoint.CheckpointError, match="after step 1 was not written"):
        writer.save(good | {"next_step": 3})  # the failure is raised before the next write starts
    assert checkpoint.load(tmp_path)["next_step"] == 1
    assert [p.name for p in (tmp_path / checkpoint.DIR).iterdir()] == [checkpoint.FILE]  # no temporary file left


def _trainer_state(model_dir: Path) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    from libra.adapters.tiny_model import build_tiny_model
    from libra.adapters.torch_ddp import TorchDDPTrainer

    build_tiny_model(model_dir, seed=0)
    trainer = TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=1e-3),
    )
    return trainer.snapshot()


def test_a_checkpoint_whose_state_does_not_fit_the_run_is_refused(tmp_path) -> None:
    import torch

    from libra.planning.placement import place
    from libra.runtime import virtual

    out = tmp_path / "run"
    config = RunConfig(steps=4)
    _checkpointed_run(out, config)
    path = out / checkpoint.DIR / checkpoint.FILE
    plan = virtual.virtual_planner(config).plan(virtual.prior_profile(config, [5, 6, 6, 5]))
    good = {
        "trainer": _trainer_state(out / "model"),
        "plan": plan,
        "placement": place(plan, virtual.virtual_cluster(config)),
        "router": b"\x80\x04 not a pickled router",
        "history": {},
        "trained": set(),
        "losses": [0.1, 0.2],
    }
    # before: pickle's UnpicklingError, StateMismatch of a snapshot that is None, an AttributeError of a plan that is
    # not one (or later, once the engines had started): `libra run --resume` printed "internal error"
    for change, needle in [
        ({}, "UnpicklingError"),
        ({"trainer": None}, "StateMismatch: TorchDDPTrainer.restore: a snapshot has the keys"),
        ({"placement": "rollout-tp1-0"}, "plan and placement must be a Plan and a Placement, got Plan, str"),
    ]:
        torch.save(torch.load(path, weights_only=False) | good | change, path)
        before = _digest(out)
        with pytest.raises(RunConfigError) as err:
            Orchestrator(config, out, resume=True).run()
        assert f"cannot resume from {path}: its state does not fit this run" in str(err.value), err.value
        assert needle in str(err.value) and _digest(out) == before


def test_a_resume_of_a_folder_that_does_not_exist_is_refused(tmp_path, no_build) -> None:
    # before: "no checkpoint: the run starts again from step 0", a new run in the mistyped folder
    with pytest.raises(RunConfigError, match="nothing to resume in .*: no such folder"):
        Orchestrator(RunConfig(), tmp_path / "runs" / "typo", resume=True).run()
    assert not (tmp_path / "runs").exists()


def test_a_run_whose_setup_failed_part_way_does_not_go_on(tmp_path, monkeypatch) -> None:
    orch = Orchestrator(RunConfig(), tmp_path)

    def setup(target: int) -> None:  # the engines were being started when one failed
        orch.backend = object()
        raise RuntimeError("engine start failed")

    monkeypatch.setattr(orch, "_setup", setup)
    with pytest.raises(RuntimeError, match="engine start failed"):
        orch.run()
    # before: the loop began on the half-built state (AttributeError: no 'served_version')
    with pytest.raises(RunConfigError, match="failed part way: close\\(\\) it and build a new one"):
        orch.run()
