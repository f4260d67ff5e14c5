"""The global planner: split the GPUs between training and rollout, pick the training layout and the rollout
instance mix, minimising the iteration makespan `max(T_train, T_rollout)` of the asynchronous pipeline.

    minimise over t:  max( T_train*(t), T_rollout*(G - t) )

T_train*(t) is the best layout on at most t GPUs (`TrainingSearch.frontier`, a running minimum: spare GPUs may
idle) and T_rollout*(g) the rollout optimum with g GPUs (`RolloutTable`). Both are non-increasing, so
`feasible(T) := tmin(T) + M(T) <= G` is monotone in T, and the optimum is the smallest feasible T: one bisection
over T answers the joint search exactly (to float precision) without enumerating splits. Training times and
bucket tables are memoised per profile, so replanning with another budget costs a few milliseconds.

Every plan packs into the cluster's nodes (`libra.planning.packing`: each instance and each training TP x EP stage
group inside one node). Where some group size does not divide the node size and binds, `feasible(T)` also asks
that some training class and rollout fit the per-size node capacities (`PackedSearch`), and where the group sizes
form no divisibility chain (TP 3 or 6, an EP x TP block of 6) that they pass the exact packer (`NodeFill`); it
stays monotone, so the same bisection returns the optimum among the plans that pack. Elsewhere (8-GPU nodes with
TP 1/2/4/8, or sizes such as 2/3/6 on nodes of 6 where every multiset within the budget packs: `count_decides`)
the GPU count decides.

Ties (several plans of the least makespan T): every search returns the training layout on the fewest GPUs that
finishes within T beside a rollout within T that packs, then the fastest of those, then the first in (TP, EP, PP,
micro-batch, recompute) order; the rollout has the rest of the GPUs. The GPU-count search does this by its
construction (the fewest GPUs of the running minimum, the frontier's first layout of the least time); the packed
searches rank their training classes by the same key (`PackedSearch.preferred`).

The lower bound is the larger of two. The fluid bound `(W_train + W_rollout) / G`, with W the least GPU-seconds
of each side (training at its most efficient layout, each length group on its most efficient TP degree at full
concurrency): the makespan if both sides scaled perfectly with GPUs. The chain bound
(`RolloutTable.chain_bound_s`): the longest chains of turns alone, each at a batch of one on the fastest degree
that holds it, which no GPU count shortens (at scale the fluid bound falls toward 0 and this one sets the step).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.cost.rollout import paced_tail_of, tool_tail_of
from libra.planning.packing import PackedRollout, PackedSearch, Packing, TrainOption, node_packing
from libra.planning.replan import ReplanDecision, ReplanGate
from libra.planning.rollout_dp import ROUTINGS, BucketChoice, CountBracket, RolloutTable, bisect_min
from libra.planning.train_tree import Shape, TrainingSearch, TreeOptions
from libra.spec import (
    TP_DEGREES,
    ClusterSpec,
    InstanceGroup,
    ModelSpec,
    Plan,
    RLSettings,
    RolloutConfig,
    SpecError,
    TrainConfig,
    WorkloadProfile,
)
from libra.spec.checks import is_whole


class PlanningError(SpecError):
    """No plan exists (e.g. the model fits neither training nor any rollout instance on these GPUs)."""


def _check_option(ok, wants: str):
    """An attrs validator raising one SpecError line that names the option, what it must be and the value."""

    def check(instance: object, attribute: attrs.Attribute, value: object) -> None:
        if not ok(value):
            raise SpecError(f"PlannerOptions.{attribute.name} must be {wants}, got {value!r}")

    return check


def _tuple_of(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen(kw_only=True)
class PlannerOptions:
    """How the planner searches. Each field is checked here, so a bad value fails at construction with one
    `SpecError` naming it (whether a TP degree fits the cluster's nodes and the model's heads is checked when a
    planner plans)."""

    tp_degrees: tuple[int, ...] = attrs.field(
        default=TP_DEGREES,
        converter=_tuple_of,
        validator=_check_option(
            lambda v: isinstance(v, tuple) and all(is_whole(tp) for tp in v), "a tuple of integer TP degrees"
        ),
    )
    # length quantile groups for the rollout DP (cost grows ~ num_groups^2)
    num_groups: int = attrs.field(
        default=32, validator=_check_option(lambda v: is_whole(v) and v >= 1, "an integer >= 1")
    )
    tree: TreeOptions = attrs.field(
        factory=TreeOptions, validator=_check_option(lambda v: isinstance(v, TreeOptions), "a TreeOptions")
    )
    # give GPUs the optimum leaves unused to the slowest rollout bucket
    fill_spare_gpus: bool = attrs.field(
        default=True, validator=_check_option(lambda v: isinstance(v, bool), "True or False")
    )
    # profiles whose tables stay memoised (0: none kept between calls)
    cache_size: int = attrs.field(
        default=8, validator=_check_option(lambda v: is_whole(v) and v >= 0, "an integer >= 0")
    )
    # how requests reach buckets (`rollout_dp`): `start-small` (C-MLFQ's admission, promotion by context) or
    # `final-length` (each request only on the bucket of its final length: perfect routing)
    routing: str = attrs.field(
        default="start-small", validator=_check_option(lambda v: v in ROUTINGS, f"one of {', '.join(ROUTINGS)}")
    )
    # start-small: share of the rollout a request that ends in a later bucket spends queueing in the first
    admission_delay: float = attrs.field(
        default=0.5,
        validator=_check_option(
            lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and 0.0 <= float(v) < 1.0,
            "a number in [0, 1)",
        ),
    )


class _TrainClass:
    """The training layouts whose units are of one class of a `Packing` (`k`: those that reach the same thresholds
    of a `NodePacking`, or of one size of a `NodeFill`): their frontier, and the loads `t` GPUs of them add."""

    def __init__(self, k: int, packing: Packing, times: np.ndarray, owners: list) -> None:
        self.k, self.packing, self.times, self.owners = k, packing, times, owners
        self.runmin = np.minimum.accumulate(times)

    def gpus_within(self, limit: float) -> int | None:
        idx = int(np.searchsorted(-self.runmin, -limit, side="left"))
        return idx if idx < len(self.runmin) else None

    def loads(self, gpus: int) -> tuple[int, ...]:
        return self.packing.class_loads(self.k, gpus)

    def rank(self, gpus: int, micro_batches: tuple[int, ...]) -> tuple:
        """The tie rule's key of this class's layout on exactly `gpus` GPUs (`layout_order`)."""
        owner = self.owners[gpus]
        assert owner is not None
        return (gpus, float(self.times[gpus]), *layout_order(owner[0], micro_batches))


def layout_order(shape: Shape, micro_batches: tuple[int, ...]) -> tuple:
    """The fixed order of layouts of the tie rule: TP, EP, PP, micro-batch (in `TreeOptions.micro_batches`
    order), no recompute first; the order `TrainingSearch.shapes` enumerates, whose first layout of the least time
    owns each GPU count of a frontier."""
    return (shape.tp, shape.ep, shape.pp, micro_batches.index(shape.micro_batch), shape.recompute)


class _Tables:
    """Everything the search needs for one profile: training frontier and rollout bucket table."""

    def __init__(self, planner: GlobalPlanner, profile: WorkloadProfile, tp_degrees: tuple[int, ...]) -> None:
        cm, g = planner.cost_model, planner.cluster.num_gpus
        self.batch = planner.batch_stats(profile)
        self.search = TrainingSearch(cm, self.batch, planner.options.tree)
        times, owners = self.search.frontier_owners(g)  # layouts built on demand (`best_train_config`)
        self.train_times, self._train_owners = times, owners
        self.train_runmin = np.minimum.accumulate(times)
        self._classes: dict[Packing, list[_TrainClass]] = {}
        scaled = attrs.evolve(profile, requests_per_step=planner.rl.global_batch)
        self.groups = scaled.groups(planner.options.num_groups)
        self.rollout = RolloutTable(
            cm.rollout,
            self.groups,
            tp_degrees=tp_degrees,
            max_gpus=g,
            tool_latency_s=profile.mean_tool_time_s,
            routing=planner.options.routing,
            admission_delay=planner.options.admission_delay,
        )

    def train_classes(self, packing: Packing) -> list[_TrainClass]:
        """The training frontier split by the classes of its units (`unit_class`), memoised."""
        if packing not in self._classes:
            by_class: dict[int, tuple[int, ...]] = {}
            for size in self.search.unit_sizes():
                k = packing.unit_class(size)
                by_class[k] = (*by_class.get(k, ()), size)
            g = len(self.train_times) - 1
            self._classes[packing] = [
                _TrainClass(k, packing, *self.search.frontier_owners(g, unit)) for k, unit in sorted(by_class.items())
            ]
        return self._classes[packing]

    def train_gpus_within(self, limit: float) -> int | None:
        """Fewest GPUs whose best layout finishes within `limit`."""
        idx = int(np.searchsorted(-self.train_runmin, -limit, side="left"))
        return idx if idx < len(self.train_runmin) else None

    def best_train_config(self, gpus: int, within: _TrainClass | None = None) -> TrainConfig:
        """The best layout on at most `gpus` GPUs (the running minimum's owner), of one class if `within`."""
        times, owners = (self.train_times, self._train_owners) if within is None else (within.times, within.owners)
        t = int(np.argmin(times[: gpus + 1]))
        config = self.search.config_of(owners[t])
        assert config is not None
        return config


class GlobalPlanner:
    """Plans for one cluster, model and RL settings; `plan(profile)` per workload profile."""

    def __init__(
        self,
        *,
        cluster: ClusterSpec,
        model: ModelSpec,
        rl: RLSettings | None = None,
        coeffs: CostCoefficients | None = None,
        options: PlannerOptions | None = None,
    ) -> None:
        self.cluster, self.model = cluster, model
        self.rl = rl or RLSettings()
        self.options = options or PlannerOptions()
        self.cost_model = CostModel(cluster, model, coeffs)
        # memoised tables, oldest first: a short list searched by identity, then equality, so a cold plan never
        # hashes the profile (its per-trajectory tuples cost more to hash than the training frontier to build)
        self._cache: list[tuple[WorkloadProfile, tuple[int, ...], _Tables]] = []
        self._stats: tuple[WorkloadProfile, BatchStats] | None = None  # the last profile's, by identity

    def batch_stats(self, profile: WorkloadProfile) -> BatchStats:
        # a policy that tries many splits asks again for the same profile (a frozen value: the same answer), and
        # reading its per-trajectory tuple into an array is most of the work (1,024 GPUs: 2.4 ms a call)
        if self._stats is not None and self._stats[0] is profile:
            return self._stats[1]
        lengths = np.minimum(np.asarray(profile.total_lengths), self.rl.max_model_len)
        stats = BatchStats.from_lengths(lengths, num_sequences=self.rl.global_batch)
        self._stats = (profile, stats)
        return stats

    def tables(self, profile: WorkloadProfile, tp_degrees: tuple[int, ...] | None = None) -> _Tables:
        node = self.cluster.gpus_per_node
        tps = tuple(sorted(tp_degrees or (tp for tp in self.options.tp_degrees if tp <= node)))
        if not tps:
            raise SpecError(
                f"no rollout TP degree to plan with: the planner's options give {list(self.options.tp_degrees)} "
                f"and a node holds {node} GPUs"
            )
        bad = [tp for tp in tps if tp < 1 or tp > self.cluster.gpus_per_node]
        if bad:
            raise SpecError(f"TP degree(s) {bad} must be between 1 and the GPUs per node ({node})")
        m = self.model
        split = [tp for tp in tps if m.num_heads % tp or (m.num_kv_heads % tp and tp % m.num_kv_heads)]
        if split and (tp_degrees is not None or self.options.tp_degrees != TP_DEGREES):
            raise SpecError(
                f"rollout TP degree(s) {split} must divide the {m.num_heads} attention heads of {m.name} "
                f"(and its {m.num_kv_heads} KV heads must divide the degree or the degree them)"
            )
        tps = tuple(tp for tp in tps if tp not in split)  # defaults the model cannot use are left out
        if not tps:
            raise SpecError(f"no rollout TP degree divides the {m.num_heads} attention heads of {m.name}")
        cache = self._cache
        hit = next((k for k, (p, t, _) in enumerate(cache) if t == tps and (p is profile or p == profile)), None)
        entry = cache.pop(hit) if hit is not None else (profile, tps, _Tables(self, profile, tps))
        cache.append(entry)
        del cache[: max(0, len(cache) - self.options.cache_size)]
        return entry[2]

    # --- the search -------------------------------------------------------------------------------------------
    def plan(
        self, profile: WorkloadProfile, *, num_gpus: int | None = None, tp_degrees: tuple[int, ...] | None = None
    ) -> Plan:
        """The optimal plan for `profile` on `num_gpus` GPUs (all of the cluster by default).

        The step is sized by the planner's `rl.global_batch` (`RLSettings`: prompts x samples), not by
        `profile.requests_per_step`: the profile's trajectories are a sample of lengths, scaled to that batch. Plan
        for a step of N trajectories with `RLSettings(num_prompts=..., samples_per_prompt=...)` whose product is N.
        Times are seconds per step; `plan.rollout.num_gpus` may exceed the GPUs its instances use (a TP degree
        that does not fit the remainder leaves it idle)."""
        start = time.perf_counter()
        budget = self.cluster.num_gpus if num_gpus is None else num_gpus
        if not (is_whole(budget) and 2 <= budget <= self.cluster.num_gpus):
            raise SpecError(f"num_gpus must be between 2 and {self.cluster.num_gpus}, got {budget}")
        tab = self.tables(profile, tp_degrees)
        bracket = CountBracket()  # each probe's counts narrow the next probe's search (same answers)

        def plain(limit: float) -> bool:
            t = tab.train_gpus_within(limit)
            return t is not None and t < budget and t + tab.rollout.min_gpus(limit, bracket)[0] <= budget

        packed = self._packed_search(tab, budget)
        feasible = plain if packed is None else (lambda limit: packed.feasible(limit, bracket))
        hi = self._upper_bound(tab, budget, feasible, plain)
        lo = float(tab.train_runmin[budget - 1]) * (1.0 - 1e-12)  # no plan trains faster than on G - 1 GPUs
        if feasible(lo):
            lo = 0.0

        # with node packing a class's layout may set the step where a faster layout of another class is refused
        times = tab.train_runmin
        if packed is not None:
            times = np.concatenate([c.runmin for c in tab.train_classes(packed.rollout.packing)])

        def candidates(a: float, b: float) -> np.ndarray:
            train = times[(times > a) & (times <= b)]
            return np.unique(np.concatenate([train, tab.rollout.candidates(a, b, bracket)]))

        best = bisect_min(feasible, lo, hi, candidates=candidates)
        fits = None
        if packed is None:
            train_gpus = tab.train_gpus_within(best)
            assert train_gpus is not None
            train = tab.best_train_config(train_gpus)
            _, buckets = tab.rollout.min_gpus(best, bracket)
        else:
            classes = tab.train_classes(packed.rollout.packing)
            micro_batches = self.options.tree.micro_batches
            chosen = packed.preferred(best, lambda o: classes[o[2]].rank(o[0], micro_batches), bracket)
            assert chosen is not None
            (train_gpus, reserved, k), buckets = chosen
            train = tab.best_train_config(train_gpus, classes[k])
            fits = self._packs_beside(packed.rollout.packing, reserved)
        rollout_gpus = budget - train.num_gpus
        if self.options.fill_spare_gpus:
            buckets = self._fill_spares(tab.rollout, buckets, rollout_gpus, fits)
        t_roll = max(b.time_s for b in buckets)
        lower = float(np.min(tab.train_times[1:budget] * np.arange(1, budget))) + tab.rollout.fluid_gpu_seconds()
        fluid, chain = lower / budget, tab.rollout.chain_bound_s()
        rollout = RolloutConfig(num_gpus=rollout_gpus, time_s=t_roll, instances=tab.rollout.instance_groups(buckets))
        return Plan(
            train=train,
            rollout=rollout,
            makespan_s=max(train.time_s, t_roll),
            lower_bound_s=max(fluid, chain),
            fluid_bound_s=fluid,
            chain_bound_s=chain,
            solve_time_s=time.perf_counter() - start,
        )

    def _packing(self, tab: _Tables, budget: int, train_sizes: tuple[int, ...]) -> Packing | None:
        return node_packing(self.cluster, (*tab.rollout.tp_degrees, *train_sizes), budget)

    def _packed_search(self, tab: _Tables, budget: int) -> PackedSearch | None:
        """The search with node packing where some unit size binds (`NodePacking`) or the sizes form no chain
        (`NodeFill`), else None (the GPU count decides: every degree divides the node size, e.g. 8-GPU nodes)."""
        packing = self._packing(tab, budget, tab.search.unit_sizes())
        if packing is None:
            return None
        classes = tab.train_classes(packing)

        def options(limit: float) -> list[TrainOption]:
            found = [(c.gpus_within(limit), c) for c in classes]
            return [(t, c.loads(t), k) for k, (t, c) in enumerate(found) if t is not None]

        return PackedSearch(PackedRollout(tab.rollout, packing), budget, options)

    @staticmethod
    def _packs_beside(packing: Packing, reserved: tuple[int, ...]) -> Callable[[list[BucketChoice]], bool]:
        """Whether rollout buckets pack beside a training side with loads `reserved`."""

        def fits(buckets: list[BucketChoice]) -> bool:
            return packing.packs(((b.tp, b.count) for b in buckets), reserved)

        return fits

    def _upper_bound(self, tab: _Tables, budget: int, feasible, plain) -> float:
        finite = tab.train_runmin[np.isfinite(tab.train_runmin)]
        if finite.size == 0:
            raise PlanningError(
                f"{self.model.name} cannot be trained on {budget} {self.cluster.gpu.name} GPUs with a "
                f"global batch of {self.rl.global_batch}: no layout fits memory and divides the batch"
            )
        hi = max(float(finite.max()), 1.0)
        for _ in range(80):
            if feasible(hi):
                return hi
            hi *= 4.0
        if feasible is not plain and plain(hi):
            c = self.cluster
            raise PlanningError(
                f"no plan for {self.model.name} on {budget} GPUs packs into {c.num_nodes} nodes x "
                f"{c.gpus_per_node} GPUs: the GPU count allows plans, but their TP/EP groups need more whole-node "
                f"room than the nodes have"
            )
        longest = max(g.max_total for g in tab.groups)
        train_min = int(np.argmax(np.isfinite(tab.train_runmin)))  # fewest GPUs any training layout runs on
        rollout_min = tab.rollout.min_gpus(math.inf)[0]  # fewest GPUs that serve every request at all
        if train_min >= budget:
            raise PlanningError(
                f"no plan for {self.model.name} on {budget} GPUs: training alone needs {train_min} of them "
                f"(memory and a global batch of {self.rl.global_batch}), leaving none for rollout"
            )
        if not math.isfinite(rollout_min):
            raise PlanningError(
                f"no plan for {self.model.name} on {budget} GPUs: no rollout instance of TP "
                f"{'/'.join(map(str, tab.rollout.tp_degrees))} has a KV cache that holds {longest:.0f} tokens"
            )
        raise PlanningError(
            f"no plan for {self.model.name} on {budget} GPUs: training needs at least {train_min} and rollout "
            f"at least {rollout_min:.0f} (an instance whose KV cache holds {longest:.0f} tokens)"
        )

    @staticmethod
    def _fill_spares(
        table: RolloutTable,
        buckets: list[BucketChoice],
        gpus: int,
        fits: Callable[[list[BucketChoice]], bool] | None = None,
    ) -> list[BucketChoice]:
        """Hand unused rollout GPUs to the slowest bucket while that makes it faster (never slower) and, with
        `fits`, the instances still pack into the nodes."""
        buckets = list(buckets)
        spare = gpus - sum(b.tp * b.count for b in buckets)
        while True:
            order = sorted(range(len(buckets)), key=lambda k: -buckets[k].time_s)
            for k in order:
                b = buckets[k]
                if b.tp <= spare:
                    faster = table.time(b.start, b.stop, b.tp, b.count + 1)
                    if faster < b.time_s:
                        grown = attrs.evolve(b, count=b.count + 1, time_s=faster)
                        if fits is None or fits([*buckets[:k], grown, *buckets[k + 1 :]]):
                            buckets[k] = grown
                            spare -= b.tp
                            break
                    continue
            else:
                return buckets

    def replan(
        self, current: Plan, profile: WorkloadProfile, *, gate: ReplanGate | None = None, horizon_steps: int = 10
    ) -> tuple[Plan, ReplanDecision]:
        """Plan for the newest profile and ask the gate whether to switch. Both plans are scored the same way
        (`evaluate` on the newest profile), so identical allocations never show a phantom saving.

        The candidate is a whole new plan: its training layout may differ from `current`'s, and so may the
        training workers of its placement, which `libra.elastic.ElasticController.apply_plan` refuses
        (`CoreTopologyChange`: the core training pool is fixed): a running job replans with `replan_rollout`. A
        current plan that no longer fits the newest profile (training memory, or no instance holding the longest
        request) scores `inf`, and a candidate that fits is then applied."""
        candidate = self.plan(profile, num_gpus=current.num_gpus)
        now = max(self.evaluate(current, profile))
        new = max(self.evaluate(candidate, profile))
        decision = (gate or ReplanGate()).decide(
            current=current,
            candidate=candidate,
            horizon_steps=horizon_steps,
            current_makespan_s=now,
            candidate_makespan_s=new,
        )
        return candidate, decision

    def plan_rollout(self, current: Plan, profile: WorkloadProfile) -> Plan:
        """The best rollout side for `profile` on the rollout GPUs of `current`, its training layout kept: what a
        running job can switch to without touching its core training pool (a new training layout is refused by
        `libra.elastic.ElasticController.apply_plan`: `CoreTopologyChange`)."""
        self._check_fits(current, "plan_rollout")
        tab = self.tables(profile)
        gpus, tr = current.rollout.num_gpus, current.train
        unit = tr.tp * tr.ep  # the training side's node-resident groups, kept
        packing = self._packing(tab, tr.num_gpus + gpus, (unit,) if tr.num_gpus else ())
        packed, fits = None, None
        if packing is None:
            feasible = lambda limit: tab.rollout.min_gpus(limit)[0] <= gpus  # noqa: E731
        else:
            reserved = packing.loads([(unit, tr.num_gpus // unit)] if tr.num_gpus else [])
            kept: TrainOption = (tr.num_gpus, reserved, 0)
            packed = PackedSearch(PackedRollout(tab.rollout, packing), tr.num_gpus + gpus, lambda limit: [kept])
            feasible, fits = packed.feasible, self._packs_beside(packing, reserved)
        hi = 1.0
        for _ in range(80):
            if feasible(hi):
                break
            hi *= 4.0
        best = bisect_min(feasible, 0.0, hi, candidates=tab.rollout.candidates)
        if packed is None:
            _, buckets = tab.rollout.min_gpus(best)
        else:
            chosen = packed.choose(best)
            if chosen is None:
                c = self.cluster
                raise PlanningError(
                    f"plan_rollout: no rollout on {gpus} GPUs packs into {c.num_nodes} nodes x {c.gpus_per_node} "
                    f"GPUs beside the kept training side (TP-{tr.tp} x EP-{tr.ep} groups, {tr.num_gpus} GPUs)"
                )
            buckets = chosen[1]
        buckets = self._fill_spares(tab.rollout, buckets, gpus, fits)
        t_roll = max(b.time_s for b in buckets)
        rollout = RolloutConfig(num_gpus=gpus, time_s=t_roll, instances=tab.rollout.instance_groups(buckets))
        return attrs.evolve(current, rollout=rollout, makespan_s=max(current.train.time_s, t_roll), solve_time_s=0.0)

    def _check_fits(self, current: Plan, caller: str) -> None:
        """`current` must be a plan for this planner's cluster: a plan made for a larger one would be kept (its
        training side) and filled (its rollout GPUs) beyond the GPUs there are."""
        c = self.cluster
        if current.num_gpus > c.num_gpus:
            raise SpecError(
                f"{caller}: the current plan uses {current.num_gpus} GPUs (training {current.train.num_gpus} + "
                f"rollout {current.rollout.num_gpus}) but the planner's cluster has {c.num_gpus} "
                f"({c.num_nodes} nodes x {c.gpus_per_node} GPUs)"
            )
        if current.train.tp > c.gpus_per_node:
            raise SpecError(
                f"{caller}: the current plan trains with TP-{current.train.tp} but the planner's cluster has "
                f"{c.gpus_per_node} GPUs per node"
            )

    def replan_rollout(
        self, current: Plan, profile: WorkloadProfile, *, gate: ReplanGate | None = None, horizon_steps: int = 10
    ) -> tuple[Plan, ReplanDecision]:
        """`replan` of the rollout side alone (`plan_rollout`): the candidate and the gate's verdict, both rollout
        sides timed on the newest profile (`rollout_time`) against the training step `current` predicts (its
        layout and so its step are kept). A current instance mix that cannot hold the new lengths is replaced."""
        candidate = self.plan_rollout(current, profile)
        now = self.rollout_time(current.rollout.instances, profile)
        new = self.rollout_time(candidate.rollout.instances, profile)
        t_train = current.train.time_s
        decision = (gate or ReplanGate()).decide(
            current=current,
            candidate=candidate,
            horizon_steps=horizon_steps,
            current_makespan_s=max(now, t_train) if math.isfinite(now) else now,
            candidate_makespan_s=max(new, t_train),
        )
        if not math.isfinite(now) and math.isfinite(new):  # the current mix cannot serve the new lengths at all
            decision = attrs.evolve(decision, apply=True, reason="the current instance mix cannot hold the new lengths")
        return candidate, decision

    # --- evaluation -------------------------------------------------------------------------------------------
    def evaluate(self, plan: Plan, profile: WorkloadProfile) -> tuple[float, float]:
        """(T_train, T_rollout) of an existing plan on another workload profile (e.g. after drift)."""
        tr = plan.train
        batch = self.batch_stats(profile)
        t_train = float(
            self.cost_model.training.step_time(tr.tp, tr.pp, tr.dp, tr.ep, tr.micro_batch, tr.recompute, batch)
        )
        if not self.cost_model.training.fits(
            self.cost_model.training.memory_bytes(tr.tp, tr.pp, tr.dp, tr.ep, tr.micro_batch, tr.recompute, batch)
        ):
            t_train = math.inf
        return t_train, self.rollout_time(plan.rollout.instances, profile)

    def rollout_time(self, instances: tuple[InstanceGroup, ...], profile: WorkloadProfile) -> float:
        """Rollout time of a fixed instance mix, each request routed as `options.routing` says (the DP's model,
        applied to every request of the profile rather than to length groups)."""
        groups = sorted(instances, key=lambda g: g.max_tokens)
        limits = np.array([g.max_tokens for g in groups[:-1]] + [math.inf])
        scale = self.rl.global_batch / profile.num_samples
        total = np.asarray(profile.total_lengths, dtype=float)
        gen = np.asarray(profile.gen_tokens, dtype=float)
        turns = np.asarray(profile.turns, dtype=float) if profile.turns else np.ones(total.size)
        tool_s = np.asarray(profile.tool_s, dtype=float) if profile.tool_s else None
        ratio = gen / np.maximum(total, 1e-9)
        home = np.searchsorted(limits, total, side="left")  # the bucket of each request's final length
        flow = self.options.routing == "start-small"
        worst = 0.0
        rc = self.cost_model.rollout
        for k, group in enumerate(groups):
            lo = limits[k - 1] if flow and k > 0 else 0.0
            members = (home >= k) if flow else (home == k)  # start-small: every longer request passes through
            if not members.any():
                continue
            ending = home == k  # the tail: a request ending here lives through its whole chain of turns first
            end = np.minimum(total[members], limits[k])  # context at the end of each request's piece
            piece = ratio[members] * (end - lo)  # its decoded tokens
            if not rc.fits(group.tp, float(end.max())):
                return math.inf
            n = members.sum() * scale / group.count
            fresh = n if (k == 0 or not flow) else 0.0
            decode = float(piece.sum())
            resident = float(np.sum(piece * (end - piece / 2)) / max(decode, 1e-9))
            pace = float(rc.decode_step_time(group.tp, 1.0, resident))  # a batch of one's step: its tail's pace
            t = rc.instance_time(
                group.tp,
                num_requests=n,
                decode_tokens=decode * scale / group.count,
                prefill_tokens=float((end - piece).sum()) * scale / group.count,
                resident_context=resident,
                max_gen=float(gen[ending].max(initial=0.0)),
                max_turns=float(turns[ending].max(initial=0.0)),
                tool_latency_s=profile.mean_tool_time_s,
                new_requests=fresh,
                queued_share=self.options.admission_delay if flow and k > 0 else 0.0,
                tool_tail=None if tool_s is None else tool_tail_of(gen[ending], tool_s[ending]),
                paced_tail=None if tool_s is None else paced_tail_of(gen[ending], tool_s[ending], pace),
            )
            worst = max(worst, float(t))
        return worst
