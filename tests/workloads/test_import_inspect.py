"""`libra trace import --format openai` on Inspect AI evaluation logs (inspect_logs.py): a sample imports to the same
trajectory as the same conversation in OpenAI form, except the statuses its tool errors set; an `.eval` archive
imports as the JSON log does; samples and epochs get `{task}/{id}` prompt ids and their epoch; bad archives are
one-line errors.

The built fixtures follow inspect_ai's `model/_chat_message.py`, `tool/_tool_call.py`, `_util/content.py` and
`log/_recorders/eval.py` (member names); tests/data/inspect/ holds real logs (its README says where from)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from libra.cli import main
from libra.workloads import TraceError
from libra.workloads.importers import StatusRules
from libra.workloads.importers.openai_chat import import_openai

S, U = "You are a booking agent with tools.", "Find my booking please."
A1, A2, A3 = "Let me look it up.", "That failed, trying another way.", "Your booking is B-9."
THINK = "The second lookup failed, so the answer comes from the first."
TIMEOUT = "the command was stopped before it finished"
LOCKED = "db.txt is locked by another process"
ARGS = ({"cmd": "grep B-9 db.txt"}, {"cmd": "cat db.txt"})
TASK = "booking"
DATA = Path(__file__).parent.parent / "data" / "inspect"


def words(text: str) -> int:
    return len(text.split())


def _read(path: Path, rules: StatusRules | None = None) -> list:
    return list(import_openai(path, count=words, rules=rules or StatusRules()))


def inspect_messages() -> list[dict]:
    """One conversation as inspect_ai writes it: two bash calls, the first stopped by a timeout (its content holds
    partial output the model never sees), the second failing with a permission error, then a final answer with a
    reasoning part."""
    messages: list[dict] = [
        {"id": "m0", "content": S, "role": "system"},
        {"id": "m1", "content": [{"type": "text", "text": U}], "source": "input", "role": "user"},
    ]
    errors = ({"type": "timeout", "message": TIMEOUT}, {"type": "permission", "message": LOCKED})
    for i, (gen, args, error) in enumerate(zip((A1, A2), ARGS, errors, strict=True)):
        call = {"id": f"call_{i}", "function": "bash", "arguments": args, "type": "function"}
        messages.append(
            {"content": gen, "source": "generate", "role": "assistant", "tool_calls": [call], "model": "m-1"}
        )
        messages.append(
            {
                "content": "partial output",
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "function": "bash",
                "error": error,
            }
        )
    final = [{"type": "reasoning", "reasoning": THINK}, {"type": "text", "text": A3}]
    messages.append({"content": final, "source": "generate", "role": "assistant", "model": "m-1"})
    return messages


def openai_twin() -> list[dict]:
    """The same conversation in OpenAI form, each tool message holding what inspect_ai sends the model for an
    errored call (`Error: {message}`)."""
    messages: list[dict] = [{"role": "system", "content": S}, {"role": "user", "content": U}]
    for i, (gen, args, text) in enumerate(zip((A1, A2), ARGS, (TIMEOUT, LOCKED), strict=True)):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps(args)}}
        messages.append({"role": "assistant", "content": gen, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"Error: {text}"})
    messages.append({"role": "assistant", "content": A3, "reasoning": THINK})
    return messages


def sample(sid: int | str = 1, epoch: int = 1, score: object = 1) -> dict:
    return {
        "id": sid,
        "epoch": epoch,
        "input": U,
        "target": "B-9",
        "messages": inspect_messages(),
        "output": {"model": "m-1", "choices": []},
        "scores": {"match": {"value": score, "answer": "B-9"}},
        "metadata": {},
    }


def json_log(samples: list[dict]) -> dict:
    spec = {"task": TASK, "task_id": "t1", "run_id": "r1", "model": "openai/m-1", "dataset": {"name": "d"}}
    return {"version": 2, "status": "success", "eval": spec, "plan": {}, "results": {}, "stats": {}, "samples": samples}


def write_eval(path: Path, samples: list[dict], *, header: bool = True) -> Path:
    """An `.eval` archive in inspect_ai's layout (the members in the order its recorder writes them)."""
    log = json_log(samples)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("_journal/start.json", json.dumps({"version": 2, "eval": log["eval"], "plan": {}}))
        for s in samples:
            z.writestr(f"samples/{s['id']}_epoch_{s['epoch']}.json", json.dumps(s))
        if header:
            z.writestr("header.json", json.dumps({k: v for k, v in log.items() if k != "samples"}))
    return path


def test_a_sample_imports_as_its_openai_twin_except_the_error_statuses(tmp_path) -> None:
    src = tmp_path / "log.json"
    src.write_text(json.dumps(json_log([sample()])))
    blind = StatusRules(error_patterns=(), timeout_patterns=())  # texts decide nothing: the statuses are the log's
    (got,) = _read(src, blind)
    twin = tmp_path / "twin.json"
    twin.write_text(json.dumps({"messages": openai_twin()}))
    (ref,) = _read(twin, blind)
    assert got.prompt_tokens == ref.prompt_tokens == words(S) + words(U)
    assert [(t.gen_tokens, t.tool, t.tool_tokens) for t in got.turns] == [
        (t.gen_tokens, t.tool, t.tool_tokens) for t in ref.turns
    ]
    assert [t.tool for t in got.turns] == ["bash", "bash", None]
    assert got.turns[-1].gen_tokens == words(THINK) + words(A3)
    assert [t.tool_status for t in ref.turns] == ["ok", "ok", None]
    assert [t.tool_status for t in got.turns] == ["timeout", "error", None]
    assert [t.tool_status for t in _read(src)[0].turns] == ["timeout", "error", None]  # with the default rules too
    assert (got.prompt_id, got.sample, got.reward) == (f"{TASK}/1", 1, 1.0)
    assert got.extra["meta"]["model"] == "openai/m-1"


def test_an_eval_archive_imports_as_its_json_log(tmp_path) -> None:
    src = tmp_path / "log.json"
    src.write_text(json.dumps(json_log([sample()])))
    assert _read(write_eval(tmp_path / "run.eval", [sample()])) == _read(src)
    # the signature, not the name, makes an archive
    assert _read(write_eval(tmp_path / "run.zip", [sample()])) == _read(src)


def test_samples_and_epochs(tmp_path) -> None:
    samples = [sample(sid, epoch, score) for epoch in (2, 1) for sid, score in ((10, "C"), ("b", "I"), (2, 0.5))]
    (tmp_path / "log.json").write_text(json.dumps(json_log(samples)))
    from_json = _read(tmp_path / "log.json")
    assert [(t.prompt_id, t.sample) for t in from_json] == [(f"{TASK}/{s['id']}", s["epoch"]) for s in samples]
    assert [t.reward for t in from_json[:3]] == [1.0, 0.0, 0.5]
    # an archive: inspect_ai's reading order (epoch, then id, numeric ids as numbers), whatever the member order
    from_eval = _read(write_eval(tmp_path / "run.eval", samples))
    order = [(f"{TASK}/{sid}", epoch) for epoch in (1, 2) for sid in (2, 10, "b")]
    assert [(t.prompt_id, t.sample) for t in from_eval] == order
    # a run still going has no header.json: its task comes from the journal's start record
    assert [t.prompt_id for t in _read(write_eval(tmp_path / "open.eval", samples, header=False))][0] == f"{TASK}/2"


def test_attachments_are_resolved(tmp_path) -> None:
    s = sample()
    s["messages"][1]["content"] = [{"type": "text", "text": "attachment://abc"}]
    s["attachments"] = {"abc": U}
    (tmp_path / "log.json").write_text(json.dumps(json_log([s])))
    assert _read(tmp_path / "log.json")[0].prompt_tokens == words(S) + words(U)


def _cli_error(tmp_path, src: Path, capsys) -> str:
    out = tmp_path / "out.jsonl"
    assert main(["trace", "import", str(src), "--tokenizer", "bytes4", "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("libra:")]
    assert len(errors) == 1 and "Traceback" not in stderr and not out.exists()
    assert src.name in errors[0]
    return errors[0]


def test_a_truncated_archive_is_a_one_line_error(tmp_path, capsys) -> None:
    whole = write_eval(tmp_path / "whole.eval", [sample(), sample(2)]).read_bytes()
    cut = tmp_path / "cut.eval"
    cut.write_bytes(whole[: len(whole) // 2])
    assert "truncated or corrupt" in _cli_error(tmp_path, cut, capsys)
    # a member whose data is damaged (the archive's directory intact): the error names the member
    bad = bytearray(whole)
    with zipfile.ZipFile(tmp_path / "whole.eval") as z:
        info = z.getinfo("samples/1_epoch_1.json")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    bad[start : start + 40] = bytes(40)
    damaged = tmp_path / "damaged.eval"
    damaged.write_bytes(bytes(bad))
    assert "samples/1_epoch_1.json" in _cli_error(tmp_path, damaged, capsys)


def test_an_archive_without_samples_is_a_one_line_error(tmp_path, capsys) -> None:
    assert "without samples" in _cli_error(tmp_path, write_eval(tmp_path / "empty.eval", []), capsys)


def test_real_logs() -> None:
    """inspect_ai's own test logs: one run in both formats, and a bash agent."""
    from_json, from_eval = _read(DATA / "log_formats.json"), _read(DATA / "log_formats.eval")
    assert from_json == from_eval and [(t.prompt_id, t.sample) for t in from_json] == [("popularity/1", 1)]
    (agent,) = _read(DATA / "guess_number.eval")
    assert agent.prompt_id == "inspect_test_utils/guess_number/0" and agent.sample == 1
    assert [t.tool for t in agent.turns] == ["bash"] * 5 + [None]
    assert all(t.tool_status == "ok" for t in agent.turns[:5])
    # each call counts its name and its arguments as JSON, as in OpenAI form
    text = "Executing bash with args: {'cmd': 'ls'}\nbash\n" + json.dumps({"cmd": "ls"})
    assert agent.turns[0].gen_tokens == words(text)


@pytest.mark.parametrize(
    "item",
    [
        {"type": "mystery", "x": 1},
        {"eval": {"task": TASK}, "samples": "not a list"},
    ],
)
def test_other_items_are_still_errors(tmp_path, item) -> None:
    src = tmp_path / "log.json"
    src.write_text(json.dumps(item))
    with pytest.raises(TraceError, match=r"log\.json"):
        _read(src)


def failed_sample(sid: int, epoch: int = 1) -> dict:
    """A sample inspect_ai recorded as failed before the model generated anything (its sandbox did not start)."""
    return {
        "id": sid,
        "epoch": epoch,
        "input": U,
        "messages": [{"id": "m0", "content": S, "role": "system"}, {"id": "m1", "content": U, "role": "user"}],
        "error": {"message": "RuntimeError: sandbox failed to start\nTraceback ...", "traceback": "..."},
    }


def test_samples_that_failed_before_any_generation_are_skipped_with_one_warning_per_file(tmp_path, caplog) -> None:
    src = tmp_path / "log.json"
    src.write_text(json.dumps(json_log([sample(1), failed_sample(2), sample(3)])))
    archive = write_eval(tmp_path / "log.eval", [sample(1), failed_sample(2), failed_sample(4), sample(3)])
    with caplog.at_level("WARNING", logger="libra.workloads.importers"):
        from_json = _read(src)
        from_eval = _read(archive)
    assert [t.prompt_id for t in from_json] == [f"{TASK}/1", f"{TASK}/3"]
    assert [t.prompt_id for t in from_eval] == [f"{TASK}/1", f"{TASK}/3"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "log.json: skipped 1 Inspect sample(s)" in warnings[0] and "id 2" in warnings[0]
    assert "log.eval: skipped 2 Inspect sample(s)" in warnings[1]
    assert "samples/2_epoch_1.json" in warnings[1] and "samples/4_epoch_1.json" in warnings[1]


def test_a_sample_without_a_generation_or_a_recorded_failure_is_still_an_error(tmp_path) -> None:
    bare = failed_sample(2)
    del bare["error"]
    src = tmp_path / "log.json"
    src.write_text(json.dumps(json_log([sample(1), bare])))
    with pytest.raises(TraceError, match="no model generation"):
        _read(src)


def test_a_log_whose_every_sample_failed_is_a_one_line_error_with_no_output(tmp_path, capsys) -> None:
    archive = write_eval(tmp_path / "log.eval", [failed_sample(1), failed_sample(2)])
    out = tmp_path / "out.jsonl"
    assert (
        main(["trace", "import", "--format", "openai", str(archive), "--out", str(out), "--tokenizer", "bytes4"]) == 2
    )
    err = capsys.readouterr().err
    assert "skipped 2 Inspect sample(s)" in err and "no trajectories found" in err
    assert not out.exists()
