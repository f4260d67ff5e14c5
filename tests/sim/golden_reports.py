"""Golden simulation reports: a few small scenarios whose full reports (every stage record and decision of every
policy) are committed under `tests/sim/golden/`, so a speed change of the simulator can show it moves no number
(`tests/sim/test_golden_reports.py`). Regenerate only for a change that is meant to move results, and say so in the
commit:

    PYTHONPATH=$PWD python -m tests.sim.golden_reports
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from libra.sim import POLICY_NAMES, Scenario, SimOptions, WorkSource, simulate
from libra.sim.manyturn import many_turn_pool
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import write_trace

GOLDEN = Path(__file__).parent / "golden"


def _scenario(source: WorkSource, *, gpus: int, prompts: int, samples: int, options: SimOptions) -> Scenario:
    return Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=prompts, samples_per_prompt=samples),
        source=source,
        options=options,
    )


def _generated(workload: str, prompts: int, samples: int, **options: Any) -> Scenario:
    source = WorkSource.from_generator(
        workload, seed=0, num_prompts=prompts, samples_per_prompt=samples, max_model_len=40960, drift_steps=10
    )
    return _scenario(source, gpus=16, prompts=prompts, samples=samples, options=SimOptions(**options))


def _many_turn(tmp: Path, **options: Any) -> Scenario:
    pool = many_turn_pool(8, 4, seed=1)
    rng = np.random.default_rng(3)
    steps = [
        attrs.evolve(pool[int(i)], prompt_id=f"{pool[int(i)].prompt_id}@{s}", step=s)
        for s in range(2)
        for i in rng.permutation(len(pool))
    ]
    path = tmp / "many-turn.jsonl"
    write_trace(path, steps)
    return _scenario(WorkSource.from_trace(path), gpus=16, prompts=8, samples=4, options=SimOptions(**options))


def cases(tmp: Path) -> dict[str, tuple[Scenario, int]]:
    """name -> (scenario, steps). Small enough to run in seconds; together they cover every policy, both
    pipelines, the elastic pool, migrations, every steal mode, both dispatch modes, many-turn trajectories, and
    instances with new requests queued while turns come back inside a slice."""
    return {
        "r2e-gym": (_generated("r2e-gym", 16, 4), 4),
        # 2,048 requests a step on 16 GPUs: new requests queue for KV, so turns taken back inside a slice go
        # through the queued-instance path of `SliceDecode._refill`, which the smaller cases never reach
        "r2e-gym-queued": (_generated("r2e-gym", 128, 16), 2),
        "search-r1-interleaved-new": (_generated("search-r1", 16, 4, steal="new", dispatch="interleaved"), 3),
        "dapo-math-off": (_generated("dapo-math", 8, 4, steal="off"), 3),
        "many-turn": (_many_turn(tmp), 2),
    }


def report_of(scenario: Scenario, steps: int) -> dict[str, Any]:
    """The report as JSON data, less the wall time the simulation took."""
    data = simulate(scenario, num_steps=steps, policies=POLICY_NAMES).to_dict()
    data.pop("elapsed_s")
    return json.loads(json.dumps(data))


def main() -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (scenario, steps) in cases(Path(tmp)).items():
            data = report_of(scenario, steps)
            (GOLDEN / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            print(name, {k: round(v["wall_s"], 3) for k, v in data["policies"].items()})


if __name__ == "__main__":
    main()
