"""`libra trace import`: formats, token counts, tool statuses, kept fields, one-line errors, atomic output, and
the round trip of an imported trace through plan, route-eval and simulate."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.cli import main
from libra.workloads import TraceError, load_trace
from libra.workloads.importers import StatusRules, get_counter, import_files, write_trace_atomic

B4 = "bytes4"  # deterministic counts: ceil(utf-8 bytes / 4)


def _b4(text: str) -> int:
    return -(-len(text.encode()) // 4)


def _chat(task: str = "t-1", trial: int = 0, *, error_tool: bool = False) -> dict:
    return {
        "task_id": task,
        "trial": trial,
        "reward": 1.0,
        "model": "some-model",
        "messages": [
            {"role": "system", "content": "You are a helpful agent." * 4},
            {"role": "user", "content": "Find my booking."},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "Error: not found" if error_tool else "booking B-9"},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        ],
    }


def _write(tmp_path, name: str, records, *, lines: bool = True) -> str:
    path = tmp_path / name
    if lines:
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    else:
        path.write_text(json.dumps(records))
    return str(path)


def test_openai_messages_become_turns(tmp_path) -> None:
    (t,) = import_files("openai", [_write(tmp_path, "a.jsonl", [_chat()])], tokenizer=B4)
    sys_user = _b4("You are a helpful agent." * 4) + _b4("Find my booking.")
    assert t.prompt_id == "t-1" and t.sample == 0 and t.reward == 1.0 and t.prompt_tokens == sys_user
    first, last = t.turns
    assert first.gen_tokens == _b4("Let me look.\nlookup\n{}") and first.tool == "lookup"
    # the tool result and the user's reply both go back into the context after the first generation
    assert first.tool_tokens == _b4("booking B-9") + _b4("thanks") and first.extra == {"tools": ["lookup", "user"]}
    assert last.tool is None and last.gen_tokens == _b4("Done.")
    assert t.extra == {"meta": {"model": "some-model"}}  # unknown scalar fields are kept


def test_real_tokenizer_counts_offline() -> None:
    count = get_counter("o200k_base")
    assert count("hello world") == 2 and count("") == 0
    assert get_counter("cl100k_base")("hello world") == 2


def test_tokenizer_json_path(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert get_counter(str(path))("hello world again") == 3


@pytest.mark.parametrize(
    ("text", "kw", "status"),
    [
        ("all good", {}, "ok"),
        ("Error: no such reservation", {}, "error"),
        ("Traceback (most recent call last):\n  File x\nValueError: bad", {}, "error"),
        ("line\n" * 50 + "bash: foo: command not found", {}, "error"),
        ("a file that mentions Error: in its middle\n" + "x\n" * 20, {}, "ok"),
        ("fine", {"error": True}, "error"),
        ("Error: but the tool said it is fine", {"error": False}, "ok"),
        ("output", {"exit_code": 2}, "error"),
        ("The command timed out after 60 seconds", {"exit_code": 0}, "timeout"),
        ("doc text " * 100 + "bash: foo: command not found", {}, "error"),  # a long line's end is read
        ("doc text " * 100 + "the query timed out" + " doc text" * 100, {}, "ok"),  # not its middle
        ("x" * 300 + "\nError: no such reservation", {}, "error"),
    ],
)
def test_status_rules(text, kw, status) -> None:
    assert StatusRules().classify(text, **kw) == status


def test_status_patterns_are_configurable(tmp_path) -> None:
    path = _write(tmp_path, "a.jsonl", [_chat()])
    (t,) = import_files("openai", [path], tokenizer=B4, rules=StatusRules(error_patterns=(r"^booking",)))
    assert t.turns[0].tool_status == "error"
    (t,) = import_files("openai", [_write(tmp_path, "b.jsonl", [_chat(error_tool=True)])], tokenizer=B4)
    assert t.turns[0].tool_status == "error"


def test_result_files_with_a_shared_policy(tmp_path) -> None:
    """A tau2-style results file: simulations in a list, the domain policy stated once for all of them."""
    sims = [{**_chat(f"t-{i}"), "id": f"sim-{i}"} for i in range(3)]
    data = {"info": {"environment_info": {"policy": "Policy text. " * 10}}, "simulations": sims}
    got = import_files("openai", [_write(tmp_path, "r.json", data, lines=False)], tokenizer=B4)
    assert [t.prompt_id for t in got] == ["t-0", "t-1", "t-2"]
    alone = import_files("openai", [_write(tmp_path, "s.jsonl", sims[:1])], tokenizer=B4)[0]
    assert got[0].prompt_tokens == alone.prompt_tokens + _b4("Policy text. " * 10)
    assert got[0].extra["meta"]["id"] == "sim-0"


def test_swe_agent_history_and_submit(tmp_path) -> None:
    record = {
        "environment": "swe_main",  # the environment's name, which every task of a run shares
        "history": [
            {"role": "system", "content": "You are an autonomous programmer."},
            {"role": "user", "content": "Fix the issue.", "message_type": "observation"},
            {"role": "assistant", "content": "Open the file.\n```\nopen a.py\n```"},
            {"role": "user", "content": "[File: a.py (10 lines total)]"},
            {"role": "assistant", "content": "Run it.\n```\npython a.py\n```"},
            {"role": "user", "content": "Traceback (most recent call last):\nNameError: x"},
            {"role": "assistant", "content": "Submit.\n```\nsubmit\n```"},
            {"role": "user", "content": "diff --git a/a.py b/a.py"},
        ],
        "trajectory": [
            {"action": "open a.py\n", "observation": "[File: a.py (10 lines total)]", "response": "Open the file."},
            {"action": "python a.py\n", "observation": "Traceback ...", "response": "Run it."},
            {"action": "submit\n", "observation": "diff --git a/a.py b/a.py", "response": "Submit."},
        ],
        "info": {
            "exit_status": "submitted",
            "submission": "diff ...",
            "edited_files30": "[File: a.py]\n 1: x = 1",
            "model_stats": {"api_calls": 3},
        },
    }
    (t,) = import_files("swe-agent", [_write(tmp_path, "repo__issue-1.traj", record, lines=False)], tokenizer=B4)
    assert t.prompt_id == "repo__issue-1"  # the task, from the file's name (not the environment's)
    runs = _write(tmp_path, "runs.jsonl", [record, record], lines=True)  # several runs of a file: one id each
    assert [t.prompt_id for t in import_files("swe-agent", [runs], tokenizer=B4)] == ["runs", "runs-2"]
    assert t.extra["meta"] == {"exit_status": "submitted"}  # counts, not content: no patch, no edited lines
    named = _write(tmp_path, "z.traj", {**record, "instance_id": "repo__issue-9"}, lines=False)
    assert import_files("swe-agent", [named], tokenizer=B4)[0].prompt_id == "repo__issue-9"
    assert [(x.tool, x.tool_status) for x in t.turns] == [("open", "ok"), ("python", "error"), (None, None)]
    assert t.prompt_tokens == _b4("You are an autonomous programmer.") + _b4("Fix the issue.")
    assert t.extra["meta"] == {"exit_status": "submitted"}  # the patch itself is not kept


def test_mini_swe_agent_exit_codes_and_submission(tmp_path) -> None:
    record = {
        "info": {"exit_status": "Submitted", "submission": "diff"},
        "messages": [
            {"role": "system", "content": "You can run bash."},
            {"role": "user", "content": "Please solve this issue."},
            {"role": "assistant", "content": "```bash\nls\n```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"},
            {"role": "assistant", "content": "```bash\ncat b.py\n```"},
            {"role": "user", "content": "<returncode>1</returncode>\n<output>\ncat: b.py: missing\n</output>"},
            {"role": "assistant", "content": "```bash\nsleep 999\n```"},
            {"role": "user", "content": "The last command <command>sleep 999</command> timed out and has been killed."},
            {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
            {"role": "user", "content": "diff --git a/a.py b/a.py"},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
    }
    (t,) = import_files("mini-swe-agent", [_write(tmp_path, "i-1.traj.json", record, lines=False)], tokenizer=B4)
    assert t.prompt_id == "i-1"
    statuses = [(x.tool, x.tool_status) for x in t.turns]
    assert statuses == [("bash", "ok"), ("bash", "error"), ("bash", "timeout"), (None, None)]
    assert t.extra["meta"] == {"exit_status": "Submitted", "trajectory_format": "mini-swe-agent-1.1"}


def test_verl_rollout_export(tmp_path) -> None:
    rec = {
        "uid": "p-3",
        "prompt_ids": [1] * 7,
        "response_mask": [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0],  # trailing zeros: padding
        "response_length": 12,
        "reward_score": 0.5,
        "tool_names": ["search", "python"],
        "tool_statuses": ["ok", "error"],
        "global_steps": 4,
        "agent_name": "tool_agent",
    }
    (t,) = import_files("verl", [_write(tmp_path, "v.jsonl", [rec])])
    assert (t.prompt_id, t.prompt_tokens, t.step, t.reward) == ("p-3", 7, 4, 0.5)
    assert [(x.gen_tokens, x.tool, x.tool_status, x.tool_tokens) for x in t.turns] == [
        (3, "search", "ok", 2),
        (2, "python", "error", 4),
        (1, None, None, 0),
    ]
    assert t.extra == {"meta": {"agent_name": "tool_agent"}}


def test_a_nan_reward_or_field_still_gives_a_trace_that_loads(tmp_path) -> None:
    """Python's json writes a failed reward as NaN; the import wrote it back as NaN, which JSON (and so every
    command that reads the imported trace) refuses. The reward becomes null, what it was is kept as a string."""
    src = tmp_path / "v.jsonl"
    src.write_text('{"prompt_length": 5, "response_mask": [1, 1, 0, 0, 1], "reward_score": NaN, "w": -Infinity}\n')
    out = tmp_path / "out.jsonl"
    assert main(["trace", "import", "--format", "verl", str(src), "--out", str(out)]) == 0
    (t,) = load_trace(out)
    assert t.reward is None
    assert t.extra == {"meta": {"w": "-Infinity"}, "reward_not_finite": "NaN"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=60), st.integers(0, 50))
def test_verl_token_count_is_preserved(mask, prompt) -> None:
    """Every valid token lands in exactly one place: prompt + generations + returns = prompt + response."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.jsonl"
        path.write_text(json.dumps({"prompt_length": prompt, "response_mask": mask}) + "\n")
        if 1 not in mask:
            with pytest.raises(TraceError, match="no model generation"):
                import_files("verl", [path])
            return
        (t,) = import_files("verl", [path])
    assert t.total_tokens == prompt + len(mask)
    assert sum(x.gen_tokens for x in t.turns) == sum(mask)


def _cli(argv, capsys):
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"messages": [{"role": "user", "content": "x"}', "not valid JSON"),  # truncated
        (b'{"messages": [{"role": "assistant", "content": "x"}]}\n{"messages": 7}\n', ":2:"),  # malformed line 2
        (b"\xff\xfe\x00\x01", "not UTF-8"),
        (b"", "empty"),
        (b"  \n\n", "empty"),
        (b'{"messages": [{"role": 3}]}', "role"),
    ],
)
def test_bad_inputs_fail_in_one_line_and_leave_no_file(tmp_path, capsys, content, message) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    out = tmp_path / "out.jsonl"
    rc, stdout, stderr = _cli(["trace", "import", "--format", "openai", str(src), "--out", str(out)], capsys)
    errors = [line for line in stderr.splitlines() if line.startswith("libra:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0] and str(src) in errors[0]
    assert "Traceback" not in stderr and not out.exists() and list(tmp_path.iterdir()) == [src]


def test_no_source_is_one_line_error(capsys) -> None:
    rc, _, stderr = _cli(["trace", "import"], capsys)
    assert rc == 2 and "needs at least one SRC" in stderr


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch) -> None:
    (t,) = import_files("openai", [_write(tmp_path, "a.jsonl", [_chat()])], tokenizer=B4)
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")

    def broken():
        yield t
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_trace_atomic(out, broken())
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "out.jsonl"]


def test_a_gzipped_log_is_imported_and_a_gz_output_is_gzipped_with_a_new_files_permissions(tmp_path) -> None:
    import gzip
    import os

    plain = _write(tmp_path, "a.jsonl", [_chat("t-0", 0), _chat("t-1", 1)])
    packed = tmp_path / "a.jsonl.gz"
    packed.write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    trajs = import_files("openai", [str(packed)], tokenizer=B4)
    assert trajs == import_files("openai", [plain], tokenizer=B4)
    out = tmp_path / "out.jsonl.gz"
    umask = os.umask(0o022)
    try:
        assert write_trace_atomic(out, trajs) == 2
    finally:
        os.umask(umask)
    assert out.read_bytes()[:2] == b"\x1f\x8b" and load_trace(out) == trajs
    assert out.stat().st_mode & 0o777 == 0o644  # not the temporary file's 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.gz", "out.jsonl.gz"]
    packed.write_bytes(packed.read_bytes()[:-9])  # cut inside the trailer
    with pytest.raises(TraceError, match="not a whole gzip file"):
        import_files("openai", [str(packed)], tokenizer=B4)


@pytest.mark.slow
def test_imported_trace_round_trips_through_the_cli(tmp_path, capsys) -> None:
    records = [_chat(f"t-{i % 7}", i // 7, error_tool=i % 3 == 0) for i in range(42)]
    src = _write(tmp_path, "log.jsonl", records)
    out = tmp_path / "trace.jsonl"
    rc, stdout, _ = _cli(["trace", "import", src, "--out", str(out), "--source", "demo", "--json"], capsys)
    summary = json.loads(stdout)
    assert rc == 0 and summary["trajectories"] == 42 and 0 < summary["error_rate"] < 1
    trajs = load_trace(out)
    assert len(trajs) == 42 and trajs[0].extra["source"] == "demo"
    rc, stdout, _ = _cli(["route-eval", "--trace", str(out), "--policy", "all", "--json"], capsys)
    assert rc == 0 and json.loads(stdout)["policies"]["cmlfq"]["trajectories"] == 42
    rc, stdout, _ = _cli(["plan", "--trace", str(out), "--gpus", "16", "--json"], capsys)
    assert rc == 0 and json.loads(stdout)["makespan_s"] > 0
    sim = tmp_path / "sim"
    argv = [
        "simulate",
        "--trace",
        str(out),
        "--steps",
        "1",
        "--gpus",
        "16",
        "--policy",
        "colocated",
        "--no-plots",
        "--json",
    ]
    rc, stdout, _ = _cli([*argv, "--out", str(sim)], capsys)
    assert rc == 0 and json.loads(stdout)["policies"]["colocated"]["throughput_tok_s"] > 0


def test_verl_rows_already_in_trace_form(tmp_path) -> None:
    """What libra.adapters.verl exports (trace records, or batch rows with the record under `libra_trace`)."""
    record = {"prompt_id": "x", "prompt_tokens": 5, "turns": [{"gen_tokens": 3, "tool": None}], "step": 2}
    row = {"uid": "p-9", "sample": 1, "libra_trace": {**record, "step": None}}
    plain, nested = import_files("verl", [_write(tmp_path, "v.jsonl", [record, row])])
    assert (plain.prompt_id, plain.step, plain.total_tokens) == ("x", 2, 8)
    assert (nested.prompt_id, nested.sample, nested.total_tokens) == ("p-9", 1, 8)


def test_a_verl_attention_mask_shorter_than_the_response_is_refused(tmp_path) -> None:
    """It covers prompt + response; a shorter one was ignored and the whole response counted."""
    rec = {"prompt_length": 3, "response_mask": [1, 1, 0, 1, 0, 0], "attention_mask": [1, 1, 1, 1]}
    with pytest.raises(TraceError, match=r"v.jsonl:1: .*attention_mask.*shorter than response_mask \(6\)"):
        import_files("verl", [_write(tmp_path, "v.jsonl", [rec])])


def test_verl_v1_rows_with_the_record_in_their_extra_fields(tmp_path) -> None:
    """verl's v1 trainers keep each row in TransferQueue with the record inside `extra_fields` and the sample
    index as `session_id`: such rows were refused as "not a verl rollout record"."""
    record = {"prompt_id": "x", "prompt_tokens": 5, "turns": [{"gen_tokens": 3, "tool": None}]}
    row = {"uid": "p-4", "session_id": 3, "extra_fields": {"libra_trace": record, "turn_scores": []}}
    (t,) = import_files("verl", [_write(tmp_path, "v.jsonl", [row])])
    assert (t.prompt_id, t.sample, t.total_tokens) == ("p-4", 3, 8)


def test_the_default_format_reads_swe_agent_and_mini_swe_agent_files_as_their_own_formats(tmp_path) -> None:
    swe = {
        "environment": "repo__issue-2",
        "history": [
            {"role": "system", "content": "You are an autonomous programmer."},
            {"role": "user", "content": "Fix the issue."},
            {"role": "assistant", "content": "Run it.\n```\npython a.py\n```"},
            {"role": "user", "content": "Traceback (most recent call last):\nNameError: x"},
            {"role": "assistant", "content": "Submit.\n```\nsubmit\n```"},
            {"role": "user", "content": "diff --git a/a.py b/a.py"},
        ],
        "trajectory": [
            {"action": "python a.py\n", "observation": "Traceback ...", "response": "Run it."},
            {"action": "submit\n", "observation": "diff --git a/a.py b/a.py", "response": "Submit."},
        ],
        "info": {"exit_status": "submitted"},
    }
    mini = {
        "info": {"exit_status": "Submitted"},
        "messages": [
            {"role": "system", "content": "You can run bash."},
            {"role": "user", "content": "Please solve this issue."},
            {"role": "assistant", "content": "```bash\ncat b.py\n```"},
            {"role": "user", "content": "<returncode>1</returncode>\n<output>\ncat: b.py: missing\n</output>"},
            {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
            {"role": "user", "content": "diff --git a/a.py b/a.py"},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
    }
    for fmt, name, record in (("swe-agent", "y.traj", swe), ("mini-swe-agent", "i-2.traj.json", mini)):
        src = _write(tmp_path, name, record, lines=False)
        (own,) = import_files(fmt, [src], tokenizer=B4)
        (default,) = import_files("openai", [src], tokenizer=B4)
        assert default == own
        assert default.turns[0].tool == ("python" if fmt == "swe-agent" else "bash")
        assert default.turns[-1].tool is None  # the submitted patch is no return


def test_a_run_that_failed_before_any_generation_is_skipped_with_one_warning(tmp_path, caplog) -> None:
    """A directory of runs in which one environment never started: that run is skipped and said once, the others
    import; a run with no generation and no failure status is still an error."""
    import logging

    ok = {"info": {"exit_status": "Submitted"}, "messages": [
        {"role": "system", "content": "You can run bash."},
        {"role": "user", "content": "Please solve this issue."},
        {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
    ]}  # fmt: skip
    broken = {"info": {"exit_status": "RuntimeError"}, "messages": [{"role": "system", "content": "You can run bash."}]}
    good, bad = _write(tmp_path, "a.traj.json", ok, lines=False), _write(tmp_path, "b.traj.json", broken, lines=False)
    with caplog.at_level(logging.WARNING, logger="libra.workloads.importers"):
        got = import_files("mini-swe-agent", [good, bad], tokenizer=B4)
    assert [t.prompt_id for t in got] == ["a"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{bad}: skipped 1 run(s) that ended before any model generation: line 1 (RuntimeError)"
    ]
    swe = {"environment": "swe_main", "history": [], "trajectory": [], "info": {"exit_status": "early_exit"}}
    with pytest.raises(TraceError, match="no trajectories found"):  # the only run skipped: nothing to write
        import_files("swe-agent", [_write(tmp_path, "c.traj", swe, lines=False)], tokenizer=B4)
    with pytest.raises(TraceError, match="no model generation"):  # no failure status: an error, as before
        import_files("swe-agent", [_write(tmp_path, "d.traj", {**swe, "info": {}}, lines=False)], tokenizer=B4)
