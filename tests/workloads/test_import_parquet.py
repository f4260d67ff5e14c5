"""`libra trace import` on Parquet files (how datasets of agent trajectories are published): a file is Parquet by
its magic bytes, each row is a record as its JSON Lines export would hold it, so the two import alike; a damaged or
empty file, or a missing pyarrow, is a one-line error naming the file."""

from __future__ import annotations

import datetime as dt
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import expand_paths, import_files

B4 = "bytes4"


def _row(task: str, run: int, turns: int, *, failed: bool = False) -> dict:
    messages = [
        {"role": "system", "content": "You are an agent with tools.", "tool_calls": None, "tool_call_id": None},
        {"role": "user", "content": f"Task {task}: fix it.", "tool_calls": None, "tool_call_id": None},
    ]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"i": i})}}
        messages.append({"role": "assistant", "content": f"step {i}", "tool_calls": [call], "tool_call_id": None})
        out = "Traceback (most recent call last):\nValueError" if failed and i == 0 else f"output {i} " * (i + 1)
        messages.append({"role": "tool", "content": out, "tool_calls": None, "tool_call_id": f"c{i}"})
    messages.append({"role": "assistant", "content": "done", "tool_calls": None, "tool_call_id": None})
    return {
        "instance_id": task,
        "run": run,
        "resolved": not failed,
        "created": dt.datetime(2026, 1, 2, 3, 4, 5),
        "messages": messages,
    }


ROWS = [_row("a__a-1", 0, 2), _row("a__a-1", 1, 3, failed=True), _row("b__b-7", 0, 1)]


def _write_parquet(path, rows, *, row_group_size: int = 2) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r, default=lambda v: v.isoformat()) + "\n" for r in rows))


def _shape(trajectories) -> list:
    return [
        (t.prompt_id, t.prompt_tokens, [(x.gen_tokens, x.tool, x.tool_tokens, x.tool_status) for x in t.turns])
        for t in trajectories
    ]


def test_parquet_rows_import_as_their_json_lines_export_does(tmp_path) -> None:
    table = tmp_path / "train-00000-of-00001.parquet"
    _write_parquet(table, ROWS)  # two row groups: rows are read across batches in order
    lines = tmp_path / "train.jsonl"
    _jsonl(lines, ROWS)
    from_parquet = import_files("openai", [table], tokenizer=B4)
    assert _shape(from_parquet) == _shape(import_files("openai", [lines], tokenizer=B4))
    assert [t.prompt_id for t in from_parquet] == ["a__a-1", "a__a-1", "b__b-7"]
    assert [x.tool_status for x in from_parquet[1].turns][:1] == ["error"]  # the tool's traceback
    assert from_parquet[0].extra["meta"]["created"] == "2026-01-02T03:04:05"  # a timestamp as ISO text


def test_a_parquet_file_is_told_by_its_bytes_and_found_in_a_directory(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _write_parquet(data / "train-00000.parquet", ROWS[:2])
    _write_parquet(data / "train-00001.parquet", ROWS[2:])
    (data / "README.md").write_text("a dataset card")
    assert [p.name for p in expand_paths("openai", [data])] == ["train-00000.parquet", "train-00001.parquet"]
    renamed = tmp_path / "rows.bin"
    renamed.write_bytes((data / "train-00000.parquet").read_bytes())
    assert len(import_files("openai", [renamed], tokenizer=B4)) == 2  # by its magic bytes, not its name
    assert len(import_files("openai", [data], tokenizer=B4)) == 3


def test_a_bad_row_is_named_by_its_number(tmp_path) -> None:
    table = tmp_path / "t.parquet"
    bad = {**ROWS[0], "messages": [{"role": "assistant", "content": "x", "tool_calls": None, "tool_call_id": None}]}
    _write_parquet(table, [ROWS[0], ROWS[1], {**bad, "messages": []}])
    with pytest.raises(TraceError, match=r"t\.parquet:3: .*messages.* is empty"):
        import_files("openai", [table], tokenizer=B4)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "not a whole Parquet file"),  # truncated: its footer is gone
        (lambda b: b[:4] + bytes(len(b) - 4), "not a whole Parquet file"),  # the magic, then zeros
    ],
)
def test_a_damaged_parquet_file_is_one_line_and_leaves_no_output(tmp_path, capsys, damage, message) -> None:
    good = tmp_path / "good.parquet"
    _write_parquet(good, ROWS)
    src = tmp_path / "in.parquet"
    src.write_bytes(damage(good.read_bytes()))
    out = tmp_path / "out.jsonl"
    rc = main(["trace", "import", "--tokenizer", B4, str(src), "--out", str(out)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("libra:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0] and str(src) in errors[0]
    assert not out.exists()


def test_an_empty_parquet_file_is_an_error(tmp_path) -> None:
    table = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS).slice(0, 0), table)
    with pytest.raises(TraceError, match=r"empty\.parquet: file is empty \(a Parquet file with no rows\)"):
        import_files("openai", [table], tokenizer=B4)


def test_without_pyarrow_a_parquet_file_says_what_to_install(tmp_path, monkeypatch) -> None:
    table = tmp_path / "t.parquet"
    _write_parquet(table, ROWS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TraceError, match=r"t\.parquet: a Parquet file: reading it needs pyarrow"):
        import_files("openai", [table], tokenizer=B4)


def test_cli_imports_a_parquet_dataset_and_the_trace_loads(tmp_path, capsys) -> None:
    table = tmp_path / "train.parquet"
    _write_parquet(table, ROWS)
    out = tmp_path / "t.jsonl"
    assert main(["trace", "import", "--tokenizer", B4, str(table), "--out", str(out)]) == 0
    assert [len(t.turns) for t in load_trace(out)] == [3, 4, 2]
