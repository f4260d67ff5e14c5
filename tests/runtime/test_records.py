"""Run records without engines: the staleness histogram, atomic rewrites, and what a resume keeps."""

from __future__ import annotations

from libra.runtime.records import RUN_FILE, TRACE_FILE, RunRecords, read_jsonl, staleness_histogram
from libra.workloads import load_trace
from libra.workloads.trace import Trajectory, Turn


def _traj(step: int, versions: list[int], rid: str) -> Trajectory:
    last = len(versions) - 1  # every turn but the last calls a tool (the trace schema)
    turns = tuple(
        Turn(gen_tokens=3, extra={"weight_version": v})
        if i == last
        else Turn(gen_tokens=3, tool="calc", tool_status="ok", tool_tokens=2, extra={"weight_version": v})
        for i, v in enumerate(versions)
    )
    return Trajectory(prompt_id="p0", prompt_tokens=4, turns=turns, step=step, sample=0, extra={"request_id": rid})


def test_staleness_counts_the_oldest_turn() -> None:
    trajs = [_traj(5, [5, 5], "a"), _traj(5, [3, 4], "b"), _traj(5, [4], "c")]
    assert staleness_histogram(5, trajs) == {"0": 1, "1": 1, "2": 1}


def test_records_are_rewritten_whole_and_resume_keeps_completed_steps(tmp_path) -> None:
    rec = RunRecords(tmp_path)
    for step in range(3):
        rec.add_step({"step": step, "loss": 0.1 * step}, [_traj(step, [step], f"s{step}")])
    assert [r["step"] for r in read_jsonl(tmp_path / RUN_FILE)] == [0, 1, 2]
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
    assert [t.step for t in load_trace(tmp_path / TRACE_FILE)] == [0, 1, 2]  # Libra's trace schema
    resumed = RunRecords(tmp_path, resume=True, keep_steps=2)  # the checkpoint is after step 1
    assert [r["step"] for r in resumed.steps] == [0, 1] and [t["step"] for t in resumed.trace] == [0, 1]
    resumed.add_step({"step": 2, "loss": 9.0}, [_traj(2, [2], "s2")])
    assert [r["loss"] for r in read_jsonl(tmp_path / RUN_FILE)] == [0.0, 0.1, 9.0]
