"""A rollout, and the stage around it, give the same result wherever they start on the run's clock: slice
boundaries are on the rollout's own clock (seconds since its start), not the run's (docs/sim.md, "What is
approximated"). Before, event times were compared with boundaries on the absolute clock, so the same rollout on the
same instances rounded them differently at another start and moved turns across boundaries: step 0 of r2e-gym
(512 x 16 on 8 x TP-2, `--steal new`) took 1,328.8 s from t = 0, 1,237.7 s from 0.001 and 1,272.5 s from 2,087.5."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from conftest import policy_run, small_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra.planning.cost import CostModel
from libra.sim import Scenario, routes_for
from libra.sim.engine import batch_stats, profile_of
from libra.sim.records import StageRecord
from libra.sim.rollout import DONE, Instances, RolloutRun
from libra.sim.routing import CausalRouting
from libra.spec import parse_buckets

# The tolerance of "the same": a stage's times are on its own clock, and only its record's `end` (start + length)
# is rounded on the run's, an ulp of the start (2e-10 s at 1e6 s) against a stage of tens of seconds or more.
REL = 1e-9

# where a rollout or a stage may start: 0, tiny shifts (the boundaries' rounding moves with every bit of the start),
# and the clock of later steps in long runs
OFFSETS = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-9, max_value=1e-2, allow_nan=False),
    st.floats(min_value=1.0, max_value=1e6, allow_nan=False),
)


def _scenario(prompts: int = 256, samples: int = 16) -> Scenario:
    """r2e-gym, 256 prompts x 16 on 32 GPUs: queues for KV, stuck turns moved, tool returns at boundaries (before,
    its static-optimal stage took 870.0-924.2 s from clocks of 0.003-12,345.7 s, 886.7 s from 0)."""
    return small_scenario(workload="r2e-gym", gpus=32, prompts=prompts, samples=samples)


# (policy, prompts x samples of the batch training beside the rollout, what the elastic pool does): synchronous,
# and asynchronous with training beside; `libra`'s pool borrows training's replicas once a short training is done,
# and lends idle instances to a long one
STAGES = [
    ("colocated", (0, 0), ""),
    ("static-optimal", (64, 16), ""),
    ("libra", (2, 4), "borrowed"),
    ("libra", (512, 16), "lent"),
]


def _close(a: float, b: float, what: str) -> None:
    assert a == pytest.approx(b, rel=REL, abs=1e-9), what


def _rollout(start: float, steal: str) -> RolloutRun:
    sc = _scenario()
    cm = CostModel(sc.cluster, sc.model, sc.coeffs)
    work = sc.source.step(3)
    routes = routes_for("overflow", work, parse_buckets("1:6000,2:inf"), None)
    # two instances start 10.8 s late (their engines start): 10.8 s after the rollout's start, on its clock
    inst = Instances([1, 1, 1, 1, 2, 2, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1], [0.0] * 6 + [10.8] * 2)
    run = RolloutRun(cm, work, routes, inst, start=start, min_slice_s=0.7, steal=steal)
    run.run_to_end()
    assert (run.state == DONE).all()
    return run


_ROLLOUTS: dict[str, RolloutRun] = {}


@pytest.mark.parametrize("steal", ["all", "new", "off"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=OFFSETS)
def test_a_rollout_is_the_same_from_any_start(steal: str, start: float) -> None:
    """Its time, every request's finish and every count it keeps, whatever `start`; its end on the caller's
    clock is `start` later."""
    ref = _ROLLOUTS.get(steal) or _ROLLOUTS.setdefault(steal, _rollout(0.0, steal))
    run = _rollout(start, steal)
    _close(run.elapsed_s, ref.elapsed_s, "elapsed_s")
    _close(run.end_time, start + ref.elapsed_s, "end_time")
    np.testing.assert_allclose(run.finish, ref.finish, rtol=REL, atol=1e-9)
    for name in ("busy_gpu_s", "decoded", "capacity_tokens"):
        _close(getattr(run, name), getattr(ref, name), name)
    for name in ("migrations", "migrated_tokens", "rebalanced", "rebalanced_tokens"):
        assert getattr(run, name) == getattr(ref, name), name
    np.testing.assert_array_equal(run.where, ref.where)


def _stage(name: str, trained: tuple[int, int], clock: float) -> StageRecord:
    """Step 0 of `name`'s policy as a stage that starts at `clock` on the run's clock, with a batch of `trained`
    (prompts, samples) training beside it in the asynchronous pipeline."""
    sc = _scenario()
    run = policy_run(sc, name)
    work = sc.source.step(0)
    run.decide(run.policy.initial(profile_of([work], "p", sc.rl.global_batch)))
    alloc = run.begin_stage()
    if trained[0]:
        prompts, samples = trained
        batch = _scenario(prompts, samples).source.step(0)
        run.prev_batch = batch_stats(batch, sc.rl.max_model_len)
    run.clock = clock
    return run.stage(work, routes_for(alloc.routing, work, alloc.buckets, CausalRouting()))


_STAGES: dict[tuple[str, tuple[int, int]], StageRecord] = {}


@pytest.mark.parametrize(("name", "trained", "pool"), STAGES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(clock=OFFSETS)
def test_a_stage_is_the_same_wherever_it_starts_on_the_clock(
    name: str, trained: tuple[int, int], pool: str, clock: float
) -> None:
    """Every number of the stage's record but its start and end (which move with it) is the one from a clock
    at zero: rollout and training time, busy GPU-seconds, what the rollout decoded and could have, moves, and what
    the elastic pool lent and borrowed."""
    key = (name, trained)
    ref = _STAGES.get(key) or _STAGES.setdefault(key, _stage(name, trained, 0.0))
    got = _stage(name, trained, clock)
    assert got.start == clock
    _close(got.end - got.start, ref.end - ref.start, "end - start")
    for field, want in attrs.asdict(ref).items():
        if field in ("start", "end"):
            continue
        have = getattr(got, field)
        if isinstance(want, float):
            _close(have, want, field)
        else:
            assert have == want, field
    if pool:
        assert getattr(ref, f"{pool}_gpu_s") > 0  # the elastic pool acted inside the stage
