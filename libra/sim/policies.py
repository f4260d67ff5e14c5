"""Resource-management policies: each is a small class that returns decisions as data (`Decision`), never acts.

    colocated          verl-style: every GPU does rollout, then every GPU trains (synchronous, on-policy)
    static-uniform     half the GPUs train, half roll out on instances of one TP degree; never changes
    greedy             starts as static-uniform; after each step moves `move_gpus` GPUs toward the slower side when
                       one side is slower than the other by more than `threshold`
    static-optimal     the planner's plan for the first step's profile (heterogeneous TP buckets, requests promoted
                       to a larger bucket when their context outgrows theirs), never changed
    libra-homogeneous  periodic replanning through the replan gate, one TP degree (ablation step 1)
    libra-hetero-tp    + heterogeneous TP buckets, overflow routing (ablation step 2)
    libra-cmlfq        + C-MLFQ routing (ablation step 3)
    libra              + the elastic hybrid pool (non-blocking joins, idle workers lent across sides)

and one policy that runs only when named (`EXTRA_POLICY_NAMES`; not in `POLICY_NAMES`, the set `--policy all` runs):

    libra-oracle       libra-cmlfq with perfect routing: planned with the planner's `final-length` model and run
                       with the simulator's `final` routing (each request on the bucket of its final length from
                       the start, nothing moves). It reads each request's future, so no real router can do it: it
                       is what routing could gain, the ablation step after libra-cmlfq (not a bound on every
                       workload: its plans are priced without the work-conserving steal; docs/sim.md, Policies)

The engine (`libra.sim.engine`) executes decisions: it owns time, costs and the cluster.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import numpy as np

from libra.planning import GlobalPlanner, ReplanGate
from libra.planning.cost import BatchStats, CostModel
from libra.sim.training import nearest_layout
from libra.spec import (
    Bucket,
    ClusterSpec,
    InstanceGroup,
    Plan,
    RLSettings,
    RolloutConfig,
    SpecError,
    TrainConfig,
    WorkloadProfile,
)


@attrs.frozen(kw_only=True)
class Allocation:
    """Who does what: the training layout, the rollout instance groups (one bucket each, in length order) and how
    requests are routed between buckets (`single`, `overflow`, `cmlfq`)."""

    train: TrainConfig
    rollout: tuple[InstanceGroup, ...]
    routing: str
    predicted_s: float = math.nan

    @property
    def rollout_gpus(self) -> int:
        return sum(g.num_gpus for g in self.rollout)

    @property
    def num_gpus(self) -> int:
        return self.train.num_gpus + self.rollout_gpus

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return RolloutConfig(num_gpus=self.rollout_gpus, time_s=0.0, instances=self.rollout).buckets

    def same_layout(self, other: Allocation) -> bool:
        """The same GPUs doing the same things (predicted times aside)."""

        def key(t: TrainConfig) -> tuple:
            return (t.num_gpus, t.tp, t.pp, t.dp, t.ep, t.micro_batch, t.recompute)

        return key(self.train) == key(other.train) and self.rollout == other.rollout and self.routing == other.routing

    def check(self, cluster: ClusterSpec, *, time_shared: bool = False) -> None:
        """Raise SpecError unless the allocation fits the cluster (GPU count, TP inside a node). `time_shared`:
        training and rollout take turns on the same GPUs (colocated), so each side alone must fit."""
        used = max(self.train.num_gpus, self.rollout_gpus) if time_shared else self.num_gpus
        if used > cluster.num_gpus:
            raise SpecError(
                f"allocation uses {self.num_gpus} GPUs (train {self.train.num_gpus} + rollout "
                f"{self.rollout_gpus}) but the cluster has {cluster.num_gpus}"
            )
        for g in self.rollout:
            if g.tp > cluster.gpus_per_node or g.count < 1:
                raise SpecError(
                    f"rollout group tp={g.tp} count={g.count} does not fit nodes of {cluster.gpus_per_node} GPUs"
                )
        if self.train.tp > cluster.gpus_per_node:
            raise SpecError(f"training TP {self.train.tp} spans more than one node ({cluster.gpus_per_node} GPUs)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "train": self.train.to_dict(),
            "rollout": [g.to_dict() for g in self.rollout],
            "routing": self.routing,
            "predicted_s": self.predicted_s,
        }


@attrs.frozen(kw_only=True)
class Decision:
    """A policy's decision at the start of `step`: run `allocation` from now on. `reason` says why."""

    step: int
    allocation: Allocation
    reason: str
    saving_s: float = 0.0
    cost_s: float = 0.0


@attrs.frozen(kw_only=True)
class Observation:
    """What a policy may read after a step: its measured times and the workload seen so far. `switch_s` is the part
    of `rollout_s` spent moving the weights into rollout before it could start (the asynchronous pipeline's weight
    broadcast, colocated's switch into rollout): no plan changes it and the planner's prediction leaves it out."""

    step: int
    rollout_s: float
    train_s: float
    profile: Callable[[], WorkloadProfile]  # lengths of recently finished steps only (no future)
    step_profile: Callable[[], WorkloadProfile] | None = None  # the step just rolled out alone (None: `profile`)
    switch_s: float = 0.0


@attrs.frozen(kw_only=True, eq=False)
class PolicyEnv:
    cluster: ClusterSpec
    cost_model: CostModel
    rl: RLSettings
    planner: GlobalPlanner
    to_rollout_s: float = 10.8
    to_training_s: float = 8.0


def _batch(env: PolicyEnv, profile: WorkloadProfile) -> BatchStats:
    return env.planner.batch_stats(profile)


def _uniform_rollout(env: PolicyEnv, gpus: int, tp: int, longest: float) -> tuple[InstanceGroup, ...]:
    """`gpus // tp` instances of one degree: the smallest degree >= `tp` whose instance holds `longest` tokens."""
    rc = env.cost_model.rollout
    degrees = [d for d in (1, 2, 4, 8) if d >= tp and d <= env.cluster.gpus_per_node and rc.fits(d, longest)]
    if not degrees or gpus < degrees[0]:
        raise SpecError(f"no rollout instance of TP >= {tp} holding {longest:.0f} tokens fits in {gpus} GPUs")
    return (InstanceGroup(tp=degrees[0], count=gpus // degrees[0], max_tokens=math.inf),)


class Policy(ABC):
    """The contract: `initial(profile)` once, then `after_step(observation)` after every step (None = no change).
    `synchronous` selects the colocated pipeline; `elastic` turns on the hybrid pool in the engine."""

    name: ClassVar[str]
    synchronous: ClassVar[bool] = False
    elastic: ClassVar[bool] = False

    def __init__(self, env: PolicyEnv, **options: Any) -> None:
        self.env = env
        if options:
            raise SpecError(f"policy {self.name!r} takes no options {sorted(options)}")

    @abstractmethod
    def initial(self, profile: WorkloadProfile) -> Decision: ...

    def after_step(self, obs: Observation) -> Decision | None:
        return None


class Colocated(Policy):
    name = "colocated"
    synchronous = True

    def __init__(self, env: PolicyEnv, *, tp: int = 2) -> None:
        super().__init__(env)
        self.tp = tp

    def initial(self, profile: WorkloadProfile) -> Decision:
        g = self.env.cluster.num_gpus
        train = nearest_layout(self.env.cost_model, g, _batch(self.env, profile))
        rollout = _uniform_rollout(self.env, g, self.tp, self.env.rl.max_model_len)
        return Decision(
            step=0,
            allocation=Allocation(train=train, rollout=rollout, routing="single"),
            reason=f"all {g} GPUs alternate: rollout on TP-{rollout[0].tp}, then training",
        )


class StaticUniform(Policy):
    name = "static-uniform"

    def __init__(self, env: PolicyEnv, *, tp: int = 2) -> None:
        super().__init__(env)
        self.tp = tp

    def split(self, train_gpus: int, profile: WorkloadProfile) -> Allocation:
        env = self.env
        train = nearest_layout(env.cost_model, train_gpus, _batch(env, profile))
        rollout = _uniform_rollout(env, env.cluster.num_gpus - train.num_gpus, self.tp, env.rl.max_model_len)
        return Allocation(train=train, rollout=rollout, routing="single")

    def initial(self, profile: WorkloadProfile) -> Decision:
        half = self.env.cluster.num_gpus // 2
        return Decision(step=0, allocation=self.split(half, profile), reason=f"half/half, TP-{self.tp}")


class Greedy(StaticUniform):
    name = "greedy"

    def __init__(self, env: PolicyEnv, *, tp: int = 2, move_gpus: int | None = None, threshold: float = 0.2) -> None:
        super().__init__(env, tp=tp)
        self.move = move_gpus or env.cluster.gpus_per_node
        self.threshold = threshold
        self.current: Allocation | None = None

    def initial(self, profile: WorkloadProfile) -> Decision:
        d = super().initial(profile)
        self.current = d.allocation
        return d

    def after_step(self, obs: Observation) -> Decision | None:
        assert self.current is not None
        if obs.train_s <= 0:  # nothing trained yet: no imbalance to read
            return None
        train_gpus = self.current.train.num_gpus
        n = self.env.cluster.num_gpus
        if obs.rollout_s > (1 + self.threshold) * obs.train_s:
            direction, why = -1, "rollout slower"
        elif obs.train_s > (1 + self.threshold) * obs.rollout_s:
            direction, why = 1, "training slower"
        else:
            return None
        alloc = None
        target = train_gpus + direction * self.move
        while 1 <= target <= n - self.tp:  # the nearest GPU count at least `move` away that has a training layout
            try:
                alloc = self.split(target, obs.profile())
            except SpecError:
                alloc = None
            if alloc is not None and alloc.train.num_gpus == target:
                break
            alloc = None
            target += direction
        if alloc is None:
            return None
        self.current = alloc
        return Decision(
            step=obs.step + 1,
            allocation=alloc,
            reason=f"{why} ({obs.rollout_s:.0f} s vs {obs.train_s:.0f} s): train {alloc.train.num_gpus}",
        )


def _plan_allocation(plan: Plan, routing: str) -> Allocation:
    groups = tuple(sorted(plan.rollout.instances, key=lambda g: g.max_tokens))
    if routing == "single":
        tps = {g.tp for g in groups}
        if len(tps) != 1:
            raise SpecError(f"single-bucket routing needs one TP degree, the plan has {sorted(tps)}")
        groups = (InstanceGroup(tp=groups[0].tp, count=sum(g.count for g in groups), max_tokens=math.inf),)
    return Allocation(train=plan.train, rollout=groups, routing=routing, predicted_s=plan.makespan_s)


class StaticOptimal(Policy):
    name = "static-optimal"

    def initial(self, profile: WorkloadProfile) -> Decision:
        plan = self.env.planner.plan(profile)
        return Decision(
            step=0,
            allocation=_plan_allocation(plan, "overflow"),
            reason=f"planner optimum for the first profile ({plan.makespan_s:.0f} s predicted)",
        )


def plan_kind(plan: Plan) -> str:
    """The kind of a plan's rollout: "single" for one TP degree in one bucket, "mixed" for several buckets. `Libra`
    keeps their measured times apart (the cost model errs differently on them)."""
    return "single" if len(plan.rollout.instances) == 1 else "mixed"


class Libra(Policy):
    """Replan every `replan_every` steps on the profile of recently finished steps; apply through the gate.

    With `measured` (the default for `libra` itself, off for its ablations), the policy trusts what it measured:
    after every step it keeps the ratio of the rollout time it saw, less the weights' move into rollout
    (`Observation.switch_s`, which the prediction leaves out), to the time the planner predicts for the plan it ran
    (`evaluate` on that step's own work), by plan kind (`plan_kind`), and at a replan it scores the planner's
    optimum and the best single-degree plan alike as the engine runs a stage: its predicted rollout times the
    median of its kind's last `replan_every` ratios (1 for a kind not run yet), plus the last step's move of the
    weights once (the same for every plan), against its predicted training. So a kind of plan that ran slower than
    predicted is not kept on the model's word. The same score rates the running plan for the gate."""

    name = "libra"
    elastic = True
    homogeneous: ClassVar[bool] = False
    routing: ClassVar[str] = "cmlfq"
    measures: ClassVar[bool] = True

    def __init__(
        self,
        env: PolicyEnv,
        *,
        replan_every: int = 10,
        min_relative_gain: float = 0.05,
        admit: str = "smallest",
        measured: bool | None = None,
    ) -> None:
        super().__init__(env)
        if admit not in ("smallest", "predicted"):
            raise SpecError(f"admit must be 'smallest' or 'predicted', got {admit!r}")
        if replan_every < 1:
            raise SpecError(f"replan_every must be >= 1, got {replan_every}")
        self.admit = admit  # where C-MLFQ starts a request (the published rule: the smallest bucket)
        self.measured = self.measures if measured is None else bool(measured)
        # measured rollout (less the weights' move) over predicted, by kind
        self.ratios: dict[str, list[float]] = {"single": [], "mixed": []}
        self.switch_s = 0.0  # the last step's move of the weights into rollout, added to every plan's score
        self.replan_every = replan_every
        self.gate = ReplanGate(
            to_rollout_s=env.to_rollout_s,
            to_training_s=env.to_training_s,
            min_relative_gain=min_relative_gain,
            nonblocking_join=self.elastic,
        )
        self.plan: Plan | None = None

    def _plan(self, profile: WorkloadProfile) -> Plan:
        return self._single_degree(profile) if self.homogeneous else self.env.planner.plan(profile)

    def _single_degree(self, profile: WorkloadProfile) -> Plan:
        """The best plan on one TP degree (ties to the smaller degree)."""
        planner = self.env.planner
        plans = []
        for tp in (1, 2, 4, 8):
            if tp <= self.env.cluster.gpus_per_node and self.env.cost_model.rollout.fits(tp, profile.total_lengths[-1]):
                try:
                    plans.append(planner.plan(profile, tp_degrees=(tp,)))
                except SpecError:
                    continue
        if not plans:
            raise SpecError("no homogeneous plan exists for this profile")
        return min(plans, key=lambda p: (p.makespan_s, p.rollout.instances[0].tp))

    def _routing(self) -> str:
        return "single" if self.homogeneous else self.routing

    def initial(self, profile: WorkloadProfile) -> Decision:
        self.plan = self._plan(profile)
        return Decision(
            step=0,
            allocation=_plan_allocation(self.plan, self._routing()),
            reason=f"initial plan ({self.plan.makespan_s:.0f} s predicted)",
        )

    def correction(self, kind: str) -> float:
        """Measured (less the weights' move) over predicted rollout time for plans of `kind`: the median of its
        last `replan_every` steps (1 before any)."""
        last = self.ratios[kind][-self.replan_every :]
        return float(np.median(last)) if last else 1.0

    def _scored(self, plan: Plan, profile: WorkloadProfile) -> float:
        """A plan's stage on `profile` as the engine runs it: training against the weights' move into rollout
        (once, not scaled: no plan changes it) followed by the rollout, corrected by what plans of its kind
        measured."""
        train, rollout = self.env.planner.evaluate(plan, profile)
        return max(train, self.switch_s + rollout * self.correction(plan_kind(plan)))

    def after_step(self, obs: Observation) -> Decision | None:
        if self.plan is None:
            return None
        planner = self.env.planner
        if self.measured:  # against the prediction for the work that step rolled out, which has no weights' move
            predicted = planner.evaluate(self.plan, (obs.step_profile or obs.profile)())[1]
            measured = obs.rollout_s - obs.switch_s
            if 0.0 < predicted < math.inf and measured > 0.0:
                self.ratios[plan_kind(self.plan)].append(measured / predicted)
                self.switch_s = obs.switch_s
        if (obs.step + 1) % self.replan_every:
            return None
        profile = obs.profile()
        if self.measured and not self.homogeneous:  # the optimum and the best single degree, both as measured
            candidates = [planner.plan(profile, num_gpus=self.plan.num_gpus), self._single_degree(profile)]
            score, candidate = min(((self._scored(p, profile), p) for p in candidates), key=lambda x: x[0])
            verdict = self.gate.decide(
                current=self.plan,
                candidate=candidate,
                horizon_steps=self.replan_every,
                current_makespan_s=self._scored(self.plan, profile),
                candidate_makespan_s=score,
            )
        elif not self.homogeneous:  # the planner's own replan: both plans scored by `evaluate` on the newest profile
            candidate, verdict = planner.replan(self.plan, profile, gate=self.gate, horizon_steps=self.replan_every)
        else:  # the best single degree, scored the same way as `GlobalPlanner.replan` scores (no phantom gain)
            candidate = self._plan(profile)
            verdict = self.gate.decide(
                current=self.plan,
                candidate=candidate,
                horizon_steps=self.replan_every,
                current_makespan_s=max(planner.evaluate(self.plan, profile)),
                candidate_makespan_s=max(planner.evaluate(candidate, profile)),
            )
        allocation = _plan_allocation(candidate, self._routing())
        if not verdict.apply or allocation.same_layout(_plan_allocation(self.plan, self._routing())):
            return None  # the gate said no, or the candidate is the plan already running
        self.plan = candidate
        return Decision(
            step=obs.step + 1,
            allocation=allocation,
            reason=verdict.reason,
            saving_s=verdict.saving_s,
            cost_s=verdict.cost_s,
        )


class LibraHomogeneous(Libra):
    name = "libra-homogeneous"
    elastic = False
    homogeneous = True
    measures = False


class LibraHeteroTP(Libra):
    name = "libra-hetero-tp"
    elastic = False
    routing = "overflow"
    measures = False


class LibraCMLFQ(Libra):
    name = "libra-cmlfq"
    elastic = False
    routing = "cmlfq"
    measures = False


class LibraOracle(Libra):
    """`libra-cmlfq`'s replanning with perfect routing: its planner prices each request on the bucket of its final
    length (`PlannerOptions(routing="final-length")`, the same cost model object as the env's planner) and its
    requests are routed so (`final`), so plan and run make the same assumption."""

    name = "libra-oracle"
    elastic = False
    routing = "final"
    measures = False

    def __init__(self, env: PolicyEnv, **options: Any) -> None:
        super().__init__(final_length_env(env), **options)


def final_length_env(env: PolicyEnv) -> PolicyEnv:
    """`env` with a planner of the same cluster, model, RL settings, options and cost model, but the
    `final-length` routing model."""
    base = env.planner
    planner = GlobalPlanner(
        cluster=base.cluster, model=base.model, rl=base.rl, options=attrs.evolve(base.options, routing="final-length")
    )
    planner.cost_model = base.cost_model  # one cost model: the oracle's plans are priced as the others'
    return attrs.evolve(env, planner=planner)


_REGISTRY: dict[str, type[Policy]] = {
    c.name: c
    for c in (
        Colocated,
        StaticUniform,
        Greedy,
        StaticOptimal,
        LibraHomogeneous,
        LibraHeteroTP,
        LibraCMLFQ,
        Libra,
        LibraOracle,
    )
}
# what `--policy all` (and `simulate`'s default) runs; the others only when named, so `all`'s reports, goldens and
# run time do not change when one is added
EXTRA_POLICY_NAMES: tuple[str, ...] = (LibraOracle.name,)
POLICY_NAMES: tuple[str, ...] = tuple(n for n in _REGISTRY if n not in EXTRA_POLICY_NAMES)
KNOWN_POLICY_NAMES: tuple[str, ...] = POLICY_NAMES + EXTRA_POLICY_NAMES  # every name `make_policy` accepts


def make_policy(name: str, env: PolicyEnv, **options: Any) -> Policy:
    cls = _REGISTRY.get(name)
    if cls is None:
        raise SpecError(f"unknown policy {name!r}; expected one of {', '.join(KNOWN_POLICY_NAMES)}")
    try:
        return cls(env, **options)
    except TypeError as exc:
        raise SpecError(f"policy {name!r}: {exc}") from None


def uses_shared_tree(name: str) -> bool:
    """The policy routes with C-MLFQ over buckets, so its runs need the shared prefix tree (`CausalRouting`)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise SpecError(f"unknown policy {name!r}; expected one of {', '.join(KNOWN_POLICY_NAMES)}")
    return getattr(cls, "routing", "") == "cmlfq" and not getattr(cls, "homogeneous", False)
