"""The simulator: steps of work, one `PolicyRun` per policy, all advanced in lockstep over the same steps.

Pipelines (docs/paper.md: an asynchronous iteration costs max(T_rollout, T_train)):
- synchronous (colocated): stage k = rollout of step k on every GPU, then training of step k on every GPU;
  staleness 0.
- asynchronous (disaggregated, staleness bound 1): stage k = rollout of step k (with the weights of training
  k - 2, synchronised over the network at the stage start) overlapped with training of step k - 1; the next stage
  starts when both end. A final stage trains the last step.

Reconfiguration (a policy's `Decision` takes effect at a stage start; defaults from docs/paper.md):
- a rollout instance that is new (its GPUs came from training or from an instance of another degree) starts
  `to_rollout_s` (10.8 s) later; instances whose degree survives keep running;
- a new training layout (TP/PP/EP) or, without the elastic pool, any change of the replica count, blocks training
  for `snapshot_s + restore_s` (3.6 + 4.4 s);
- with the elastic pool a replica joins without blocking: the core trains while it aligns, and it counts from
  `join_s` later; a replica leaves at once.
Elastic hybrid pool, inside a stage: rollout instances left idle (nothing assigned, nothing more routed to their
bucket) while training still has more than `2 * join_s` to go join it as whole replicas; once training is done, the
hybrid replicas may start rollout instances (the borrow rule: `libra.sim.borrow`). Workers that switched pay the
way back at the next stage.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostModel
from libra.planning.cost.switch import ColocatedSwitch, colocated_switch
from libra.sim.borrow import BorrowRule, Expected, decode_rate
from libra.sim.policies import Allocation, Decision, Observation, Policy
from libra.sim.records import StageRecord
from libra.sim.rollout import DONE, Instances, RolloutRun
from libra.sim.routing import Routes
from libra.sim.states import check_dispatch, check_steal
from libra.sim.training import TrainingJob
from libra.sim.workload import StepWork
from libra.spec import SpecError, WorkloadProfile, checks


@attrs.frozen(kw_only=True)
class ReconfigCosts:
    """Seconds a worker needs to switch (docs/paper.md: ~10.8 s into rollout, 3.6 s snapshot + 4.4 s restore into
    training, channel setup tens of ms). `colocated_switch_s` is the per-switch cost of the colocated pipeline
    as one flat figure paid at each of its two switches per step; None (the default) takes the cost model's three
    sourced terms instead (sleep/wake, offload/reload, weight reshard: `libra.planning.cost.switch`)."""

    to_rollout_s: float = 10.8
    snapshot_s: float = 3.6
    restore_s: float = 4.4
    channel_setup_s: float = 0.05
    colocated_switch_s: float | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("to_rollout_s", "snapshot_s", "restore_s", "channel_setup_s"):
            checks.number("ReconfigCosts", name, getattr(self, name), 0.0)
        if self.colocated_switch_s is not None:
            checks.number("ReconfigCosts", "colocated_switch_s", self.colocated_switch_s, 0.0)

    @property
    def to_training_s(self) -> float:
        return self.snapshot_s + self.restore_s

    @property
    def join_s(self) -> float:
        return self.snapshot_s + self.restore_s + self.channel_setup_s


@attrs.frozen(kw_only=True)
class SimOptions:
    # the shortest time slice is a lower bound of the rollout from its work (`rollout_floor_s`) over this (the
    # fidelity knob)
    slices_per_rollout: int = 300
    min_slice_s: float = 0.05  # ... but never shorter than this
    max_slice_s: float = 60.0
    core_fraction: float = 0.5  # elastic pool: share of training replicas that never leave training
    min_backlog: int = 16  # elastic pool: queued requests that justify starting borrowed instances
    # what an idle instance takes from other instances' queues: "all" (new requests and stuck turns under way,
    # re-prefilled: a work-conserving router; the default), "new" (only new requests: the least-loaded dispatch of
    # RL agent loops, whose later turns stick to their server), "off"
    steal: str = "all"
    # how a step's requests are first spread over a bucket's instances: "blocks" (contiguous: the samples of a
    # prompt together; the default) or "interleaved" (dealt out in turn, like a least-loaded dispatcher)
    dispatch: str = "blocks"

    def __attrs_post_init__(self) -> None:
        checks.whole("SimOptions", "slices_per_rollout", self.slices_per_rollout, 1)
        checks.number("SimOptions", "min_slice_s", self.min_slice_s, 0.0, above=True)
        checks.number("SimOptions", "max_slice_s", self.max_slice_s, 0.0, above=True)
        if self.max_slice_s < self.min_slice_s:
            raise SpecError(
                f"SimOptions.max_slice_s must be >= min_slice_s ({self.min_slice_s!r}), got {self.max_slice_s!r}"
            )
        checks.number("SimOptions", "core_fraction", self.core_fraction, 0.0, high=1.0)
        checks.whole("SimOptions", "min_backlog", self.min_backlog, 0)
        check_steal(self.steal)
        check_dispatch(self.dispatch)


def batch_stats(work: StepWork, max_len: int) -> BatchStats:
    """The training batch of a step: the trajectories it rolled out, however many (a resampled trace's steps vary;
    a generator's all hold the global batch), cut at `max_len`."""
    return BatchStats.from_lengths(np.minimum(work.total_tokens, max_len), num_sequences=work.num_requests)


def rollout_floor_s(cm: CostModel, work: StepWork, inst: Instances) -> float:
    """A lower bound of a step's rollout on `inst` from the step's work alone: the larger of its longest chain of
    turns (decode at batch one on the widest instance at half the final context, plus its tool calls) and its
    decode tokens over the instances' rate at their largest batch (at the mean half context). It sets the time
    slice: a slice from the last rollout's length would let one stretched rollout coarsen the next."""
    rc = cm.rollout
    total = work.total_tokens.astype(float)
    tp_max = int(inst.tp.max()) if len(inst) else 1
    step1 = rc.decode_step_time(tp_max, np.ones_like(total), total / 2.0)
    chain = float(np.max(work.gen_tokens * step1 + work.tool_seconds))
    rate = decode_rate(cm, inst.tp, float(total.mean()) / 2.0)
    return max(chain, float(work.gen_tokens.sum()) / rate if rate > 0 else 0.0)


def rollout_slice_s(cm: CostModel, work: StepWork, inst: Instances, options: SimOptions) -> float:
    """The timed rollout's time slice for a step on `inst`: its rollout floor from the work alone over
    `options.slices_per_rollout`, never under `options.min_slice_s` (`RolloutRun` caps it at `max_slice_s`)."""
    return max(options.min_slice_s, rollout_floor_s(cm, work, inst) / options.slices_per_rollout)


def weight_sync_s(cm: CostModel) -> float:
    """Broadcast of the new weights from training to rollout over the network (asynchronous pipeline)."""
    bw = cm.cluster.gpu.network_bandwidth_gbs * 1e9 * cm.coeffs.link_efficiency
    return cm.model.weight_bytes / bw


class PolicyRun:
    """One policy's run: its allocation, the time, and a record per stage."""

    def __init__(
        self,
        policy: Policy,
        cm: CostModel,
        *,
        global_batch: int,
        max_len: int,
        costs: ReconfigCosts,
        options: SimOptions,
    ) -> None:
        self.policy, self.cm = policy, cm
        self.global_batch, self.max_len = global_batch, max_len
        self.costs, self.options = costs, options
        self.borrow_rule = BorrowRule(
            core_fraction=options.core_fraction, min_backlog=options.min_backlog, to_rollout_s=costs.to_rollout_s
        )
        self.alloc: Allocation | None = None
        self.pending: Decision | None = None
        self.decisions: list[dict[str, Any]] = []
        self.records: list[StageRecord] = []
        self.clock = 0.0
        self.prev_batch: BatchStats | None = None
        self.prev_expected: Expected | None = None  # the last rolled-out step's mean trajectory (`queue_done_at`)
        self.rejoin = 0  # hybrid replicas that served rollout last stage and must align again
        self.restart_gpus = 0  # rollout GPUs that trained last stage and must start their engine again
        self._delays = (0.0, 0.0, 0)  # (rollout restart s, training block s, joining replicas) of this stage
        self._new_instances: Counter[int] = Counter()
        # (GPUs, since when on the stage's clock) lent to training, and borrowed from training, this stage
        self._lent_log: list[tuple[int, float]] = []
        self._borrow_log: list[tuple[int, float]] = []

    @property
    def num_gpus(self) -> int:
        return self.cm.cluster.num_gpus

    def decide(self, decision: Decision) -> None:
        decision.allocation.check(self.cm.cluster, time_shared=self.policy.synchronous)
        self.pending = decision

    # --- stage start: apply the pending decision ----------------------------------------------------------------
    def begin_stage(self) -> Allocation:
        d, old = self.pending, self.alloc
        self.pending = None
        block, joining = 0.0, 0
        new: Counter[int] = Counter()
        if d is not None:
            self.decisions.append(
                {
                    "step": d.step,
                    "reason": d.reason,
                    "saving_s": d.saving_s,
                    "cost_s": d.cost_s,
                    "allocation": d.allocation.to_dict(),
                }
            )
            new_alloc = d.allocation
            if old is None:
                pass
            else:
                before: Counter[int] = Counter()
                for g in old.rollout:
                    before[g.tp] += g.count
                after: Counter[int] = Counter()
                for g in new_alloc.rollout:
                    after[g.tp] += g.count
                new = Counter({tp: max(0, after[tp] - before[tp]) for tp in after})
                ot, nt = old.train, new_alloc.train
                if (ot.tp, ot.pp, ot.ep) != (nt.tp, nt.pp, nt.ep):
                    block = self.costs.to_training_s
                elif nt.dp != ot.dp:
                    if self.policy.elastic and nt.dp > ot.dp:
                        joining = nt.dp - ot.dp
                    elif not self.policy.elastic:
                        block = self.costs.to_training_s
            self.alloc = new_alloc
        self._new_instances = new
        self._delays = (self.costs.to_rollout_s if sum(new.values()) else 0.0, block, joining)
        assert self.alloc is not None
        return self.alloc

    def _instances(self) -> Instances:
        """The rollout instances of the stage, each ready when its engine has started (the stage's clock: 0 at
        its start)."""
        assert self.alloc is not None
        tp, bucket, ready = [], [], []
        fresh = Counter(self._new_instances)
        restart = self.restart_gpus
        for b, g in enumerate(self.alloc.rollout):
            for _ in range(g.count):
                delay = 0.0
                if fresh[g.tp] > 0:
                    fresh[g.tp] -= 1
                    delay = self.costs.to_rollout_s
                elif restart > 0:
                    restart -= g.tp
                    delay = self.costs.to_rollout_s
                tp.append(g.tp)
                bucket.append(b)
                ready.append(delay)
        self.restart_gpus = 0
        return Instances(tp, bucket, ready)

    # --- one stage ----------------------------------------------------------------------------------------------
    def stage(self, work: StepWork | None, routes: Routes | None) -> StageRecord:
        """Run the next stage: rollout of `work` (None for the final, training-only stage)."""
        if self.policy.synchronous:
            assert work is not None and routes is not None
            return self._sync_stage(work, routes)
        return self._async_stage(work, routes)

    def _rollout(
        self, work: StepWork, routes: Routes, start: float, sync_s: float, kv_memory: float | None = None
    ) -> RolloutRun:
        """The stage's rollout from `start` (the run's clock), on its own clock, which is the stage's: its
        instances serve from `sync_s` on (or later, for one whose engine starts)."""
        inst = self._instances()
        inst.ready_at = np.maximum(inst.ready_at, sync_s)
        slice_s = rollout_slice_s(self.cm, work, inst, self.options)
        return RolloutRun(
            self.cm,
            work,
            routes,
            inst,
            start=start,
            min_slice_s=slice_s,
            max_slice_s=self.options.max_slice_s,
            steal=self.options.steal,
            dispatch=self.options.dispatch,
            kv_memory=kv_memory,
        )

    def colocated_switch(self) -> ColocatedSwitch:
        """What the synchronous pipeline pays at its two switches per step: `ReconfigCosts.colocated_switch_s` flat
        when set, else the cost model's three terms for the current allocation (libra/planning/cost/switch.py)."""
        assert self.alloc is not None
        if self.costs.colocated_switch_s is not None:
            return ColocatedSwitch.fixed(self.costs.colocated_switch_s)
        return colocated_switch(
            self.cm.coeffs,
            self.cm.model,
            self.cm.cluster.gpu,
            rollout_tp=max(g.tp for g in self.alloc.rollout),
            train_gpus=self.alloc.train.num_gpus,
        )

    # A stage runs on its own clock, 0 at its start (the rollout's too): only its record's `start` and `end` are
    # on the run's, so a stage gives the same times at whatever point of the run it starts (`RolloutRun`).
    def _sync_stage(self, work: StepWork, routes: Routes) -> StageRecord:
        assert self.alloc is not None
        t0, sw = self.clock, self.colocated_switch()
        roll = self._rollout(work, routes, t0, sw.to_rollout_s, kv_memory=self.cm.coeffs.colocated_kv_fraction)
        roll.run_to_end()
        b = roll.elapsed_s
        batch = batch_stats(work, self.max_len)
        job = TrainingJob(self.cm, self.alloc.train, batch, start=b + sw.to_training_s, replicas=self.alloc.train.dp)
        end = job.run_to_end()
        rec = self._record(
            work, roll, job, t0, end, b, end - b, staleness=0, lent=0.0, borrowed=0.0, switch=sw.per_step_s
        )
        self.clock = t0 + end
        return rec

    def _async_stage(self, work: StepWork | None, routes: Routes | None) -> StageRecord:
        assert self.alloc is not None
        t0 = self.clock
        restart_s, block, joining = self._delays
        cfg = self.alloc.train
        job = None
        if self.prev_batch is not None:
            rejoin = min(self.rejoin, cfg.dp - 1)
            start_replicas = cfg.dp - joining - rejoin
            if start_replicas < 1:  # nothing of the old core is left: this is a rebuild
                start_replicas, block, joining, rejoin = cfg.dp, max(block, self.costs.to_training_s), 0, 0
            job = TrainingJob(self.cm, cfg, self.prev_batch, start=block, replicas=start_replicas)
            job.clock = job.start
            if joining + rejoin:
                job.join(block + self.costs.join_s, joining + rejoin)
        self.rejoin = 0
        roll = None
        end_roll = switch = 0.0
        if work is not None and routes is not None:
            switch = weight_sync_s(self.cm)  # the broadcast before the rollout (the stage's `switch_s`)
            roll = self._rollout(work, routes, t0, switch)
            # the first step has no finished step before it: its own means stand in for the history a run starts
            # with, as the policies' first plan reads the first step's profile (libra.sim.simulator)
            expected = self.prev_expected or Expected.of(work)
            t = 0.0
            borrowed_once = False
            while not roll.done:
                dt = roll.next_event(t) - t
                roll.advance(t, dt)
                t += dt
                if job is not None:
                    job.advance_to(t)
                if self.policy.elastic:
                    self._lend(roll, job, t)
                    if not borrowed_once:
                        borrowed_once = self._borrow(roll, job, t, expected, switch) > 0
            end_roll = roll.elapsed_s
        end = end_roll
        train_s = 0.0
        if job is not None:
            train_s = job.run_to_end()
            end = max(end, train_s)
        lent_s = float(sum(g * (end - at) for g, at in self._lent_log))
        borrowed_s = float(sum(g * (end - at) for g, at in self._borrow_log))
        self._lent_log, self._borrow_log = [], []
        rec = self._record(
            work,
            roll,
            job,
            t0,
            end,
            end_roll,
            train_s,
            staleness=1,
            lent=lent_s,
            borrowed=borrowed_s,
            reconfig=max(restart_s, block),
            switch=switch,
        )
        if work is not None:
            self.prev_batch = batch_stats(work, self.max_len)
            self.prev_expected = Expected.of(work)
        self.clock = t0 + end
        return rec

    # --- the elastic hybrid pool --------------------------------------------------------------------------------
    def _lend(self, roll: RolloutRun, job: TrainingJob | None, t: float) -> float:
        """Idle rollout instances join training as whole replicas while training has long enough to go."""
        if job is None or job.end is not None or job.remaining_s() <= 2 * self.costs.join_s:
            return 0.0
        idle = roll.idle_instances()
        if idle.size == 0:
            return 0.0
        size = job.replica_gpus
        gpus = roll.inst.tp[idle]
        usable = (int(gpus.sum()) // size) * size
        if usable == 0:
            return 0.0
        take = idle[np.cumsum(gpus) <= usable]
        taken = int(roll.inst.tp[take].sum())
        replicas = taken // size
        if replicas == 0:
            return 0.0
        roll.lend(take)
        job.join(t + self.costs.join_s, replicas)
        self._lent_log.append((taken, t))
        self.restart_gpus += taken
        return float(taken)

    def _borrow(self, roll: RolloutRun, job: TrainingJob | None, t: float, expected: Expected, sync_s: float) -> float:
        """When training is done, carry out the borrow rule (`libra.sim.borrow`); `sync_s`: the broadcast's end."""
        if job is not None and (job.end is None or job.end > t):
            return 0.0
        assert self.alloc is not None
        b = self.borrow_rule.decide(self.cm, roll, self.alloc, t=t, expected=expected, weights_at=sync_s)
        if b is None:
            return 0.0
        roll.inst.add(b.tp, b.bucket, b.ready_at, b.count)  # (the stage's clock is the rollout's)
        roll.rebalance(b.bucket)
        self.rejoin = b.hybrid
        self._borrow_log.append((b.gpus, t))
        return float(b.gpus)

    # --- records ------------------------------------------------------------------------------------------------
    def _record(
        self,
        work: StepWork | None,
        roll: RolloutRun | None,
        job: TrainingJob | None,
        t0: float,
        span: float,
        rollout_s: float,
        train_s: float,
        *,
        staleness: int,
        lent: float,
        borrowed: float,
        reconfig: float = 0.0,
        switch: float = 0.0,
    ) -> StageRecord:
        """The stage from `t0` (the run's clock), `span` seconds long."""
        assert self.alloc is not None
        busy = (roll.busy_gpu_s if roll is not None else 0.0) + (job.busy_gpu_s if job is not None else 0.0)
        if roll is not None:
            assert (roll.state == DONE).all()
        rec = StageRecord(
            step=len(self.records),
            start=t0,
            end=t0 + span,
            rollout_s=rollout_s,
            train_s=train_s,
            train_gpus=self.alloc.train.num_gpus,
            rollout_gpus=self.alloc.rollout_gpus,
            lent_gpu_s=lent,
            borrowed_gpu_s=borrowed,
            busy_gpu_s=busy,
            available_gpu_s=self.num_gpus * span,
            tokens=int(work.total_tokens.sum()) if work is not None else 0,
            gen_tokens=int(work.gen_tokens.sum()) if work is not None else 0,
            trajectories=work.num_requests if work is not None else 0,
            migrations=roll.migrations if roll is not None else 0,
            migrated_tokens=roll.migrated_tokens if roll is not None else 0,
            rebalanced_tokens=roll.rebalanced_tokens if roll is not None else 0,
            reconfiguration_s=reconfig,
            staleness=staleness,
            trained=job is not None,
            decoded_tokens=roll.decoded if roll is not None else 0.0,
            decode_capacity_tokens=roll.capacity_tokens if roll is not None else 0.0,
            switch_s=switch,
        )
        self.records.append(rec)
        return rec

    def observation(self, profile_fn, step_profile_fn=None) -> Observation:
        r = self.records[-1]
        # the part of the rollout spent moving the weights into it: the whole of an asynchronous stage's `switch_s`
        # (the broadcast before its rollout), colocated's switch into rollout (its way back is in `train_s`)
        switch = self.colocated_switch().to_rollout_s if self.policy.synchronous else r.switch_s
        return Observation(
            step=r.step,
            rollout_s=r.rollout_s,
            train_s=r.train_s,
            profile=profile_fn,
            step_profile=step_profile_fn,
            switch_s=switch,
        )


def profile_of(works: list[StepWork], name: str, global_batch: int) -> WorkloadProfile:
    """The planner's view of recently finished steps: per trajectory (total, decoded, turns)."""
    total = np.concatenate([w.total_tokens for w in works]).astype(float)
    gen = np.concatenate([w.gen_tokens for w in works]).astype(float)
    turns = np.concatenate([w.num_turns for w in works]).astype(float)
    lat = np.concatenate([w.latency[w.latency > 0] for w in works])
    tool_s = np.concatenate([w.tool_seconds for w in works])  # each trajectory's seconds in tool calls
    order = np.lexsort((turns, gen, total))
    return WorkloadProfile(
        name=name,
        total_lengths=tuple(total[order].tolist()),
        gen_tokens=tuple(gen[order].tolist()),
        turns=tuple(turns[order].tolist()),
        requests_per_step=global_batch,
        mean_tool_time_s=float(lat.mean()) if lat.size else 0.0,
        tool_s=tuple(tool_s[order].tolist()),
    )
