from pathlib import Path

import pytest

from libra.planning import GlobalPlanner
from libra.planning.cost import CostModel
from libra.sim import Scenario, SimOptions, WorkSource
from libra.sim.engine import PolicyRun
from libra.sim.policies import PolicyEnv, make_policy
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads.trace import Trajectory, Turn, write_trace


def small_scenario(
    *, workload: str = "r2e-gym", gpus: int = 16, prompts: int = 16, samples: int = 4, seed: int = 0, slices: int = 300
) -> Scenario:
    source = WorkSource.from_generator(
        workload, seed=seed, num_prompts=prompts, samples_per_prompt=samples, max_model_len=40960, drift_steps=10
    )
    return Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=prompts, samples_per_prompt=samples),
        source=source,
        options=SimOptions(slices_per_rollout=slices),
    )


def one_token_scenario(path: Path, runs: int = 88) -> Scenario:
    """The CLI's default cluster and model (48 x A800, Qwen3-14B), one step of `runs` trajectories of one prompt
    and one generated token each, written as a trace at `path` (8 prompts)."""
    write_trace(
        path, [Trajectory(prompt_id=f"p-{i % 8}", prompt_tokens=1, turns=(Turn(gen_tokens=1),)) for i in range(runs)]
    )
    return Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=48, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=runs // 4, samples_per_prompt=4),
        source=WorkSource.from_trace(path),
    )


def policy_env(sc: Scenario) -> PolicyEnv:
    """A policy's environment on `sc`: its cost model, shared by its planner."""
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    planner = GlobalPlanner(cluster=sc.cluster, model=sc.model, rl=sc.rl, coeffs=sc.coeffs)
    planner.cost_model = cm
    return PolicyEnv(cluster=sc.cluster, cost_model=cm, rl=sc.rl, planner=planner)


def policy_run(sc: Scenario, name: str, env: PolicyEnv | None = None) -> PolicyRun:
    """The run of policy `name` on `sc`, nothing decided yet."""
    env = env or policy_env(sc)
    return PolicyRun(
        make_policy(name, env),
        env.cost_model,
        global_batch=sc.rl.global_batch,
        max_len=sc.rl.max_model_len,
        costs=sc.costs,
        options=sc.options,
    )


@pytest.fixture
def scenario() -> Scenario:
    return small_scenario()


def plan_vs_sim():
    """`examples/plan_vs_sim.py` as a module (an example, not a package: loaded from its path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "plan_vs_sim.py"
    spec = importlib.util.spec_from_file_location("plan_vs_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
