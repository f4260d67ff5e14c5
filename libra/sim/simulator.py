"""`simulate(...)`: build the scenario, run every policy over the same steps, return a `SimReport`.

All policies see the same trajectories (the workload does not depend on the policy: the simulator measures
resource management, not learning), the same tool latencies and the same C-MLFQ prefix tree (it learns each step's
trajectories at the step boundary). The first plan of the planner-based policies is made from step 0's profile, as
a profiling pass would; later plans read only steps that have finished.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from libra.planning import GlobalPlanner
from libra.planning.cost import CostCoefficients, CostModel
from libra.sim.engine import PolicyRun, ReconfigCosts, SimOptions, profile_of
from libra.sim.parallel import fork_available, freeze_long_lived, policy_groups, run_groups
from libra.sim.policies import KNOWN_POLICY_NAMES, POLICY_NAMES, PolicyEnv, make_policy, uses_shared_tree
from libra.sim.records import PolicyResult
from libra.sim.routing import CausalRouting, routes_for
from libra.sim.workload import StepWork, WorkSource
from libra.spec import ClusterSpec, ModelSpec, RLSettings, SpecError, checks


@attrs.frozen(kw_only=True, eq=False)
class Scenario:
    """What to simulate. The rollout runs each step's trajectories of `source` as they are, while training (and
    every policy's plan) is sized by `rl.global_batch`: for a trace, set `rl` to its step size
    (`num_prompts * samples_per_prompt` = trajectories per step, as `libra simulate --trace` does); `simulate`
    refuses a trace whose first step is another size."""

    cluster: ClusterSpec
    model: ModelSpec
    rl: RLSettings
    source: WorkSource
    coeffs: CostCoefficients | None = None
    costs: ReconfigCosts = ReconfigCosts()
    options: SimOptions = SimOptions()
    profile_window: int = 2  # finished steps a replan reads

    def __attrs_post_init__(self) -> None:
        for name, kind in (
            ("cluster", ClusterSpec),
            ("model", ModelSpec),
            ("rl", RLSettings),
            ("source", WorkSource),
            ("coeffs", (CostCoefficients, type(None))),
            ("costs", ReconfigCosts),
            ("options", SimOptions),
        ):
            checks.instance("Scenario", name, getattr(self, name), kind)
        checks.whole("Scenario", "profile_window", self.profile_window, 1)


@attrs.frozen(kw_only=True)
class SimReport:
    workload: str
    num_gpus: int
    num_steps: int
    seed: int
    results: tuple[PolicyResult, ...]
    elapsed_s: float

    def summary(self) -> dict[str, dict[str, Any]]:
        return {r.name: r.summary() for r in self.results}

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "gpus": self.num_gpus,
            "steps": self.num_steps,
            "seed": self.seed,
            "elapsed_s": self.elapsed_s,
            "policies": self.summary(),
            "runs": {r.name: r.to_dict() for r in self.results},
        }


def _check_step_size(scenario: Scenario) -> None:
    """A trace's first step must be the step `rl` trains: the rollout runs the trace's trajectories as they are,
    while training and every policy's plan are sized by `rl.global_batch` (a silent mismatch trained 8,192
    sequences after rolling out 64)."""
    source, rl = scenario.source, scenario.rl
    if source.num_steps is None:  # a generator: every step holds the size it was given
        if source.step_size is None or source.step_size == rl.global_batch:
            return
        raise SpecError(
            f"the workload's steps hold {source.step_size} trajectories but rl trains {rl.global_batch} "
            f"({rl.num_prompts} x {rl.samples_per_prompt}): give WorkSource.from_generator and RLSettings the same "
            "num_prompts and samples_per_prompt"
        )
    first = source.step(0).num_requests
    if first != rl.global_batch:
        raise SpecError(
            f"the trace's first step holds {first} trajectories but rl trains {rl.global_batch} "
            f"({rl.num_prompts} x {rl.samples_per_prompt}): set RLSettings(num_prompts=..., "
            "samples_per_prompt=...) to the trace's step, as `libra simulate --trace` does"
        )


def _check_policies(policies: Sequence[str], options: dict[str, dict[str, Any]] | None) -> None:
    """Known names, each once (a report keys its runs by name), and options only for the policies that run."""
    if isinstance(policies, str):
        raise SpecError(f"simulate.policies must be a sequence of policy names, got the string {policies!r}")
    if not policies:
        raise SpecError("simulate needs at least one policy")
    for name in policies:
        if name not in KNOWN_POLICY_NAMES:
            raise SpecError(f"unknown policy {name!r}; expected one of {', '.join(KNOWN_POLICY_NAMES)}")
    repeated = sorted({name for name in policies if list(policies).count(name) > 1})
    if repeated:
        raise SpecError(f"simulate.policies names {', '.join(map(repr, repeated))} more than once")
    extra = sorted(set(options or {}) - set(policies))
    if extra:
        raise SpecError(
            f"policy_options for {', '.join(map(repr, extra))}, which simulate does not run (policies: "
            f"{', '.join(policies)})"
        )


def simulate(
    scenario: Scenario,
    *,
    num_steps: int,
    policies: Sequence[str] = POLICY_NAMES,
    progress: Callable[[str, int], None] | None = None,
    policy_options: dict[str, dict[str, Any]] | None = None,
    workers: int = 1,
) -> SimReport:
    """Run `policies` for `num_steps` steps of `scenario.source`; `progress(policy, step)` after each stage.
    `workers` > 1 runs groups of policies in that many forked processes (`libra.sim.parallel`): the same numbers
    as one process."""
    checks.instance("simulate", "scenario", scenario, Scenario)
    checks.whole("simulate", "num_steps", num_steps, 1)
    checks.whole("simulate", "workers", workers, 1)
    _check_policies(policies, policy_options)
    have = scenario.source.num_steps
    if have is not None and num_steps > have:  # (else the run stopped at the missing step, its work lost)
        raise SpecError(f"simulate.num_steps is {num_steps} but the trace {scenario.source.name!r} has {have} steps")
    _check_step_size(scenario)
    started = time.perf_counter()
    groups = policy_groups(policies, workers) if workers > 1 and fork_available() else [list(policies)]
    if len(groups) > 1:

        def run_group(group: list[str], report: Callable[[str, int], None]) -> tuple[PolicyResult, ...]:
            # (in a worker process the simulator owns: its long-lived state frozen at each step's end)
            return _simulate(scenario, num_steps, group, report, policy_options, step_end=freeze_long_lived)

        by_name = {r.name: r for part in run_groups(run_group, groups, progress) for r in part}
        results = tuple(by_name[p] for p in policies)
    else:
        results = _simulate(scenario, num_steps, policies, progress, policy_options)
    return SimReport(
        workload=scenario.source.name,
        num_gpus=scenario.cluster.num_gpus,
        num_steps=num_steps,
        seed=scenario.source.seed,
        results=results,
        elapsed_s=time.perf_counter() - started,
    )


def _simulate(
    scenario: Scenario,
    num_steps: int,
    policies: Sequence[str],
    progress: Callable[[str, int], None] | None,
    policy_options: dict[str, dict[str, Any]] | None,
    step_end: Callable[[], None] | None = None,
) -> tuple[PolicyResult, ...]:
    """The policies' runs over the steps; `step_end()` after each step, once the prefix tree has learnt it."""
    cm = CostModel(scenario.cluster, scenario.model, scenario.coeffs)
    planner = GlobalPlanner(cluster=scenario.cluster, model=scenario.model, rl=scenario.rl, coeffs=scenario.coeffs)
    planner.cost_model = cm  # one cost model object: the simulator prices exactly what the planner predicts
    env = PolicyEnv(
        cluster=scenario.cluster,
        cost_model=cm,
        rl=scenario.rl,
        planner=planner,
        to_rollout_s=scenario.costs.to_rollout_s,
        to_training_s=scenario.costs.to_training_s,
    )
    options = policy_options or {}
    runs = [
        PolicyRun(
            make_policy(name, env, **options.get(name, {})),
            cm,
            global_batch=scenario.rl.global_batch,
            max_len=scenario.rl.max_model_len,
            costs=scenario.costs,
            options=scenario.options,
        )
        for name in policies
    ]
    causal = CausalRouting() if any(uses_shared_tree(r.policy.name) for r in runs) else None
    name = scenario.source.name
    gb = scenario.rl.global_batch
    window: deque[StepWork] = deque(maxlen=scenario.profile_window)
    first = scenario.source.step(0)
    profile0 = profile_of([first], f"{name}@0", gb)
    for run in runs:
        run.decide(run.policy.initial(profile0))
    for k in range(num_steps):
        work = first if k == 0 else scenario.source.step(k)
        for run in runs:
            alloc = run.begin_stage()
            routes = routes_for(
                alloc.routing, work, alloc.buckets, causal, admit=getattr(run.policy, "admit", "smallest")
            )
            run.stage(work, routes)
            if progress:
                progress(run.policy.name, k)
        window.append(work)
        cached: dict[str, Any] = {}

        def profile(ws=tuple(window), cache=cached, step=k):
            if "p" not in cache:
                cache["p"] = profile_of(list(ws), f"{name}@{step}", gb)
            return cache["p"]

        def step_profile(w=work, cache=cached, step=k):  # the step just rolled out alone
            if "s" not in cache:
                cache["s"] = profile_of([w], f"{name}@{step} alone", gb)
            return cache["s"]

        if k + 1 < num_steps:
            for run in runs:
                decision = run.policy.after_step(run.observation(profile, step_profile))
                if decision is not None:
                    run.decide(decision)
        if causal is not None:
            causal.learn(work)
        if step_end is not None:
            step_end()
    for run in runs:
        if not run.policy.synchronous:
            run.begin_stage()
            run.stage(None, None)
    return tuple(
        PolicyResult(
            name=r.policy.name,
            records=tuple(r.records),
            decisions=tuple(r.decisions),
            num_gpus=scenario.cluster.num_gpus,
        )
        for r in runs
    )
