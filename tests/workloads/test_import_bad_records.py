"""`libra trace import --skip-bad-records` (`import_files(..., skip_records=True)`): a record that is not a
trajectory of the format (a JSON Lines line that is not JSON, a line or a list item the importer rejects) is left
out alone and named, the file's other records kept, the same trajectories as a file without it; a session log's
lines make one trajectory together, so a bad line there still leaves its file out; a file none of whose records is
one is left out whole; without the flag a bad record leaves its file out (or stops the import) as before."""

from __future__ import annotations

import json

import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import BadRecord, import_files
from tests.workloads.test_import_cut_tails import _record as cut_tails_record

B4 = "bytes4"


def _record(i: int, *, ident: bool = True) -> dict:
    """The cut-tail tests' record i (a search call and an answer), with its `id` or without one."""
    rec = cut_tails_record(i)
    return rec if ident else {k: v for k, v in rec.items() if k != "id"}


BAD_JSON = '{"id": "x", "mess'
NOT_A_RECORD = '{"id": "y", "messages": 7}'
BAD_MESSAGE = json.dumps({"id": "z", "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": 5}]})


def _kept(tmp_path, name: str, text: str) -> tuple[list, list[TraceError]]:
    log = tmp_path / name
    log.write_text(text)
    seen: list[TraceError] = []
    return import_files("openai", [log], tokenizer=B4, on_error=seen.append, skip_records=True), seen


def test_bad_lines_are_left_out_alone_and_the_rest_is_what_a_file_without_them_gives(tmp_path) -> None:
    lines = [json.dumps(_record(i)) for i in range(6)]
    lines[1], lines[3], lines[4] = BAD_JSON, NOT_A_RECORD, BAD_MESSAGE
    runs, seen = _kept(tmp_path, "run.jsonl", "\n".join(lines) + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(_record(i)) + "\n" for i in (0, 2, 5)))
    assert runs == import_files("openai", [good], tokenizer=B4)
    assert [(type(e), e.line) for e in seen] == [(BadRecord, 2), (BadRecord, 4), (BadRecord, 5)]
    assert "not valid JSON" in seen[0].message and "expected a message list" in seen[1].message
    log = tmp_path / "run.jsonl"  # without skip_records: the file is left out whole, or is the error
    left: list[TraceError] = []
    with pytest.raises(TraceError, match="every one of the 1 file"):
        import_files("openai", [log], tokenizer=B4, on_error=left.append)
    assert [(type(e), e.line) for e in left] == [(TraceError, 2)]
    with pytest.raises(TraceError, match=r"run\.jsonl:2: not valid JSON"):
        import_files("openai", [log], tokenizer=B4)


def test_records_without_an_id_keep_the_name_of_their_place_in_the_file(tmp_path) -> None:
    lines = [json.dumps(_record(i, ident=False)) for i in range(4)]
    lines[1] = NOT_A_RECORD
    runs, seen = _kept(tmp_path, "run.jsonl", "\n".join(lines) + "\n")
    assert [t.prompt_id for t in runs] == ["run-0", "run-2", "run-3"] and len(seen) == 1
    lines[1] = BAD_JSON  # a bad line read ahead of the record before it (the reader looks at two lines first)
    runs, seen = _kept(tmp_path, "ahead.jsonl", "\n".join(lines) + "\n")
    assert [t.prompt_id for t in runs] == ["ahead-0", "ahead-2", "ahead-3"] and len(seen) == 1


def test_a_bad_first_line_of_json_lines_is_left_out_alone(tmp_path) -> None:
    text = "{bad\n" + "".join(json.dumps(_record(i)) + "\n" for i in range(3))
    runs, seen = _kept(tmp_path, "run.jsonl", text)
    assert [t.prompt_id for t in runs] == ["task-0", "task-1", "task-2"]
    assert [(type(e), e.line) for e in seen] == [(BadRecord, 1)]


def test_a_json_value_spread_over_lines_with_an_error_in_it_is_one_error_at_its_line(tmp_path) -> None:
    """Pretty-printed JSON is one value: an error in it is not read as many bad JSON Lines records."""
    text = json.dumps([_record(0), _record(1)], indent=2)
    lines = text.splitlines()
    lines[20] = lines[20] + ","  # a stray comma in the middle
    log = tmp_path / "run.json"
    log.write_text("\n".join(lines) + "\n")
    seen: list[TraceError] = []
    with pytest.raises(TraceError, match="every one of the 1 file"):
        import_files("openai", [log], tokenizer=B4, on_error=seen.append, skip_records=True)
    assert len(seen) == 1 and not isinstance(seen[0], BadRecord) and seen[0].line is not None and seen[0].line > 1


def test_bad_items_of_a_list_are_left_out_alone_and_named_by_their_place(tmp_path) -> None:
    value = [_record(0), {"id": "q", "messages": "no"}, 5, _record(1)]
    runs, seen = _kept(tmp_path, "run.json", json.dumps(value))
    assert [t.prompt_id for t in runs] == ["task-0", "task-1"]
    assert [(e.line, e.field) for e in seen] == [(1, "[1]"), (1, "[2]")]
    results = {"results": [_record(2), 7, _record(3)]}  # a harness's results file
    runs, seen = _kept(tmp_path, "results.json", json.dumps(results))
    assert [t.prompt_id for t in runs] == ["task-2", "task-3"] and [e.field for e in seen] == ["results[1]"]


def _event(kind: str, message: dict, sid: str = "s-1") -> str:
    return json.dumps({"type": kind, "sessionId": sid, "uuid": "u", "message": message})


def test_a_bad_line_of_a_session_log_leaves_the_file_out_whole(tmp_path) -> None:
    """A session log's lines are one trajectory: leaving one out would change it, so the file goes."""
    lines = [
        _event("user", {"role": "user", "content": "fix the test"}),
        _event("assistant", {"role": "assistant", "content": [{"type": "text", "text": "looking"}]}),
        BAD_JSON,
        _event("user", {"role": "user", "content": "thanks"}),
        _event("assistant", {"role": "assistant", "content": [{"type": "text", "text": "done"}]}),
    ]
    good = tmp_path / "other.jsonl"
    good.write_text(json.dumps(_record(0)) + "\n")
    for bad_at in (2, 0):  # in the middle, and as the first line (read before the log is known to be one)
        lines_here = [*lines]
        lines_here.insert(bad_at, lines_here.pop(2))
        log = tmp_path / f"session-{bad_at}.jsonl"
        log.write_text("\n".join(lines_here) + "\n")
        seen: list[TraceError] = []
        runs = import_files("openai", [log, good], tokenizer=B4, on_error=seen.append, skip_records=True)
        assert [t.prompt_id for t in runs] == ["task-0"]
        assert [(type(e), e.line) for e in seen] == [(TraceError, bad_at + 1)]
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(x for x in lines if x != BAD_JSON) + "\n")
    assert len(import_files("openai", [whole], tokenizer=B4, on_error=seen.append, skip_records=True)) == 1


def test_a_file_none_of_whose_records_is_one_is_left_out_whole_with_its_first_error(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{NOT_A_RECORD}\n{BAD_JSON}\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_record(0)) + "\n")
    seen: list[TraceError] = []
    runs = import_files("openai", [bad, good], tokenizer=B4, on_error=seen.append, skip_records=True)
    assert len(runs) == 1 and [(type(e), e.line) for e in seen] == [(TraceError, 1)]
    with pytest.raises(TraceError, match=r"left out \(the first: .*bad\.jsonl:1: expected a message list"):
        import_files("openai", [bad], tokenizer=B4, on_error=seen.append, skip_records=True)


def test_skip_records_needs_somewhere_to_tell_what_it_left_out(tmp_path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(_record(0)) + "\n")
    with pytest.raises(ValueError, match="skip_records needs on_error"):
        import_files("openai", [log], tokenizer=B4, skip_records=True)


def test_other_formats_leave_out_a_bad_record_alone(tmp_path) -> None:
    verl = tmp_path / "rollouts.jsonl"
    good = {"uid": "u", "prompt_length": 4, "response_mask": [1, 1, 0, 1]}
    verl.write_text("\n".join(json.dumps(r) for r in (good, {"uid": "v", "prompt_length": 1}, good)) + "\n")
    seen: list[TraceError] = []
    runs = import_files("verl", [verl], on_error=seen.append, skip_records=True)
    assert len(runs) == 2 and [(type(e), e.line, e.field) for e in seen] == [(BadRecord, 2, "response_mask")]
    mini = tmp_path / "runs.traj.json"
    messages = [
        {"role": "system", "content": "you are an agent"},
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": "ls"},
        {"role": "user", "content": "a.py"},
        {"role": "assistant", "content": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
    ]
    rows = [{"instance_id": "m-1", "messages": messages}, {"instance_id": "m-2", "messages": 7}]
    mini.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    seen.clear()
    runs = import_files("mini-swe-agent", [mini], tokenizer=B4, on_error=seen.append, skip_records=True)
    assert [t.prompt_id for t in runs] == ["m-1"] and [(type(e), e.line) for e in seen] == [(BadRecord, 2)]
    # the default format hands a mini-swe-agent file to that reader, which reads it again: each bad line named once
    rows = [{"instance_id": f"m-{i}", "trajectory_format": "mini-swe-agent-1", "messages": messages} for i in range(3)]
    mini.write_text("\n".join([json.dumps(rows[0]), BAD_JSON, json.dumps(rows[2])]) + "\n")
    seen.clear()
    runs = import_files("openai", [mini], tokenizer=B4, on_error=seen.append, skip_records=True)
    assert [t.prompt_id for t in runs] == ["m-0", "m-2"] and [(type(e), e.line) for e in seen] == [(BadRecord, 2)]


def test_the_cli_names_the_records_it_left_out_and_counts_them(tmp_path, capsys) -> None:
    lines = [json.dumps(_record(i)) for i in range(8)]
    for k in range(1, 8):  # seven bad records: five named on stderr, then how many more
        lines[k] = NOT_A_RECORD if k % 2 else BAD_JSON
    lines.append(json.dumps(_record(9)))
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--tokenizer", B4, str(log), "--out", str(out)]
    assert main([*argv, "--skip-errors"]) == 2 and not out.exists()  # a bad record leaves the only file out
    capsys.readouterr()
    assert main([*argv, "--skip-bad-records", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["trajectories"], summary["records_left_out"], summary["files_left_out"]) == (2, 7, 0)
    assert [x["line"] for x in summary["bad_records"]] == [2, 3, 4, 5, 6, 7, 8]
    warned = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert [w.split("run.jsonl:")[1].split(":")[0] for w in warned[:5]] == ["2", "3", "4", "5", "6"]
    assert warned[5] == "warning: 2 more record(s) left out (--json lists them all)"
    assert [t.prompt_id for t in load_trace(out)] == ["task-0", "task-9"]
