"""The simulator's Python API refuses bad settings at construction, or in `simulate` before it makes any step, with
one line naming the field and the value (before, a NaN `min_slice_s` looped forever, `slices_per_rollout=0`
divided by zero, a generator of another step size than `rl` trained a batch it never rolled out, and a trajectory
without turns failed as an IndexError)."""

import json
import math

import attrs
import pytest
from conftest import small_scenario

from libra.sim import ReconfigCosts, Scenario, SimOptions, ToolLatency, WorkSource, simulate, step_work
from libra.sim.report import write_json
from libra.spec import RLSettings, SpecError
from libra.workloads import WorkloadGenerator
from libra.workloads.trace import Trajectory, Turn, trusted_values


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"slices_per_rollout": 0}, "slices_per_rollout"),
        ({"slices_per_rollout": -3}, "slices_per_rollout"),
        ({"slices_per_rollout": 2.5}, "slices_per_rollout"),
        ({"min_slice_s": math.nan}, "min_slice_s"),
        ({"min_slice_s": 0.0}, "min_slice_s"),
        ({"max_slice_s": math.inf}, "max_slice_s"),
        ({"min_slice_s": 10.0, "max_slice_s": 1.0}, "max_slice_s"),
        ({"core_fraction": 1.5}, "core_fraction"),
        ({"core_fraction": math.nan}, "core_fraction"),
        ({"min_backlog": -1}, "min_backlog"),
    ],
)
def test_sim_options_refuse_bad_values(kwargs, field):
    with pytest.raises(SpecError, match=rf"^SimOptions\.{field} .*got") as err:
        SimOptions(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"to_rollout_s": -1.0}, {"snapshot_s": math.nan}, {"channel_setup_s": math.inf}, {"colocated_switch_s": -2.0}],
)
def test_reconfig_costs_refuse_bad_values(kwargs):
    (field,) = kwargs
    with pytest.raises(SpecError, match=rf"^ReconfigCosts\.{field} must be a finite number >= 0"):
        ReconfigCosts(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"median_s": 0.0}, "median_s"),
        ({"median_s": math.nan}, "median_s"),
        ({"sigma": -0.1}, "sigma"),
        ({"per_tool_median_s": {"search": -4.0}}, r"per_tool_median_s\['search'\]"),
    ],
)
def test_tool_latency_refuses_bad_values(kwargs, field):
    with pytest.raises(SpecError, match=rf"^ToolLatency\.{field} must be a finite number"):
        ToolLatency(**kwargs)


def test_good_settings_still_construct():
    SimOptions(slices_per_rollout=7, min_slice_s=0.5, max_slice_s=0.5, core_fraction=0.0, min_backlog=0)
    ReconfigCosts(to_rollout_s=0.0, snapshot_s=0.0, restore_s=0.0, channel_setup_s=0.0, colocated_switch_s=0.0)
    ToolLatency(median_s=0.3, sigma=0.0, per_tool_median_s={"python": 0.3})


def test_scenario_refuses_wrong_types_and_window():
    sc = small_scenario(prompts=2, samples=2, gpus=8)
    with pytest.raises(SpecError, match=r"^Scenario\.source must be a WorkSource, got str 'r2e-gym'$"):
        attrs.evolve(sc, source="r2e-gym")
    with pytest.raises(SpecError, match=r"^Scenario\.options must be a SimOptions, got NoneType None$"):
        attrs.evolve(sc, options=None)
    with pytest.raises(SpecError, match=r"^Scenario\.profile_window must be an integer >= 1, got 0$"):
        attrs.evolve(sc, profile_window=0)


def _untouched_trace_scenario() -> tuple[Scenario, list[int]]:
    """A scenario whose source records every step it is asked to make: the checks must come before any."""
    sc = small_scenario(prompts=2, samples=2, gpus=8)
    made: list[int] = []
    gen = WorkloadGenerator("r2e-gym", seed=0, num_prompts=2, samples_per_prompt=2, max_model_len=40960)

    def fetch(step: int):
        made.append(step)
        return gen.step(step)

    return attrs.evolve(sc, source=WorkSource("t", fetch, 1, ToolLatency(), 0)), made


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policies": "libra"}, r"^simulate\.policies must be a sequence of policy names, got the string 'libra'$"),
        ({"policies": ["static-uniform", "static-uniform"]}, r"names 'static-uniform' more than once$"),
        ({"policies": ["static-uniform", "nope"]}, r"^unknown policy 'nope'; expected one of colocated, "),
        ({"policy_options": {"libra": {"measured": False}}}, r"^policy_options for 'libra', which simulate does not"),
        ({"num_steps": 1.5}, r"^simulate\.num_steps must be an integer >= 1, got 1\.5$"),
        ({"workers": 0}, r"^simulate\.workers must be an integer >= 1, got 0$"),
    ],
)
def test_simulate_refuses_bad_arguments_before_any_step(kwargs, message):
    sc, made = _untouched_trace_scenario()
    args = {"num_steps": 1, "policies": ["static-uniform"], **kwargs}
    with pytest.raises(SpecError, match=message):
        simulate(sc, **args)
    assert made == []


def test_more_steps_than_the_trace_has_are_refused_before_any_step():
    sc, made = _untouched_trace_scenario()
    with pytest.raises(SpecError, match=r"^simulate\.num_steps is 3 but the trace 't' has 1 steps$"):
        simulate(sc, num_steps=3, policies=["static-uniform"])
    assert made == []


def test_generator_of_another_step_size_than_rl_is_refused():
    sc = small_scenario(prompts=2, samples=2, gpus=8)
    wrong = attrs.evolve(sc, rl=RLSettings(num_prompts=64, samples_per_prompt=16))
    with pytest.raises(SpecError, match=r"^the workload's steps hold 4 trajectories but rl trains 1024 \(64 x 16\)"):
        simulate(wrong, num_steps=1, policies=["static-uniform"])


def test_write_json_takes_a_string_path(tmp_path):
    sc = small_scenario(prompts=2, samples=2, gpus=8)
    report = simulate(sc, num_steps=1, policies=["static-uniform"])
    path = write_json(report, str(tmp_path / "report.json"))
    assert json.loads(path.read_text())["policies"].keys() == {"static-uniform"}


def _unchecked(cls: type, **fields: object) -> object:
    """A value built without the schema's checks, as only `trusted_values` (the generators' fast path) makes one:
    `Turn` and `Trajectory` refuse these when built the usual way, so `step_work`'s guards are the last line."""
    defaults = {"tool": None, "tool_status": None, "tool_tokens": 0, "extra": {}, "sample": None, "step": None}
    names = tuple(f.name for f in attrs.fields(cls))
    values = {**{k: v for k, v in defaults.items() if k in names}, **fields}
    if cls is Turn and values["tool"] is not None and values["tool_status"] is None:
        values["tool_status"] = "ok"
    if cls is Trajectory:
        values.setdefault("reward", None)
    return trusted_values(cls, names, tuple([values[n]] for n in names))[0]


def _turn(**fields: object) -> Turn:
    return _unchecked(Turn, **fields)  # type: ignore[return-value]


def _traj(*turns: Turn, prompt_tokens: int = 10) -> Trajectory:
    return _unchecked(Trajectory, prompt_id="p", prompt_tokens=prompt_tokens, turns=turns, sample=3)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("trajectory", "message"),
    [
        (_traj(), r"^step 0: trajectory 'p' sample 3 has no turns; expected at least one$"),
        (_traj(Turn(gen_tokens=5), prompt_tokens=-1), r"^step 0: trajectory 'p' sample 3: prompt_tokens must be >= 0"),
        (_traj(Turn(gen_tokens=5), _turn(gen_tokens=-5)), r"^step 0: trajectory 'p' sample 3 turn 1: gen_tokens must"),
        (
            _traj(_turn(gen_tokens=5, tool="x", tool_tokens=-3), Turn(gen_tokens=5)),
            r"turn 0: tool_tokens must be >= 0, got -3$",
        ),
        (
            _traj(_turn(gen_tokens=5, tool="x", tool_tokens=3, extra={"tool_latency_s": math.nan}), Turn(gen_tokens=5)),
            r"turn 0: tool_latency_s must be finite seconds >= 0, got nan$",
        ),
        (
            _traj(_turn(gen_tokens=5, tool="x", tool_tokens=3, extra={"tool_latency_s": "2s"}), Turn(gen_tokens=5)),
            r"turn 0: tool_latency_s must be finite seconds >= 0, got '2s'$",
        ),
    ],
)
def test_step_work_names_the_odd_trajectory(trajectory, message):
    with pytest.raises(SpecError):  # built the usual way, the value itself is refused
        turns = tuple(Turn(**{f.name: getattr(t, f.name) for f in attrs.fields(Turn)}) for t in trajectory.turns)
        Trajectory(**{**{f.name: getattr(trajectory, f.name) for f in attrs.fields(Trajectory)}, "turns": turns})
    with pytest.raises(SpecError, match=message):
        step_work(0, [_traj(Turn(gen_tokens=7)), trajectory])
