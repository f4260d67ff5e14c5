"""`libra plan`: defaults, JSON keys of the CLI contract, traces, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from libra.cli import main
from tests.limits import scaled


def test_plan_defaults_print_a_table(capsys) -> None:
    assert main(["plan"]) == 0
    captured = capsys.readouterr()
    for word in ("Training", "Rollout", "makespan", "lower bound", "fluid", "longest chain", "single-TP", "solve time"):
        assert word in captured.out
    # what the makespan leaves out that `libra simulate` charges (docs/sim.md, "`libra plan` against ...")
    assert "13.5 s for the weight broadcast before its rollout" in captured.err


def test_plan_json_has_the_documented_keys(capsys) -> None:
    assert main(["plan", "--json", "--gpus", "16"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"makespan_s", "solve_time_s", "train", "rollout"} <= set(data)
    assert {"gpus", "tp", "pp", "dp", "ep", "micro_batch", "time_s"} <= set(data["train"])
    assert {"gpus", "time_s", "instances"} <= set(data["rollout"])
    assert data["train"]["gpus"] + data["rollout"]["gpus"] == 16
    assert all({"tp", "count", "max_tokens"} <= set(i) for i in data["rollout"]["instances"])
    assert data["makespan_s"] >= data["lower_bound_s"] > 0
    assert data["lower_bound_s"] == max(data["fluid_bound_s"], data["chain_bound_s"])


def test_plan_from_a_trace(tmp_path, capsys) -> None:
    from libra.workloads import write_trace
    from libra.workloads.generators import WorkloadGenerator

    path = tmp_path / "t.jsonl"
    write_trace(path, WorkloadGenerator("search-r1", seed=1, num_prompts=16).step(0))
    assert main(["plan", "--trace", str(path), "--json", "--prompts", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan_s"] > 0


def test_plan_and_simulate_price_an_untimed_trace_alike(tmp_path, capsys) -> None:
    """A trace whose calls record no `tool_latency_s` (every corpus source): `plan` draws them as `simulate` does
    (--tool-latency, --seed), so the planner's profile is the one the simulator's policies plan on."""
    import attrs

    from libra.sim.engine import profile_of
    from libra.sim.workload import ToolLatency, step_work
    from libra.workloads import generate, write_trace

    steps = generate("search-r1", num_steps=1, seed=1, num_prompts=16, samples_per_prompt=4)
    untimed = [attrs.evolve(t, turns=tuple(attrs.evolve(u, extra={}) for u in t.turns)) for t in steps]
    path = tmp_path / "t.jsonl"
    write_trace(path, untimed)

    def rollout_s(*more: str) -> float:
        assert main(["plan", "--trace", str(path), "--gpus", "16", "--json", *more]) == 0
        return json.loads(capsys.readouterr().out)["rollout"]["time_s"]

    default, slow = rollout_s(), rollout_s("--tool-latency", "search=120")
    assert default < slow
    assert rollout_s("--tool-latency", "2") == default and rollout_s("--tool-latency", "python=120") == default
    assert rollout_s("--seed", "3") != default  # other draws
    assert main(["plan", "--trace", str(path), "--gpus", "16", "--json"]) == 0
    workload = json.loads(capsys.readouterr().out)["workload"]
    drawn = profile_of([step_work(0, untimed, latency=ToolLatency(), seed=0)], "t", len(untimed))
    assert workload["max_tool_s"] == max(drawn.tool_s) and workload["mean_tool_call_s"] == drawn.mean_tool_time_s
    assert main(["plan", "--tool-latency", "3"]) == 2
    assert "the synthetic workloads time every call" in capsys.readouterr().err
    assert main(["plan", "--trace", str(path), "--tool-latency-sigma", "-1"]) == 2
    assert "--tool-latency-sigma must be in [0, 3]" in capsys.readouterr().err


def test_plan_with_placement(capsys) -> None:
    assert main(["plan", "--gpus", "16", "--place", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    gpus = [g for w in data["placement"] for g in w["gpus"]]
    assert len(gpus) == len(set(gpus)) and max(gpus) < 16


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "GPT-9"], "unknown model"),
        (["--gpus", "0"], "at least 2"),
        (["--gpus", "12"], "must divide"),
        (["--gpu", "TPU"], "unknown GPU"),
        (["--workload", "chess"], "unknown workload"),
        (["--tp-degrees", "1,x"], "comma-separated"),
        (["--gpus", "16", "--gpus-per-node", "4", "--tp-degrees", "4,8"], "fit in one node"),
        (["--model", "Llama-3-70B", "--gpus", "8", "--gpu", "A100-80GB"], "cannot be trained"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, message, capsys) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_malformed_trace_names_the_line(tmp_path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_id": "a", "prompt_tokens": 5, "turns": [{"gen_tokens": 3}]}\n{"prompt_id": 1\n')
    assert main(["plan", "--trace", str(path)]) == 2
    assert f"{path}:2" in capsys.readouterr().err


def test_the_installed_command_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "libra", "plan", "--gpus", "16", "--json"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rollout"]["gpus"] > 0


def test_coefficients_file_changes_the_prediction(tmp_path, capsys) -> None:
    assert main(["plan", "--gpus", "16", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    slow = tmp_path / "slow.yaml"
    slow.write_text("hbm_efficiency: 0.4\ntrain_mfu: 0.25\n")  # half the bandwidth and half the FLOP/s
    assert main(["plan", "--gpus", "16", "--json", "--coeffs", str(slow)]) == 0
    assert json.loads(capsys.readouterr().out)["makespan_s"] > 1.5 * default["makespan_s"]
    slow.write_text("train_mfu: 2\n")
    assert main(["plan", "--coeffs", str(slow)]) == 2
    assert capsys.readouterr().err.strip().endswith("train_mfu must be a number in (0, 1], got 2")


def test_a_missing_optional_engine_is_one_line_naming_the_extra(monkeypatch, capsys) -> None:
    import libra.cli.estimate as estimate

    def needs_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(estimate, "run", needs_torch)
    assert main(["estimate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'torch'" in err and ".[torch]" in err


def test_a_closed_pipe_is_not_an_internal_error() -> None:
    """`libra estimate --json | head -c 10`: the reader is gone before libra writes; that is no internal error."""
    child = subprocess.Popen(
        [sys.executable, "-m", "libra", "estimate", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.stdout.close()  # the reader goes away before the child has started
    err = child.stderr.read()
    child.wait(timeout=scaled(120))
    assert "internal error" not in err and "Traceback" not in err, err


def test_emit_verl_onto_a_file_is_one_line_before_planning(tmp_path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    for out, message in ((taken, "exists and is not a folder"), (taken / "sub", f"{taken} is not a folder")):
        assert main(["plan", "--gpus", "16", "--emit", "verl", "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and len(captured.err.strip().splitlines()) == 1
        assert "planned in" not in captured.err and "internal error" not in captured.err
    assert taken.read_text() == "x"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--out", "somewhere"], "--out goes with --emit verl"),
        (["--model-path", "Qwen/Qwen3-14B"], "--model-path goes with --emit verl"),
        (["--window-steps", "2"], "--window-steps profiles the last steps of a trace"),
    ],
)
def test_an_option_that_needs_another_is_refused_not_ignored(args, message, tmp_path, capsys) -> None:
    assert main(["plan", "--gpus", "16", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "somewhere").exists()


def test_a_message_holding_a_newline_is_printed_on_one_line(tmp_path, capsys) -> None:
    """A file name with a newline in it (or a library's message over several lines) still makes one error line."""
    assert main(["plan", "--trace", str(tmp_path / "no\nsuch.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("libra: error: ") and "cannot open trace" in err
