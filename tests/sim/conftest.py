import pytest

from libra.sim import Scenario, SimOptions, WorkSource
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model


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


@pytest.fixture
def scenario() -> Scenario:
    return small_scenario()
