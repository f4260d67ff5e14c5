"""The bad-input cases issue 15 listed, one by one: each is one error line before any work, or a documented result."""

from __future__ import annotations

import json

import pytest

from libra.cli import main


def _error(capsys) -> str:
    """The one error line (progress logs such as 'generating ...' may come first)."""
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("generating ")]
    assert len(err) == 1, err
    return err[0]


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        return int(exc.code)


def test_plan_from_a_trace_plans_its_trajectories_per_step(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"prompt_id": f"p{k}", "step": s, "prompt_tokens": 300, "turns": [{"gen_tokens": 200 + 10 * k}]}
        for s in range(2)
        for k in range(24)
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["plan", "--json", "--gpus", "16", "--trace", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["requests_per_step"] == 24  # not 512 x 16


def test_trace_options_before_the_action_are_kept(tmp_path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["trace", "--workload", "r2e-gym", "--steps", "3", "--prompts", "2", "--samples", "2", "generate"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workload"] == "r2e-gym" and summary["steps"] == 3 and summary["trajectories"] == 12


@pytest.mark.parametrize(
    "argv,message",
    [
        (["plan", "--gpus", "8"], "training alone needs 8 of them"),
        (["plan", "--gpus", "16", "--tp-degrees", "3"], "must divide the 40 attention heads"),
        (["plan", "--gpus", str(2**63)], "--gpus must be between 2 and 65,536"),
        (["plan", "--max-len", "1"], "--max-len 1 is shorter than the workload's prompts"),
        (["trace", "--max-model-len", "100"], "--max-model-len 100 is shorter"),
        (["route-eval", "--chunks", "-5"], "--chunks must be between 1"),
        (["route-eval", "--buckets", "1:0.5,2:inf"], "whole number of tokens"),
        (["simulate", "--slices", "nan"], "invalid int value"),
    ],
)
def test_bad_options_are_one_line(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _run(argv) == 2
    assert message in _error(capsys)


def test_simulate_refuses_an_out_file_before_running(tmp_path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert main(["simulate", "--out", str(taken)]) == 2
    assert "exists and is not a folder" in _error(capsys)


@pytest.mark.parametrize(
    "content,message",
    [
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (
            b"num_layers: true\nhidden_size: 512\nnum_heads: 8\nnum_kv_heads: 2\nhead_dim: 64\n"
            b"ffn_hidden_size: 1024\nvocab_size: 32000\n",
            "num_layers must be an integer",
        ),
    ],
)
def test_bad_model_files_are_one_line(tmp_path, capsys, content, message) -> None:
    path = tmp_path / ("m.json" if content.startswith(b"[") else "m.yaml")
    path.write_bytes(content)
    assert main(["plan", "--model", str(path)]) == 2
    assert message in _error(capsys)


def test_devices_and_proc_files_are_refused(capsys) -> None:
    assert main(["plan", "--coeffs", "/dev/zero"]) == 2
    assert "not a regular file" in _error(capsys)
    assert main(["plan", "--trace", "/proc/self/mem"]) == 2
    assert "cannot read trace" in _error(capsys)


def test_run_out_onto_a_file_is_one_line(tmp_path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    for out, message in ((taken, "exists and is not a folder"), (taken / "run", f"{taken} is not a folder")):
        assert main(["run", "--out", str(out)]) == 2
        assert message in _error(capsys)
    assert taken.read_text() == "x"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["route-eval", "--trace", "{trace}", "--steps", "3"], "--steps shapes the synthetic workload"),
        (["route-eval", "--trace", "{trace}", "--seed", "1"], "--seed shapes the synthetic workload"),
        (["simulate", "--trace", "{trace}", "--prompts", "3"], "--prompts with --trace needs --resample"),
        (["simulate", "--trace", "{trace}", "--drift-steps", "3"], "--drift-steps shapes a synthetic workload's"),
        (["plan", "--verl-strategy", "fsdp"], "--verl-strategy goes with --emit verl"),
    ],
)
def test_an_option_the_run_would_ignore_is_refused(argv, message, capsys, tmp_path) -> None:
    """Options that shape what another source would make (a synthetic workload, an emitted config) are refused
    beside the source they do not apply to, rather than silently ignored."""
    from libra.workloads import generate, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=1, seed=1, num_prompts=4, samples_per_prompt=2))
    assert _run([a.replace("{trace}", str(trace)) for a in argv]) == 2
    assert message in _error(capsys)


@pytest.mark.parametrize("kind", ["checkpoint", "hung"])
def test_a_run_stopped_by_a_failed_checkpoint_or_a_hung_trainer_is_one_line_with_the_way_on(
    kind, tmp_path, capsys, monkeypatch
) -> None:
    """A full disk or a stuck trainer is the run's trouble, not an internal error of libra's (it printed "internal
    error ... please report it")."""
    import libra.runtime
    from libra.runtime.checkpoint import CheckpointError
    from libra.runtime.trainer import TrainerHung

    class _Stopped:
        def __init__(self, *args, **kwargs) -> None:
            self.step = 2

        def run(self):
            if kind == "checkpoint":
                raise CheckpointError("checkpoint write failed: [Errno 28] No space left on device")
            raise TrainerHung("the trainer did not finish step 2 within 600 s")

        def close(self) -> None:
            pass

    monkeypatch.setattr(libra.runtime, "Orchestrator", _Stopped)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--quiet"]) == 2  # (no progress bar: stderr is not a terminal here)
    error = _error(capsys)
    assert "internal error" not in error
    assert ("No space left on device" if kind == "checkpoint" else "did not finish step 2") in error
    assert error.endswith(f"(after 2 completed steps); continue with: libra run --resume {out}")
