"""`CostCoefficients.prefill_weight_share`: a prefill fused into a decode step does not read the weights again.

The default (1) prices every prefill (a prompt, a tool return, a migrated context) as a forward pass of its own;
0 prices it as vLLM's chunked prefill runs it, inside a step of the running batch. The simulator and the planner
read the same `prefill_time`, and the compiled slice kernel takes the share with the other prefill terms.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from libra.planning.cost import CostModel
from libra.planning.cost.coefficients import load_coefficients
from libra.sim import native
from libra.sim.rollout import Instances, RolloutRun
from libra.sim.routing import routes_for
from libra.sim.workload import step_work
from libra.spec import ClusterSpec, SpecError, get_gpu, get_model, parse_buckets
from libra.workloads.trace import Trajectory, Turn

CM = CostModel(ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=8, gpus_per_node=8), get_model("Qwen3-14B"))


def _with_share(share: float) -> CostModel:
    return CostModel(CM.cluster, CM.model, attrs.evolve(CM.coeffs, prefill_weight_share=share))


def test_the_share_scales_the_weight_read_of_a_prefill_and_nothing_else() -> None:
    tokens, context = np.array([1.0, 300.0, 20_000.0]), np.array([0.0, 2_000.0, 30_000.0])
    for tp in (1, 2, 4, 8):
        full, none, part = (_with_share(s).rollout.prefill_time(tp, tokens, context) for s in (1.0, 0.0, 0.25))
        weights = CM.model.weight_bytes / tp / (CM.cluster.gpu.hbm_bytes_per_s * CM.coeffs.hbm_efficiency)
        assert np.allclose(full - none, weights, rtol=1e-9)
        assert np.allclose(part - none, 0.25 * weights, rtol=1e-9)
        # decoding is untouched: its step reads the weights once whatever the share
        assert _with_share(0.0).rollout.decode_step_time(tp, 8.0, 4_000.0) == CM.rollout.decode_step_time(
            tp, 8.0, 4_000.0
        )
    assert np.array_equal(
        CM.rollout.prefill_time(2, tokens, context), _with_share(1.0).rollout.prefill_time(2, tokens, context)
    )


def _many_turns(n: int) -> list[Trajectory]:
    turns = [Turn(gen_tokens=60, tool="bash", tool_status="ok", tool_tokens=200, extra={"tool_latency_s": 0.5})] * 30
    return [
        Trajectory(prompt_id=f"p{i}", prompt_tokens=800, turns=(*turns, Turn(gen_tokens=60)), step=0) for i in range(n)
    ]


def _rollout_s(cm: CostModel) -> float:
    work = step_work(0, _many_turns(64))
    routes = routes_for("single", work, parse_buckets("1:inf"), None)
    run = RolloutRun(cm, work, routes, Instances([1, 1], [0, 0], [0.0, 0.0]), start=0.0, min_slice_s=0.05)
    run.run_to_end()
    return run.end_time


def test_a_many_turn_rollout_is_shorter_when_tool_returns_ride_in_decode_steps() -> None:
    """64 agents of 31 short turns on two TP-1 instances: each of the 1,920 tool returns saved one weight read."""
    fused = _with_share(0.0)
    assert native.degree_table(fused.rollout, (1,)) is not None  # the slice kernel prices it, not only Python
    full_s, fused_s = _rollout_s(CM), _rollout_s(fused)
    weights = CM.rollout.prefill_time(1, 0.0) - fused.rollout.prefill_time(1, 0.0)
    assert fused_s < full_s
    # the 1,920 returns' reads, spread over the two instances, are the bulk of what is saved (a return that no longer
    # stalls its instance also lets the others' turns start sooner, so the saving can pass their sum)
    assert full_s - fused_s >= 0.5 * 64 * 31 * weights / 2


@pytest.mark.parametrize("value", [1.5, -0.1, "half"])
def test_a_coefficients_file_takes_a_share_in_0_1_only(tmp_path, value) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"prefill_weight_share: {value}\n")
    with pytest.raises(SpecError, match=r"prefill_weight_share must be a number in \[0, 1\]"):
        load_coefficients(path)
    path.write_text("prefill_weight_share: 0\n")
    assert load_coefficients(path).prefill_weight_share == 0.0
