"""Real recorded agents (the committed corpus, data/corpus): three identical steps, the source's trajectories in
another order each step, simulate alike under every policy. Tool times these recordings do not carry are drawn from
each trajectory's own content, so the order of a step and its number do not move them; before that change the
tau-bench airline step spread 13-14 % on identical steps."""

import attrs
import numpy as np
import pytest

from libra.sim import POLICY_NAMES, Scenario, SimOptions, WorkSource, simulate
from libra.sim.policies import uses_shared_tree
from libra.sim.workload import content_normals, step_work
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import write_trace
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest

HELD_OUT = DEFAULT_CORPUS / "held-out"


def _identical_steps(pool, seed=5):
    rng = np.random.default_rng(seed)
    return [
        attrs.evolve(pool[int(i)], prompt_id=f"{pool[int(i)].prompt_id}#{i}@{step}", step=step, sample=0)
        for step in range(3)
        for i in rng.permutation(len(pool))
    ]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_a_trajectory_draws_the_same_tool_times_in_any_step_and_position(corpus):
    pool = corpus["tau-bench-gpt4o-airline"][:40]
    order = np.random.default_rng(1).permutation(len(pool))
    a = step_work(0, pool, seed=3)
    b = step_work(7, [pool[int(i)] for i in order], seed=3)
    assert np.array_equal(a.latency[order], b.latency)
    assert (a.latency[a.tool_end] > 0).all()
    other = step_work(0, pool, seed=4)  # the seed still changes them
    assert not np.array_equal(a.latency, other.latency)


def test_content_normals_are_standard_normal_and_tell_turns_apart():
    rng = np.random.default_rng(0)
    n, k = 20_000, 5
    traj_of, turn_no = np.repeat(np.arange(n), k), np.tile(np.arange(k), n)
    z = content_normals(
        rng.integers(1, 5000, n), rng.integers(1, 900, n * k), rng.integers(0, 4000, n * k), traj_of, turn_no, seed=0
    )
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    assert abs(np.mean(np.abs(z) > 1.96) - 0.05) < 0.005
    assert abs(np.corrcoef(z.reshape(n, k)[:, 0], z.reshape(n, k)[:, 1])[0, 1]) < 0.03  # turns draw apart


def _spreads(pool, tmp_path, name: str) -> dict[str, list[float]]:
    """Each policy's rollout seconds over the three identical steps, from the step after its last change of
    allocation (the C-MLFQ policies from step 1, whose tree is empty in step 0)."""
    trace = tmp_path / f"{name}.jsonl"
    write_trace(trace, _identical_steps(pool))
    sc = Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=len(pool), samples_per_prompt=1, max_model_len=131072),
        source=WorkSource.from_trace(trace),
        options=SimOptions(),
    )
    report = simulate(sc, num_steps=3, policies=POLICY_NAMES, workers=2)
    out = {}
    for r in report.results:
        changed = {d["step"] for d in r.decisions if d["step"] > 0}
        first = max(changed | {1 if uses_shared_tree(r.name) else 0})  # after the last change of allocation
        out[r.name] = [x.rollout_s for x in r.records if x.trajectories and x.step >= first]
    return out


# held-out sources whose identical steps do not simulate within 5 % (docs/sim.md, "Real recorded agents"): a step
# whose order decides which runs share an instance or wait, measured 2026-12-06
_NOT_HELD = {
    "moatless-claude35-sonnet-lite": "colocated 542 / 518 / 509 s (6.5 %): where a few hundred long runs land",
    "intercode-sql-react-davinci003": "the static plan 188 / 218 / 205 s (15.7 %; 0.9 % on 48 GPUs): which runs wait",
}


def _held_out_cases():
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=_NOT_HELD[name])) if name in _NOT_HELD else name
        for name in (source["name"] for source in load_manifest(HELD_OUT)["sources"])
    ]


@pytest.mark.slow
@pytest.mark.parametrize("source", _held_out_cases())
def test_identical_held_out_steps_simulate_alike_for_every_policy(tmp_path, source):
    """The same check on the held-out agents (which nothing in the simulator was tuned on): 30 of 32 hold."""
    pool = sorted(load_corpus(HELD_OUT)[source], key=lambda t: t.prompt_id)
    for name, same in _spreads(pool, tmp_path, source).items():
        assert len(same) >= 2 and max(same) <= 1.05 * min(same), (source, name, same)


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, limit",
    [
        ("tau-bench-gpt4o-airline", None),
        ("tau2-gemma3-27b-custom", None),
        ("mini-swe-agent-gemini3pro-verified", None),
    ],
)
def test_identical_real_steps_simulate_alike_for_every_policy(corpus, tmp_path, source, limit):
    pool = sorted(corpus[source], key=lambda t: t.prompt_id)[:limit]
    for name, same in _spreads(pool, tmp_path, source).items():
        assert len(same) >= 2 and max(same) <= 1.05 * min(same), (source, name, same)
