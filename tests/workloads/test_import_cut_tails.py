"""`libra trace import --skip-errors` on a JSON Lines log whose writer stopped mid-line (a run killed, a log still
being written): the lines before it are imported, the cut line is named; without the flag, or where the bad line
is not a cut-off last line, the file is an error (left out whole with the flag) as before."""

from __future__ import annotations

import gzip
import json

import pytest

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import CutTail, import_files

B4 = "bytes4"


def _record(i: int) -> dict:
    return {
        "id": f"task-{i}",
        "messages": [
            {"role": "user", "content": f"question {i} " + "word " * (5 + i)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "function": {"name": "search", "arguments": "q"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "result " * (3 + i)},
            {"role": "assistant", "content": f"answer {i}"},
        ],
    }


def _lines(n: int) -> str:
    return "".join(json.dumps(_record(i)) + "\n" for i in range(n))


def _cut(n: int) -> str:
    """n whole records, then the first 40 characters of one more, no newline after it."""
    return _lines(n) + json.dumps(_record(n))[:40]


def test_a_cut_last_line_is_left_out_and_the_rest_kept(tmp_path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(_cut(3))
    seen: list[TraceError] = []
    runs = import_files("openai", [log], tokenizer=B4, on_error=seen.append)
    (whole := tmp_path / "whole.jsonl").write_text(_lines(3))
    assert runs == import_files("openai", [whole], tokenizer=B4)  # the same trajectories as the whole lines
    assert len(seen) == 1 and isinstance(seen[0], CutTail) and seen[0].line == 4
    with pytest.raises(TraceError, match=r"run\.jsonl:4: not valid JSON"):  # without on_error: the error
        import_files("openai", [log], tokenizer=B4)


@pytest.mark.parametrize(
    "text",
    [
        _lines(2) + '{"id": "x", "messages": [\n',  # a bad last line that a newline ends: written so, not cut
        _lines(1) + '{"id": "x", "mess\n' + _lines(2),  # a bad line in the middle
    ],
    ids=["newline-ended", "middle"],
)
def test_a_bad_line_that_is_not_a_cut_tail_leaves_the_file_out_whole(tmp_path, text) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(text)
    seen: list[TraceError] = []
    with pytest.raises(TraceError, match="every one of the 1 file"):
        import_files("openai", [log], tokenizer=B4, on_error=seen.append)
    assert len(seen) == 1 and not isinstance(seen[0], CutTail) and seen[0].line in (2, 3)


def test_a_gzip_stream_that_ends_early_is_read_up_to_its_last_whole_line(tmp_path) -> None:
    data = gzip.compress(_lines(40).encode())
    log = tmp_path / "run.jsonl.gz"
    log.write_bytes(data[: len(data) * 2 // 3])
    seen: list[TraceError] = []
    runs = import_files("openai", [log], tokenizer=B4, on_error=seen.append)
    whole = tmp_path / "whole.jsonl"
    whole.write_text(_lines(len(runs)))
    assert 0 < len(runs) < 40 and runs == import_files("openai", [whole], tokenizer=B4)
    assert len(seen) == 1 and isinstance(seen[0], CutTail) and "ends early" in seen[0].message
    with pytest.raises(TraceError, match="not a whole gzip file"):
        import_files("openai", [log], tokenizer=B4)
    short = tmp_path / "short.jsonl.gz"
    short.write_bytes(data[:30])  # not one whole line: the file is left out, said so
    seen.clear()
    import_files("openai", [short, whole], tokenizer=B4, on_error=seen.append)
    assert [type(e) for e in seen] == [TraceError] and "before its first whole line" in seen[0].message


def test_the_cli_names_the_cut_line_and_counts_it(tmp_path, capsys) -> None:
    log, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    log.write_text(_cut(3))
    bad.write_text("not json\n")
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--tokenizer", B4, str(log), str(bad), "--out", str(out)]
    assert main(argv) == 2 and not out.exists()
    capsys.readouterr()
    assert main([*argv, "--skip-errors", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["trajectories"], summary["files_left_out"], summary["files_cut_off"]) == (3, 1, 1)
    assert [(x["file"].rsplit("/", 1)[-1], x["line"]) for x in summary["cut_off"]] == [("a.jsonl", 4)]
    assert [x["file"].rsplit("/", 1)[-1] for x in summary["left_out"]] == ["b.jsonl"]
    assert any(
        line.startswith("warning: read up to its last whole line:") and "a.jsonl:4:" in line
        for line in captured.err.splitlines()
    )
    assert [t.prompt_id for t in load_trace(out)] == ["task-0", "task-1", "task-2"]


def test_a_cut_file_left_out_whole_is_named_once(tmp_path) -> None:
    """A gzip stream that ends early but whose whole lines hold a bad record: the file is left out for that record,
    and its cut end is not reported beside it."""
    text = _lines(2) + '{"id": "x", "messages": 7}\n' + _lines(30)
    data = gzip.compress(text.encode())
    log = tmp_path / "run.jsonl.gz"
    log.write_bytes(data[: len(data) * 2 // 3])
    (whole := tmp_path / "whole.jsonl").write_text(_lines(1))
    seen: list[TraceError] = []
    import_files("openai", [log, whole], tokenizer=B4, on_error=seen.append)
    assert [(type(e), e.line) for e in seen] == [(TraceError, 3)]
