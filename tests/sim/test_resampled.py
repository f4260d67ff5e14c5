"""A short trace in its steady state: `WorkSource.resampled` draws more steps from a trace's prompt groups, and the
summary's steady throughput leaves out the pipeline's fill and drain (docs/sim.md, "A short trace")."""

from collections import Counter

import attrs
import pytest

from libra.sim import POLICY_NAMES, Scenario, SimOptions, WorkSource, simulate
from libra.spec import ClusterSpec, RLSettings, get_gpu, get_model
from libra.workloads import generate, write_trace
from libra.workloads.trace import Trajectory, Turn


def _trajectory(prompt: str, sample: int, step: int | None, gen: int) -> Trajectory:
    turns = (Turn(gen_tokens=gen, tool="search", tool_status="ok", tool_tokens=40), Turn(gen_tokens=gen))
    return Trajectory(prompt_id=prompt, sample=sample, step=step, prompt_tokens=100, turns=turns, extra={})


def test_a_drawn_prompt_keeps_its_group_and_gets_a_new_id_in_each_step(tmp_path):
    # two steps of the pool, prompt "a" in both (different runs: 10 and 30 tokens a turn), "b" only in the first
    pool = [_trajectory("a", s, 0, 10) for s in range(3)] + [_trajectory("b", s, 0, 20) for s in range(3)]
    pool += [_trajectory("a", s, 1, 30) for s in range(3)]
    write_trace(tmp_path / "t.jsonl", pool)
    source = WorkSource.resampled(tmp_path / "t.jsonl", num_steps=4, seed=1)
    assert source.num_steps == 4 and source.name == "t (resampled)"
    seen = Counter()
    for step in range(4):
        drawn = source.step(step).trajectories
        groups: dict[str, list[Trajectory]] = {}
        for t in drawn:
            assert t.step == step and t.prompt_id.endswith(f"@{step}.{t.prompt_id.rsplit('.', 1)[1]}")
            groups.setdefault(t.prompt_id, []).append(t)
        assert len(groups) == 2  # as many prompts as the trace's first step: a, b
        for members in groups.values():
            # a group is one prompt of one step of the pool, whole: its samples, never a mix of a's two steps
            assert sorted(t.sample for t in members) == [0, 1, 2]
            gens = {t.turns[0].gen_tokens for t in members}
            assert len(gens) == 1
            seen[gens.pop()] += 1
    assert set(seen) == {10, 20, 30}  # (all three groups drawn in 8 draws with this seed)
    again = WorkSource.resampled(tmp_path / "t.jsonl", num_steps=4, seed=1)
    other = WorkSource.resampled(tmp_path / "t.jsonl", num_steps=4, seed=4)
    ids = [[t.prompt_id for t in s.step(1).trajectories] for s in (source, again, other)]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_the_prompt_count_asked_for_is_drawn(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=4))
    source = WorkSource.resampled(trace, num_steps=2, num_prompts=5, seed=0)
    assert [len(source.step(s).trajectories) for s in range(2)] == [20, 20]
    with pytest.raises(Exception, match="2 steps"):
        source.step(2)


def test_steady_throughput_leaves_out_the_fill_and_the_drain(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=4))
    sc = Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=8, samples_per_prompt=4),
        source=WorkSource.resampled(trace, num_steps=3, seed=0),
        options=SimOptions(),
    )
    report = simulate(sc, num_steps=3, policies=POLICY_NAMES)
    for r in report.results:
        s = r.summary()
        full = [x for x in r.records if x.trajectories and x.step >= 1]
        assert [x.step for x in full] == [1, 2]
        assert s["steady_throughput_tok_s"] == sum(x.tokens for x in full) / sum(x.end - x.start for x in full)
        if r.name != "colocated":  # the asynchronous pipeline: a drain stage trains the last batch
            assert not r.records[-1].trajectories and r.records[-1].trained
    one = Scenario(
        cluster=sc.cluster, model=sc.model, rl=sc.rl, source=WorkSource.from_trace(trace), options=SimOptions()
    )
    for s in simulate(one, num_steps=1, policies=["colocated", "static-uniform"]).summary().values():
        assert s["steady_throughput_tok_s"] is None and s["throughput_tok_s"] > 0


def test_a_trace_whose_step_is_not_the_step_rl_trains_is_refused(tmp_path):
    """The rollout runs a trace's 32 trajectories as they are; training and the plans are sized by `rl`: the
    default RLSettings (512 x 16) trained 8,192 sequences after rolling out 32, silently."""
    from libra.spec import SpecError

    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=4))
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8)
    wrong = Scenario(
        cluster=cluster, model=get_model("Qwen3-14B"), rl=RLSettings(), source=WorkSource.from_trace(trace)
    )
    with pytest.raises(SpecError, match=r"first step holds 32 trajectories but rl trains 8192 \(512 x 16\)"):
        simulate(wrong, num_steps=1, policies=["colocated"])
    right = Scenario(
        cluster=cluster,
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=8, samples_per_prompt=4),
        source=WorkSource.from_trace(trace),
    )
    assert simulate(right, num_steps=1, policies=["colocated"]).results[0].records[0].trajectories == 32


def test_a_step_of_more_trajectories_trains_them_all(tmp_path):
    """Training prices the trajectories a step rolled out, not the first step's count: a resampled trace's steps
    vary in size (before, a step of 16 trained as fast as one of 8)."""
    pool = generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=1)
    steps = [*(attrs.evolve(t, step=0) for t in pool)]
    steps += [attrs.evolve(t, step=1, prompt_id=f"{t.prompt_id}-{k}") for t in pool for k in range(2)]
    trace = tmp_path / "t.jsonl"
    write_trace(trace, steps)
    sc = Scenario(
        cluster=ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=16, gpus_per_node=8),
        model=get_model("Qwen3-14B"),
        rl=RLSettings(num_prompts=8, samples_per_prompt=1),
        source=WorkSource.from_trace(trace),
    )
    (result,) = simulate(sc, num_steps=2, policies=["colocated"]).results
    first, second = (r.train_s for r in result.records[:2])
    assert [r.trajectories for r in result.records[:2]] == [8, 16]
    assert second > 1.3 * first  # 1.58x here: a step also pays costs that do not grow with it
