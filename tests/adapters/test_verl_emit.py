"""`libra plan --emit verl` and `emit_verl_config` without verl (main environment): the CLI writes the files and
never imports verl; node layouts keep TP groups inside a node; refusals are one line. verl's own acceptance of the
emitted config is checked in the verl environment (tests/adapters/verl_plugin)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from libra.adapters.verl.config import VerlConfigError, emit_verl_config, node_layout
from libra.adapters.verl.traces import export_batch, trace_record, write_trace
from libra.cli import main
from libra.workloads.trace import TraceError


def test_plan_emit_verl_writes_overrides_router_and_agent_loop_yaml(tmp_path, capsys) -> None:
    out = tmp_path / "verl"
    assert main(["plan", "--workload", "search-r1", "--emit", "verl", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {p.rsplit("/", 1)[-1] for p in data["verl"]["files"]}
    assert names == {"overrides.txt", "libra_router.yaml", "libra_agent_loops.yaml", "run_verl.sh", "libra_verl.json"}
    overrides = (out / "overrides.txt").read_text().split()
    assert f"actor_rollout_ref.rollout.router_config_path={out.resolve() / 'libra_router.yaml'}" in overrides
    router = yaml.safe_load((out / "libra_router.yaml").read_text())
    assert router["router_class"] == "libra.adapters.verl.balancer.LibraLoadBalancer"
    # the buckets, in length order, are the plan's instance groups; the GPUs add up to the plan's
    tps = sorted((g["max_tokens"] is None, g["max_tokens"], g["tp"]) for g in data["rollout"]["instances"])
    assert [b["tp"] for b in router["buckets"]] == [tp for _, _, tp in tps]
    layout = data["verl"]["rollout"]
    assert layout["nnodes"] * layout["n_gpus_per_node"] == data["rollout"]["gpus"]
    train = data["verl"]["train"]
    assert train["nnodes"] * train["n_gpus_per_node"] == data["train"]["gpus"]
    assert data["verl"]["trainer_mode"] == ("libra_separate_async" if len(tps) > 1 else "separate_async")


def test_emitted_files_have_a_new_files_permissions_and_the_launch_script_runs(tmp_path, capsys) -> None:
    import os

    out = tmp_path / "verl"
    umask = os.umask(0o022)
    try:
        assert main(["plan", "--workload", "search-r1", "--emit", "verl", "--out", str(out), "--json"]) == 0
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes.pop("run_verl.sh") == 0o755  # ./run_verl.sh, as its first line says
    assert set(modes.values()) == {0o644} and len(modes) == 4  # readable by the job's other users, no temporaries


@pytest.mark.parametrize(
    "args, words",
    [
        (["plan", "--emit", "verl"], "needs --out"),
        (["plan", "--emit", "verl", "--out", "{tmp}", "--verl-strategy", "fsdp"], "data-parallel only"),
    ],
)
def test_emit_errors_are_one_line(tmp_path, args, words) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "libra", *args], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and words in done.stderr, done.stderr


def test_the_cli_never_imports_verl(tmp_path) -> None:
    code = (
        "import sys; from libra.cli import main; "
        f"main(['plan', '--gpus', '16', '--emit', 'verl', '--out', {str(tmp_path)!r}, '--json']); "
        "assert not any(m == 'verl' or m.startswith('verl.') for m in sys.modules), 'verl imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@given(gpus=st.integers(1, 96), per_node=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]))
def test_node_layouts_hold_every_gpu_and_whole_tp_groups(gpus, per_node, tp) -> None:
    try:
        layout = node_layout(gpus, gpus_per_node=per_node, multiple_of=tp, what="x")
    except VerlConfigError as exc:
        assert "\n" not in str(exc)
        # refused only when no layout exists: checked by enumeration
        assert not any(gpus % n == 0 and gpus // n <= per_node and (gpus // n) % tp == 0 for n in range(1, gpus + 1))
        return
    assert layout.num_gpus == gpus and layout.gpus_per_node <= per_node and layout.gpus_per_node % tp == 0
    assert layout.nnodes == min(
        n for n in range(1, gpus + 1) if gpus % n == 0 and gpus // n <= per_node and (gpus // n) % tp == 0
    )


def test_export_batch_reads_the_agent_loop_records_and_validates_them() -> None:
    rec = trace_record(
        prompt_id="x",
        prompt_tokens=12,
        turns=[
            {"gen_tokens": 5, "tool": "search", "tool_status": "timeout", "tool_tokens": 40},
            {"gen_tokens": 3, "tool": None, "tool_status": None, "tool_tokens": 0},
        ],
    )
    batch = {"libra_trace": [rec, rec], "uid": ["p0", "p1"], "score": [1.0, 0.0]}
    out = export_batch(batch, step=3)
    assert [(r["prompt_id"], r["step"], r["reward"]) for r in out] == [("p0", 3, 1.0), ("p1", 3, 0.0)]
    with pytest.raises(TraceError):
        export_batch({"uid": ["p0"]})
    bad = dict(rec, turns=[{"gen_tokens": 1, "tool": "s", "tool_status": "weird", "tool_tokens": 0}])
    with pytest.raises(TraceError):
        export_batch({"libra_trace": [bad]})
    assert math.isfinite(out[0]["reward"])


def _mixed_plan():
    """A data-parallel training layout beside three rollout buckets (2 x TP-1, 1 x TP-2, 1 x TP-4) on 16 GPUs."""
    from libra.spec import ClusterSpec, InstanceGroup, Plan, RLSettings, RolloutConfig, TrainConfig, get_gpu

    groups = ((1, 2, 250.0), (2, 1, 600.0), (4, 1, math.inf))
    plan = Plan(
        train=TrainConfig(num_gpus=4, tp=1, pp=1, dp=4, micro_batch=1),
        rollout=RolloutConfig(
            num_gpus=8, time_s=1.0, instances=tuple(InstanceGroup(tp=t, count=c, max_tokens=m) for t, c, m in groups)
        ),
        makespan_s=1.0,
    )
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
    return plan, cluster, RLSettings(num_prompts=4, samples_per_prompt=2, max_model_len=4096)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"tool_timeout_s": -1}, "tool_timeout_s"),  # every tool call would time out at once
        ({"tool_timeout_s": float("nan")}, "tool_timeout_s"),
        ({"tool_timeout_s": math.inf}, "tool_timeout_s"),
        ({"tool_timeout_s": "600"}, "tool_timeout_s"),  # float("600") in every agent-loop worker, or worse
        ({"parameter_sync_step": "2"}, "parameter_sync_step"),
        ({"parameter_sync_step": 2.0}, "parameter_sync_step"),  # would be written as 2.0 for verl's int field
        ({"max_prompt_tokens": 100.5}, "max_prompt_tokens"),
        ({"max_prompt_tokens": "100"}, "max_prompt_tokens"),
        ({"router_policy": "cmlfqq"}, "unknown routing policy"),  # else the balancer actor fails at rollout
        ({"router_options": {"presett": "published"}}, "unknown option"),
        ({"router_options": {"preset": "nope"}}, "unknown preset"),
        ({"router_options": ["preset"]}, "router_options"),
        ({"rollout_engine": "sglang"}, "get_rollout_config"),  # only verl's vLLM server tells its bucket
        ({"adv_estimator": "gae"}, "critic"),  # a second trained model the plan has no GPUs for
        ({"model_path": ""}, "model_path"),
        ({"model_path": None}, "model_path"),
        ({"model_path": "a\nb"}, "model_path"),  # overrides.txt is one override per line
    ],
)
def test_emit_refuses_bad_arguments_with_one_line_naming_them(tmp_path, kwargs, words) -> None:
    plan, cluster, rl = _mixed_plan()
    args = {"model_path": "m", "config_dir": tmp_path, **kwargs}
    with pytest.raises(VerlConfigError) as err:
        emit_verl_config(plan, cluster=cluster, rl=rl, **args)
    message = str(err.value)
    assert "\n" not in message and words in message, message
    assert not any(tmp_path.iterdir())


def test_the_config_is_written_only_where_its_overrides_point(tmp_path) -> None:
    plan, cluster, rl = _mixed_plan()
    config = emit_verl_config(plan, cluster=cluster, rl=rl, model_path="m", config_dir=tmp_path / "a")
    with pytest.raises(VerlConfigError, match="config_dir"):
        config.write(tmp_path / "b")  # run_verl.sh would name router and agent-loop YAML that are not there
    assert not (tmp_path / "b").exists()
    written = config.write()  # default: the directory the overrides name
    assert {p.parent for p in written} == {(tmp_path / "a").resolve()}
    overrides = (tmp_path / "a" / "overrides.txt").read_text().split()
    assert (
        f"actor_rollout_ref.rollout.router_config_path={(tmp_path / 'a' / 'libra_router.yaml').resolve()}" in overrides
    )


def test_export_batch_refuses_odd_columns_in_one_line_naming_them() -> None:
    rec = trace_record(prompt_id="x", prompt_tokens=12, turns=[{"gen_tokens": 5}])
    for batch, words in [
        ({"libra_trace": [rec, rec], "uid": ["p0"]}, "field 'uid': has 1 rows"),  # a column of another length
        ({"libra_trace": [rec], "score": np.array([np.nan])}, "field 'score': must be a finite number"),
        ({"libra_trace": [rec], "acc": ["n/a"]}, "field 'acc': must be a finite number"),
        ({"libra_trace": [rec], "rollout_n": [0.5]}, "field 'rollout_n': must be an integer"),
        ({"libra_trace": [json.dumps(rec)]}, "field 'libra_trace': must be a trace record"),
        ({"libra_trace": 7}, "field 'libra_trace': must be a column"),
    ]:
        with pytest.raises(TraceError) as err:
            export_batch(batch)
        assert "\n" not in str(err.value) and words in str(err.value), str(err.value)
    with pytest.raises(TraceError, match="field 'step'"):
        export_batch({"libra_trace": [rec]}, step="x")
    # numpy scalars are numbers; a row verl left without a uid keeps the agent loop's prompt id
    out = export_batch({"libra_trace": np.array([rec], dtype=object), "uid": [None], "score": np.array([0.5])})
    assert (out[0]["prompt_id"], out[0]["reward"]) == ("x", 0.5)
    assert export_batch({"libra_trace": np.array([], dtype=object), "uid": np.array([])}) == []


def test_write_trace_refuses_a_record_the_loader_would_refuse_and_leaves_the_file(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    good = trace_record(prompt_id="x", prompt_tokens=12, turns=[{"gen_tokens": 5}])
    assert write_trace(path, [good]) == 1
    for bad in (dict(good, reward=float("nan")), dict(good, turns=[]), {"prompt_id": "y", "extra": object()}):
        with pytest.raises(TraceError) as err:
            write_trace(path, [good, bad])
        assert ":2:" in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert path.read_text() == json.dumps(good) + "\n"  # as it was


def test_a_write_that_fails_leaves_no_file_of_the_new_set(tmp_path) -> None:
    plan, cluster, rl = _mixed_plan()
    (tmp_path / "libra_router.yaml").mkdir()  # the second file cannot be written
    config = emit_verl_config(plan, cluster=cluster, rl=rl, model_path="m", config_dir=tmp_path)
    with pytest.raises(VerlConfigError) as err:
        config.write(tmp_path)
    assert "\n" not in str(err.value) and "libra_router.yaml" in str(err.value)
    assert [p.name for p in tmp_path.iterdir()] == ["libra_router.yaml"]  # no overrides.txt naming a missing router
