"""The rough edges a new user met in the CLI (an audit of about 100 bad inputs over every subcommand): each answer
is one line that names what is wrong and the way on, found before any work starts."""

from __future__ import annotations

import json
import math

import pytest

from libra.cli import main
from tests.cli.fuzz_cases import MODEL_FIELDS


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        return int(exc.code)


def _error(capsys) -> str:
    """The whole of stderr, which must be one error line: no progress bar before it (its carriage returns put it on
    the same line in a file), no log line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and "\r" not in err, repr(err)
    return err.strip()


def test_simulate_refuses_an_out_folder_it_cannot_create_before_simulating(capsys) -> None:
    """/proc takes no new folder, not even from root (whom permission bits would let write anywhere): before, the
    whole simulation ran and then failed with "cannot write /proc/nope"."""
    assert main(["simulate", "--steps", "1", "--prompts", "2", "--samples", "2", "--out", "/proc/nope"]) == 2
    assert _error(capsys) == "libra: error: --out /proc/nope: cannot create it in /proc (No such file or directory)"


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "generate", "--steps", "1", "--prompts", "2", "--samples", "2", "--out", "/proc/x.jsonl"],
        ["trace", "import", "LOG", "--out", "/proc/x.jsonl"],
    ],
    ids=["generate", "import"],
)
def test_a_trace_file_out_where_nothing_can_be_written_is_refused_before_the_work(argv, tmp_path, capsys) -> None:
    """A trace file is written next to a temporary one in its folder: a folder that takes no file (/proc) is named
    before the trace is generated or the logs are read (before, only the folder's existence was checked, and
    `trace import` checked nothing until its write)."""
    log = tmp_path / "chat.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main([str(log) if a == "LOG" else a for a in argv]) == 2
    assert _error(capsys) == "libra: error: --out /proc/x.jsonl: cannot write in /proc (No such file or directory)"


def test_the_out_probe_leaves_nothing_behind(tmp_path, capsys) -> None:
    """The probe creates the folders and a file, then removes them: a run refused later leaves no empty folder."""
    out = tmp_path / "a" / "b"
    assert main(["simulate", "--out", str(out), "--policy", "nope"]) == 2
    assert "unknown policy nope" in _error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "record",
    [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"conversations": [{"from": "human", "value": "hi"}]},
        {"role": "user", "content": "hi"},
    ],
)
def test_an_agent_log_given_as_a_trace_says_how_to_convert_it(record, tmp_path, capsys) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert main(["route-eval", "--trace", str(path)]) == 2
    assert _error(capsys) == (
        f"libra: error: {path}:1: field 'prompt_tokens': missing; this looks like an agent log, not a Libra trace: "
        "convert it with `libra trace import`"
    )


def test_a_chat_line_that_is_a_bare_list_of_messages_is_pointed_at_trace_import(tmp_path, capsys) -> None:
    """Some chat logs write each conversation as a bare list of messages: not a JSON object, and said so with the
    way on; a list of anything else is only told it must be an object."""
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]) + "\n")
    assert main(["route-eval", "--trace", str(path)]) == 2
    assert _error(capsys) == (
        f"libra: error: {path}:1: each line must be a JSON object; this looks like an agent log, not a Libra trace: "
        "convert it with `libra trace import`"
    )
    path.write_text("[1, 2]\n")
    assert main(["route-eval", "--trace", str(path)]) == 2
    assert _error(capsys) == f"libra: error: {path}:1: each line must be a JSON object"


def test_a_trace_line_without_prompt_tokens_gets_no_agent_log_hint(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"turns": [{"gen_tokens": 3}], "messages": 2}) + "\n")
    assert main(["route-eval", "--trace", str(path)]) == 2
    assert _error(capsys) == f"libra: error: {path}:1: field 'prompt_tokens': missing"


@pytest.mark.parametrize(
    "option,text,message",
    [
        (
            "--model",
            "\n".join(f"{k}: {v}" for k, v in MODEL_FIELDS.items() if k != "num_layers"),
            "ModelSpec field 'num_layers' missing",
        ),
        (
            "--model",
            "\n".join(f"{k}: {v}" for k, v in MODEL_FIELDS.items() if k not in ("head_dim", "vocab_size")),
            "ModelSpec fields 'head_dim', 'vocab_size' missing",
        ),
        ("--cluster", "num_nodes: 2\ngpus_per_node: 8", "ClusterSpec field 'gpu' missing"),
        ("--cluster", "gpu: H100-80GB\nnum_nodes: 2", "ClusterSpec field 'gpus_per_node' missing"),
        ("--cluster", "gpu: {name: X, memory_gb: 80}\nnum_nodes: 2\ngpus_per_node: 8", "GPUSpec fields 'bf16_tflops'"),
    ],
)
def test_a_missing_field_is_named_with_its_file(option, text, message, tmp_path, capsys) -> None:
    """Before: "ModelSpec.__init__() missing 1 required keyword-only argument: 'num_layers'" (no file, a Python
    call's words)."""
    path = tmp_path / "f.yaml"
    path.write_text(text + "\n")
    assert main(["estimate", option, str(path)]) == 2
    error = _error(capsys)
    assert error.startswith(f"libra: error: {path}: {message}") and "__init__" not in error


def test_an_unknown_field_is_named_with_its_file(tmp_path, capsys) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in {**MODEL_FIELDS, "wings": 2}.items()) + "\n")
    assert main(["estimate", "--model", str(path)]) == 2
    assert _error(capsys).startswith(f"libra: error: {path}: unknown field(s) wings for ModelSpec")


@pytest.mark.parametrize(
    "argv,prog",
    [
        (["plan", "--nope"], "libra plan"),
        (["route-eval", "--nope", "x"], "libra route-eval"),
        (["trace", "generate", "--nope"], "libra trace generate"),
        (["--nope"], "libra"),
    ],
)
def test_an_unknown_option_points_at_its_subcommands_help(argv, prog, capsys) -> None:
    assert _run(argv) == 2
    unknown = " ".join(argv[argv.index("--nope") :])
    assert _error(capsys) == f"{prog}: error: unrecognized arguments: {unknown} (see {prog} --help)"


def test_every_subcommand_describes_itself_in_its_help(capsys) -> None:
    """`--help` has a description under the usage for each subcommand (route-eval had none)."""
    from libra.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert "route-eval" in sub.choices
    for name, child in sub.choices.items():
        assert child.description and len(child.description) > 40, name


def test_estimate_prints_kv_tokens_as_whole_numbers(capsys) -> None:
    """Before: "222,560.031" beside "1.43e+06" in one column."""
    argv = ["estimate", "--model", "Qwen3-14B", "--gpu", "H100-80GB", "--tp", "1,2,4,8", "--batch", "1"]
    assert main([*argv, "--context", "8192"]) == 0
    out = capsys.readouterr().out
    section = out.split("Rollout memory\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0].split()[-2:] == ["KV", "tokens"]
    cells = [row.split()[-1] for row in section[2:]]
    assert len(cells) == 4 and all(c.replace(",", "").isdigit() for c in cells), cells
    assert int(cells[-1].replace(",", "")) >= 1_000_000 and "," in cells[-1]  # (was written 3.04e+06)
    assert main([*argv, "--json"]) == 0
    assert all(type(m["kv_capacity_tokens"]) is int for m in json.loads(capsys.readouterr().out)["memory"])


def test_estimate_says_a_folder_is_not_a_model(tmp_path, capsys) -> None:
    assert main(["estimate", "--model", str(tmp_path)]) == 2
    assert _error(capsys).startswith(f"libra: error: {tmp_path}: a folder, not a model file")


def test_a_preset_name_wins_over_a_folder_of_that_name(tmp_path, capsys, monkeypatch) -> None:
    """A Hugging Face download named like a preset lying in the working folder does not hide the preset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen3-4B").mkdir()
    assert main(["estimate", "--model", "Qwen3-4B", "--tp", "1", "--batch", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "Qwen3-4B"


def test_profile_prints_no_nan_for_a_group_without_held_out_points(monkeypatch, capsys) -> None:
    import libra.cli.profile as profile_cli

    groups = [
        {"kind": "decode", "points": 12, "held_out": 4, "mape_fit": 3.2, "mape_held_out": 4.5},
        {"kind": "requests", "points": 2, "held_out": 0, "mape_fit": 1.0, "mape_held_out": math.nan},
    ]
    result = {"source": "s", "model": "m", "gpu": "g", "out": "c.yaml", "coeffs": {"x": 1.0}, "groups": groups}
    monkeypatch.setattr(profile_cli, "profile", lambda args: result)
    assert main(["profile"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    (row,) = [line for line in out.splitlines() if line.startswith("requests")]
    assert row.endswith("n/a (no held-out points)")
    assert profile_cli._held_out(math.nan) == "n/a (no held-out points)" and profile_cli._held_out(4.54) == "4.5 %"


def test_profile_refuses_a_model_dir_before_its_progress_bar(capsys) -> None:
    assert main(["profile", "--model-dir", "/nonexistent/dir"]) == 2
    error = _error(capsys)
    assert error == "libra: error: --model-dir /nonexistent/dir: no config.json (a Hugging Face model directory?)"


def test_run_error_is_not_on_the_line_of_a_progress_bar(tmp_path, capsys, monkeypatch) -> None:
    """`libra run --resume DIR --steps N` with N steps done is refused once the orchestrator reads the checkpoint,
    after the progress bar started: written to a file (stderr is not a terminal here), the bar is not drawn."""
    import libra.runtime
    from libra.runtime.config import RunConfigError

    class _Done:
        step = 3

        def __init__(self, *args, **kwargs) -> None:
            pass

        def run(self):
            raise RunConfigError("the run in 'r' already completed 3 step(s) and 3 were asked: nothing to do")

        def close(self) -> None:
            pass

    monkeypatch.setattr(libra.runtime, "Orchestrator", _Done)
    assert main(["run", "--out", str(tmp_path / "r")]) == 2
    assert _error(capsys).startswith("libra: error: the run in 'r' already completed 3 step(s)")
