"""`export_batch` on the rows verl 0.9.1's v1 trainers (`separate_async`, `libra_separate_async`: the ones
`libra plan --emit verl` writes) keep in TransferQueue. There a step's batch is a `KVBatchMeta`, not a DataProto:
`AgentLoopWorkerTQ` stores each trajectory as `AgentLoopOutput.as_dict()` plus the sample's kwargs (`uid`,
`session_id`, ...), packed by verl's `list_of_dict_to_tensordict`, so `LibraToolAgentLoop`'s record sits in each
row's `extra_fields` dict and `tq.kv_batch_get` hands back tensordict `NonTensorStack` columns."""

from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from libra.adapters.verl import export_batch, trace_record


def _rows(scores: list[float]):
    """What AgentLoopWorkerTQ._agent_loop_postprocess puts into TransferQueue for 2 prompts x 2 samples."""
    fields = []
    for i, score in enumerate(scores):
        record = trace_record(
            prompt_id=f"index-{i // 2}",
            prompt_tokens=10,
            turns=[
                {"gen_tokens": 4, "tool": "search", "tool_status": "timeout", "tool_tokens": 30},
                {"gen_tokens": 3},
            ],
            extra={"source": "verl"},
        )
        output = AgentLoopOutput(
            prompt_ids=list(range(10)),
            response_ids=list(range(37)),
            response_mask=[1] * 4 + [0] * 30 + [1] * 3,
            num_turns=3,
            metrics=AgentLoopMetrics(),
            extra_fields={"libra_trace": record, "reward_extra_info": {"score": score}},
        )
        row = output.as_dict()
        row.update(uid=f"uid-{i // 2}", session_id=i % 2, global_steps=7, index=i // 2)
        fields.append(row)
    return list_of_dict_to_tensordict(fields)


def test_export_batch_reads_the_v1_trainers_transfer_queue_rows():
    rows = _rows([1.0, 0.0, 0.5, 1.0])
    records = export_batch(rows.select("uid", "session_id", "extra_fields"), step=7)  # what kv_batch_get returns
    assert [(r["prompt_id"], r["sample"], r["step"], r["reward"]) for r in records] == [
        ("uid-0", 0, 7, 1.0),
        ("uid-0", 1, 7, 0.0),
        ("uid-1", 0, 7, 0.5),
        ("uid-1", 1, 7, 1.0),
    ]
    assert all(r["turns"][0]["tool_status"] == "timeout" for r in records)
    # all the row's fields, as `kv_batch_get` without select_fields returns them: the same records, without a step
    assert export_batch(rows) == [{k: v for k, v in r.items() if k != "step"} for r in records]
