"""`libra plan --emit verl` and `emit_verl_config` without verl (main environment): the CLI writes the files and
never imports verl; node layouts keep TP groups inside a node; refusals are one line. verl's own acceptance of the
emitted config is checked in the verl environment (tests/adapters/verl_plugin)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from libra.adapters.verl.config import VerlConfigError, node_layout
from libra.adapters.verl.traces import export_batch, trace_record
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
