"""`libra trace import DIR`: a directory stands for the log files under it (by the format's name patterns or
`--glob`), in a fixed order, hidden entries left out; what is not a log, or a directory with none, is a one-line
error that says where the file came from and leaves no output behind."""

from __future__ import annotations

import json

import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import DEFAULT_GLOBS, expand_paths, import_files

B4 = "bytes4"


def _mini(task: str, turns: int) -> dict:
    messages = [
        {"role": "system", "content": "You can run bash."},
        {"role": "user", "content": f"Solve issue {task}."},
    ]
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"```bash\nls {i}\n```"})
        messages.append({"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"})
    return {"info": {"exit_status": "Submitted"}, "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}


def _run_tree(root, tasks: dict[str, int]):
    """A mini-swe-agent output folder: RUN/ID/ID.traj.json, with a predictions file and a log beside the runs."""
    for task, turns in tasks.items():
        (root / task).mkdir(parents=True)
        (root / task / f"{task}.traj.json").write_text(json.dumps(_mini(task, turns)))
        (root / task / "minisweagent.log").write_text("INFO started\n")
    (root / "preds.json").write_text(json.dumps({t: {"model_patch": "diff"} for t in tasks}))
    return root


def test_a_directory_is_its_runs_in_path_order_at_any_depth(tmp_path) -> None:
    root = _run_tree(tmp_path / "run", {"b__b-2": 3, "a__a-10": 1, "a__a-9": 2})
    (tmp_path / "run" / "deeper" / "c__c-1").mkdir(parents=True)
    (tmp_path / "run" / "deeper" / "c__c-1" / "c__c-1.traj.json").write_text(json.dumps(_mini("c__c-1", 4)))
    hidden = tmp_path / "run" / ".cache"
    hidden.mkdir()
    (hidden / "x__x-1.traj.json").write_text("not a run")  # a hidden folder is never read
    (tmp_path / "run" / ".z.traj.json").write_text("not a run")  # nor a hidden file
    files = expand_paths("mini-swe-agent", [root])
    names = [p.name for p in files]
    assert names == ["a__a-10.traj.json", "a__a-9.traj.json", "b__b-2.traj.json", "c__c-1.traj.json"]
    runs = import_files("mini-swe-agent", [root], tokenizer=B4)
    assert [t.prompt_id for t in runs] == ["a__a-10", "a__a-9", "b__b-2", "c__c-1"]
    assert [len(t.turns) for t in runs] == [1, 2, 3, 4]  # (the last return is the submission's)
    # the same as naming the files: a directory adds no trajectory and drops none
    named = import_files("mini-swe-agent", files, tokenizer=B4)
    assert [t.total_tokens for t in runs] == [t.total_tokens for t in named]


def test_a_file_is_read_whatever_its_name_and_globs_choose_a_directorys_files(tmp_path) -> None:
    root = _run_tree(tmp_path / "run", {"a-1": 1, "a-2": 2})
    odd = tmp_path / "named.log"
    odd.write_text(json.dumps(_mini("x", 5)))  # a file named on the command line is read as the format reads it
    runs = import_files("mini-swe-agent", [odd, root], tokenizer=B4)
    assert [len(t.turns) for t in runs] == [5, 1, 2]
    assert [p.name for p in expand_paths("mini-swe-agent", [root], ["a-2.*"])] == ["a-2.traj.json"]
    with pytest.raises(TraceError, match=r"run: no file under this directory matches \*\.traj$"):
        expand_paths("swe-agent", [root])
    assert set(DEFAULT_GLOBS) == {"openai", "swe-agent", "mini-swe-agent", "verl", "atif"}


def test_cli_imports_a_directory_and_says_how_many_files(tmp_path, capsys) -> None:
    root = _run_tree(tmp_path / "run", {"a-1": 1, "a-2": 2, "a-3": 3})
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--format", "mini-swe-agent", "--tokenizer", B4, str(root), "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "importing 3 file(s) (1 directory listed) as mini-swe-agent" in err
    assert [t.prompt_id for t in load_trace(out)] == ["a-1", "a-2", "a-3"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "preds.json:"),  # the openai defaults take preds.json, which is not a run
        (["--glob", "preds.json"], "preds.json:"),
    ],
)
def test_a_directory_file_that_is_not_a_log_names_where_it_came_from(tmp_path, capsys, extra, message) -> None:
    root = _run_tree(tmp_path / "run", {"a-1": 1})
    out = tmp_path / "t.jsonl"
    rc = main(["trace", "import", "--tokenizer", B4, str(root), "--out", str(out), *extra])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("libra:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0]
    assert f"a file under {root}" in errors[0] and "--glob PATTERN" in errors[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--format", "swe-agent", "{root}"], "no file under this directory matches *.traj"),
        (["--glob", "", "{root}"], "--glob '': a pattern matches a file's name"),
        (["--glob", "a/*.json", "{root}"], "--glob 'a/*.json'"),
    ],
)
def test_bad_directory_arguments_are_one_line_errors(tmp_path, capsys, argv, message) -> None:
    root = _run_tree(tmp_path / "run", {"a-1": 1})
    out = tmp_path / "t.jsonl"
    args = [a.replace("{root}", str(root)) for a in argv]
    rc = main(["trace", "import", "--tokenizer", B4, *args, "--out", str(out)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("libra:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0] and not out.exists()


def _bad_tree(root):
    """Three runs, one of them cut off mid-file, and one JSON Lines file whose second record is broken."""
    root = _run_tree(root, {"a-1": 1, "a-2": 2, "a-3": 3})
    (root / "a-2" / "a-2.traj.json").write_text('{"messages": [{"role": "user"')
    (root / "z-9").mkdir()
    (root / "z-9" / "z-9.traj.json").write_text(json.dumps(_mini("z-9", 1)) + "\n" + '{"messages": 7}\n')
    return root


def test_skip_errors_leaves_out_whole_files_and_says_which(tmp_path, capsys) -> None:
    root = _bad_tree(tmp_path / "run")
    errors: list[TraceError] = []
    runs = import_files("mini-swe-agent", [root], tokenizer=B4, on_error=errors.append)
    assert [t.prompt_id for t in runs] == ["a-1", "a-3"]  # z-9's good first record is left out with its file
    assert [e.path.rsplit("/", 1)[-1] for e in errors] == ["a-2.traj.json", "z-9.traj.json"]
    assert errors[1].line == 2
    with pytest.raises(TraceError, match="a-2.traj.json"):  # without it, the first bad file is the error
        import_files("mini-swe-agent", [root], tokenizer=B4)
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--format", "mini-swe-agent", "--tokenizer", B4, str(root), "--out", str(out)]
    assert main([*argv, "--skip-errors", "--json"]) == 0
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if line.startswith("warning: left out")]
    assert len(warned) == 2 and "a-2.traj.json" in warned[0] and "z-9.traj.json:2:" in warned[1]
    summary = json.loads(captured.out)
    assert (summary["trajectories"], summary["files_read"], summary["files_left_out"]) == (2, 2, 2)
    assert [x["line"] for x in summary["left_out"]] == [1, 2]
    assert [t.prompt_id for t in load_trace(out)] == ["a-1", "a-3"]


def test_skip_errors_with_every_file_bad_is_an_error_and_writes_nothing(tmp_path, capsys) -> None:
    root = tmp_path / "run"
    root.mkdir()
    for name in ("x-1", "x-2"):
        (root / f"{name}.traj.json").write_text("[")
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--format", "mini-swe-agent", str(root), "--out", str(out), "--skip-errors"]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("libra:")]
    assert len(errors) == 1 and "every one of the 2 file(s) was left out" in errors[0] and not out.exists()
