"""Discrete-event simulator of agentic RL runs: compare resource-management policies on the same workload and
simulated cluster, using the planner's cost model and the real router. Pure Python (numpy), no torch.

    from libra.sim import Scenario, WorkSource, simulate
    source = WorkSource.from_generator("r2e-gym", seed=0, num_prompts=512, samples_per_prompt=16,
                                       max_model_len=40960)
    report = simulate(Scenario(cluster=..., model=..., rl=..., source=source), num_steps=20)
    report.summary()["libra"]["throughput_tok_s"]
"""

from libra.sim.engine import PolicyRun, ReconfigCosts, SimOptions
from libra.sim.policies import (
    EXTRA_POLICY_NAMES,
    KNOWN_POLICY_NAMES,
    POLICY_NAMES,
    Allocation,
    Decision,
    Observation,
    Policy,
    PolicyEnv,
    make_policy,
)
from libra.sim.records import PolicyResult, StageRecord
from libra.sim.routing import ROUTING_MODES, CausalRouting, Routes, final_routes, overflow_routes, routes_for
from libra.sim.simulator import Scenario, SimReport, simulate
from libra.sim.workload import StepWork, ToolLatency, WorkSource, step_work

__all__ = [
    "EXTRA_POLICY_NAMES",
    "KNOWN_POLICY_NAMES",
    "POLICY_NAMES",
    "ROUTING_MODES",
    "Allocation",
    "CausalRouting",
    "Decision",
    "Observation",
    "Policy",
    "PolicyEnv",
    "PolicyResult",
    "PolicyRun",
    "ReconfigCosts",
    "Routes",
    "Scenario",
    "SimOptions",
    "SimReport",
    "StageRecord",
    "StepWork",
    "ToolLatency",
    "WorkSource",
    "final_routes",
    "make_policy",
    "overflow_routes",
    "routes_for",
    "simulate",
    "step_work",
]
