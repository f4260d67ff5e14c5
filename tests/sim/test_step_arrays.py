"""A generated step built from the generator's arrays (`generated_step_work`) is the step built from its
`Trajectory` values (`step_work`): the same arrays, the same trajectories, made only when read; and the sums every
policy reads of a step are made once."""

import numpy as np
import pytest

from libra.sim import Scenario, WorkSource, simulate
from libra.sim.routing import routes_for
from libra.sim.workload import generated_step_work, step_work
from libra.spec import Bucket, ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import WORKLOAD_NAMES, WorkloadGenerator
from libra.workloads.generators._base import cap_lengths

FIELDS = ("prompt_tokens", "gen", "tool_tokens", "latency", "tool_end", "turn_of", "num_segments", "num_turns")


@pytest.mark.parametrize("workload", WORKLOAD_NAMES)
@pytest.mark.parametrize("step, max_len", [(0, 40960), (3, 6000), (120, 2500)])  # the short limits cut many rows
def test_the_arrays_are_those_of_the_trajectories(workload, step, max_len):
    gen = WorkloadGenerator(workload, seed=4, num_prompts=24, samples_per_prompt=8, max_model_len=max_len)
    made = gen.step_arrays(step)
    trajectories = made.trajectories()
    assert trajectories == gen.step(step)
    fast, slow = generated_step_work(made, chunk_tokens=700), step_work(step, trajectories, chunk_tokens=700)
    for name in FIELDS:
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), name
    assert fast.trajectories == slow.trajectories
    if max_len < 40960:
        assert any(t.total_tokens == max_len for t in trajectories)  # some were cut


def test_the_trajectories_are_made_once_and_only_when_read():
    calls = []
    made = WorkloadGenerator("search-r1", seed=0, num_prompts=4, samples_per_prompt=2).step_arrays(0)

    def make():
        calls.append(1)
        return made.trajectories()

    work = generated_step_work(made)
    object.__setattr__(work, "_trajectories", make)
    assert calls == []
    first = work.trajectories
    assert work.trajectories is first and calls == [1]


def test_the_source_of_a_generator_builds_from_arrays_and_a_trace_from_trajectories(tmp_path):
    source = WorkSource.from_generator("r2e-gym", seed=1, num_prompts=8, samples_per_prompt=4, max_model_len=20000)
    work = source.step(2)
    assert callable(work._trajectories)  # nothing made yet
    reference = step_work(
        2, WorkloadGenerator("r2e-gym", seed=1, num_prompts=8, samples_per_prompt=4, max_model_len=20000).step(2)
    )
    assert all(np.array_equal(getattr(work, f), getattr(reference, f)) for f in FIELDS)


def test_cap_lengths_in_place_cuts_as_the_copy_does():
    gen = WorkloadGenerator("r2e-gym", seed=2, num_prompts=16, samples_per_prompt=4, max_model_len=3000)
    made = gen.step_arrays(1)  # capped in place at 3,000
    again = WorkloadGenerator(
        "r2e-gym", seed=2, num_prompts=16, samples_per_prompt=4, max_model_len=10_000_000
    )  # the most a generator takes: nothing cut
    raw = again.step_arrays(1).batch  # nothing cut
    copied = cap_lengths(raw, made.prompt_tokens, 3000)
    assert copied.gen_tokens is not raw.gen_tokens
    gen_before = raw.gen_tokens.copy()
    inplace = cap_lengths(raw, made.prompt_tokens, 3000, copy=False)
    assert inplace.gen_tokens is raw.gen_tokens and not np.array_equal(raw.gen_tokens, gen_before)
    for a, b in ((copied, inplace), (copied, made.batch)):
        assert np.array_equal(a.gen_tokens, b.gen_tokens)
        assert np.array_equal(a.tool_tokens, b.tool_tokens)
        assert np.array_equal(a.num_turns, b.num_turns)


def test_a_steps_sums_are_made_once_and_cannot_be_written():
    work = WorkSource.from_generator(
        "dapo-math", seed=0, num_prompts=8, samples_per_prompt=4, max_model_len=40960
    ).step(0)
    assert np.array_equal(work.gen_tokens, work.gen.sum(axis=1))
    assert np.array_equal(work.total_tokens, work.prompt_tokens + work.gen.sum(axis=1) + work.tool_tokens.sum(axis=1))
    assert np.array_equal(work.tool_seconds, work.latency.sum(axis=1))
    assert work.total_tokens is work.total_tokens
    with pytest.raises(ValueError, match="read-only"):
        work.total_tokens[0] = 0


def test_one_bucket_routes_are_shared_within_a_step_and_read_only():
    source = WorkSource.from_generator("search-r1", seed=0, num_prompts=8, samples_per_prompt=4, max_model_len=40960)
    one = (Bucket(max_tokens=40960, tp=2),)
    a, b = source.step(0), source.step(1)
    ra = routes_for("single", a, one, None)
    assert routes_for("single", a, one, None) is ra
    rb = routes_for("single", b, one, None)
    assert rb is not ra  # another step: its own
    assert rb.bucket.shape == b.gen.shape and not rb.bucket.any() and not rb.carried.any()
    assert not rb.bucket.flags.writeable


def test_a_simulation_from_arrays_reports_what_one_from_trajectories_does():
    def scenario(source):
        return Scenario(
            cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8),
            model=get_model("Qwen3-14B"),
            rl=RLSettings(num_prompts=16),
            source=source,
        )

    arrays = WorkSource.from_generator("r2e-gym", seed=3, num_prompts=16, samples_per_prompt=16, max_model_len=40960)
    plain = WorkSource(arrays.name, arrays._fetch, None, arrays.latency, arrays.seed)  # no arrays: trajectories
    policies = ("static-optimal", "libra")
    a = simulate(scenario(arrays), num_steps=2, policies=policies)
    b = simulate(scenario(plain), num_steps=2, policies=policies)
    assert a.summary() == b.summary()
