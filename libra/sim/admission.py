"""Admission of the timed rollout: which waiting requests start decoding at a slice boundary, and from when.

A mixin of `libra.sim.rollout.RolloutRun`, whose state it reads and writes (requests' state, instance, context,
readiness; instances' debt): first-come-first-served per instance while the KV cache has room, turns under way
before new requests; slots freed inside the last slice refilled as of when they came free (`_credit`); and
work-conserving admission, where idle instances take requests queued elsewhere (`_steal`, `steal` modes in
`libra.sim.states`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libra.sim import native
from libra.sim.slices import _grouped
from libra.sim.states import RUN, WAIT

if TYPE_CHECKING:
    from libra.planning.cost import CostCoefficients, RolloutCost
    from libra.sim.rollout import Instances


class Admission:
    # The state of `RolloutRun` this mixin reads and writes (declared here for the type checker; set there).
    inst: Instances
    rc: RolloutCost
    c: CostCoefficients
    steal: str
    where: np.ndarray
    ctx: np.ndarray
    fresh: np.ndarray
    ready: np.ndarray
    pending: np.ndarray
    lag: np.ndarray
    stolen: np.ndarray
    debt: np.ndarray
    rebalanced: int
    rebalanced_tokens: int
    _freed: tuple[np.ndarray, np.ndarray]
    _refilled: np.ndarray

    if TYPE_CHECKING:

        def _in_state(self, state: int, *, equal: bool = True) -> np.ndarray: ...
        def _set_state(self, reqs: np.ndarray, state: int) -> None: ...
        def _degrees(self) -> tuple[int, ...]: ...
        def _cap_k(self) -> np.ndarray: ...
        def _prefill_s(self, reqs: np.ndarray, k: np.ndarray) -> np.ndarray: ...
        def _kernel_table(self) -> tuple | None: ...

    def _admit(self, t: float) -> None:
        """Admit what fits; then, with work-conserving admission, idle instances take requests that still queue
        elsewhere (`_steal`) and admit them in the same slice."""
        table = self._kernel_table()
        if table is not None:  # in C (libra.sim.native): the same state after
            native.admit_slice(self, t, table)  # type: ignore[arg-type]
            return
        inst = self.inst
        if self._in_state(WAIT).size == 0:  # nothing to admit
            self._refilled = np.zeros(len(inst), np.int64)
            self._freed = (np.zeros(0, np.int64), np.zeros(0))
            return
        running = self._in_state(RUN)
        run_k = np.bincount(self.where[running], minlength=len(inst))
        used_k = np.bincount(self.where[running], weights=self.ctx[running], minlength=len(inst)).astype(float)
        self._refilled = np.zeros(len(inst), np.int64)
        fk, ft = self._freed
        if fk.size:  # by instance, earliest first, once for both passes (`_credit` reads it that way)
            order = np.lexsort((ft, fk))
            self._freed = (fk[order], ft[order])
        go = self._admit_queued(t, run_k, used_k, steal=False)
        if self.steal != "off" and go is not None and self._in_state(WAIT).size:
            run_k += np.bincount(self.where[go], minlength=len(inst))
            used_k += np.bincount(self.where[go], weights=self.ctx[go], minlength=len(inst))
            self._admit_queued(t, run_k, used_k, steal=True)
        self._freed = (np.zeros(0, np.int64), np.zeros(0))

    def _admit_queued(self, t: float, run_k: np.ndarray, used_k: np.ndarray, *, steal: bool) -> np.ndarray | None:
        """One admission pass given the running count and context per instance; returns the admitted requests
        (None when no instance is open)."""
        inst = self.inst
        k_all = len(inst)
        mean_k = used_k / np.maximum(run_k, 1)
        room = self._cap_k() - used_k - self.c.kv_headroom_seqs * mean_k
        seats = self.c.max_num_seqs - run_k
        open_k = inst.active & (inst.ready_at <= t) & (seats > 0) & ((room > 0) | (run_k == 0))
        if not open_k.any():
            return None
        waiting = self._in_state(WAIT)
        if steal and not self._steal(t, waiting, open_k, room, seats):
            return None
        cand = waiting[open_k[self.where[waiting]]]
        if cand.size == 0:
            return cand
        k = self.where[cand]
        # per instance: trajectories already under way first (a turn back from its tool, or migrated in), then new
        # ones; first come, first served inside each class
        order = np.lexsort((self.ready[cand], self.fresh[cand], k))
        cand, k, rank, starts, group = _grouped(cand, k, order)
        need = self.ctx[cand]
        cs = need.cumsum()
        within = cs - (cs - need)[starts][group]
        # an idle instance keeps headroom in units of its first request's context
        k_first = k[starts]
        idle_first = run_k[k_first] == 0
        room[k_first[idle_first]] -= self.c.kv_headroom_seqs * need[starts][idle_first]
        ok = ((within <= room[k]) & (rank < seats[k])) | ((rank == 0) & (run_k[k] == 0))
        go = cand[ok]
        if go.size == 0:
            return go
        gk = k[ok]
        secs = np.where(self.fresh[go], self.c.per_request_overhead_s, 0.0) + self._prefill_s(go, gk)
        self.debt += np.bincount(gk, weights=secs, minlength=k_all)
        self.lag[go] = np.maximum(0.0, self.ready[go] - t) - self._credit(t, go, gk, rank[ok])
        self.pending[go] = 0.0
        self.fresh[go] = False
        self._set_state(go, RUN)
        return go

    def _credit(self, t: float, go: np.ndarray, gk: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Seconds before `t` that admitted requests could have started decoding. Admission happens at slice
        boundaries, but a slot that came free inside the last slice would have been refilled at once: the j-th
        request admitted to an instance at this boundary takes the j-th slot freed there (earliest first), from
        when both the slot was free and the request was ready. Requests still on their way (a tool returning
        inside this slice) get none."""
        fk, ft = self._freed  # sorted by `_admit`
        credit = np.zeros(go.size)
        if fk.size == 0:
            return credit
        first = np.searchsorted(fk, gk, side="left")
        count = np.searchsorted(fk, gk, side="right") - first
        slot = rank + self._refilled[gk]
        has = slot < count
        since = np.maximum(ft[np.where(has, first + slot, 0)], self.ready[go])
        credit[has] = np.maximum(0.0, t - since[has])
        self._refilled += np.bincount(gk, minlength=self._refilled.size)
        return credit

    def _steal(self, t: float, waiting: np.ndarray, open_k: np.ndarray, room: np.ndarray, seats: np.ndarray) -> bool:
        """Work-conserving admission: an instance with room and nothing queued takes requests still queued (after
        this slice's admission) on a started instance of its bucket or a smaller one, as many as its free KV holds.
        An instance still starting keeps its queue: it will serve it soon, and taking it would crowd the takers.
        New requests (never admitted) go first, newest first: early in a step the larger buckets have nothing to do
        yet and would idle while the smallest bucket's queue delays the longest requests. That much (`steal="new"`)
        is what the agent loops of RL frameworks do: a trajectory's first request goes to the least-loaded server,
        and its later turns stay there for its prefix cache, even when its KV cache is full and another server
        idles. By default (`steal="all"`, a work-conserving router) turns under way whose instance's KV cache is
        full move too, oldest first, once a turn has waited as long as re-prefilling its context on the taker would
        take (rent or buy: never more than twice the best choice in hindsight); the taker re-prefills the whole
        context (the prefix cache stays behind), counted in `rebalanced_tokens`. A request moved up a bucket this
        way ignores routed moves to buckets its instance already covers. The default is the one that favours
        `colocated` (docs/sim.md, "What-if: dispatch as RL agent loops do")."""
        inst = self.inst
        queued = np.bincount(self.where[waiting], minlength=len(inst))
        thieves = np.flatnonzero(open_k & (queued == 0))
        if thieves.size == 0:
            return False
        fresh = self.fresh[waiting]
        # new requests newest first, then (steal="all") requests under way oldest first
        order = np.flatnonzero(fresh)[::-1]
        if self.steal == "all":
            under_way = np.flatnonzero(~fresh)
            order = np.concatenate([order, under_way[np.argsort(self.ready[waiting[under_way]], kind="stable")]])
        pool_all = waiting[order]
        pool_all = pool_all[inst.ready_at[self.where[pool_all]] <= t]  # an instance still starting keeps its queue
        # per candidate, read once: nothing the loop changes (it moves only requests it takes, which leave the pool)
        where_pool, ctx_pool = self.where[pool_all], self.ctx[pool_all]
        home = inst.bucket[where_pool]
        stuck = np.flatnonzero(~self.fresh[pool_all])  # turns under way
        stuck_wait = t - self.ready[pool_all[stuck]]
        ripe_by_tp: dict[int, np.ndarray] = {}
        taken = np.zeros(pool_all.size, bool)
        left = pool_all.size
        # Thieves of one bucket and degree see the same candidates, less those taken before them, which are the
        # first of them: their candidates are listed once and each takes from the front (`eligible[at:]`). No
        # candidate sits on a thief (a thief has nothing queued), so none needs excluding by instance.
        key, eligible, at = None, pool_all[:0], 0
        for k in thieves[np.argsort(inst.bucket[thieves], kind="stable")]:  # the smallest bucket first
            if left == 0:
                break
            tp, bucket = int(inst.tp[k]), int(inst.bucket[k])
            if (bucket, tp) != key:
                key = (bucket, tp)
                ripe = ripe_by_tp.get(tp)
                if ripe is None:  # rent or buy: move a stuck turn only once its wait has cost as much as the move
                    ripe = ripe_by_tp[tp] = np.ones(pool_all.size, bool)
                    ctx = ctx_pool[stuck]
                    ripe[stuck] = stuck_wait >= self.rc.prefill_time(tp, ctx, ctx / 2.0)
                eligible, at = (~taken & (home <= bucket) & ripe).nonzero()[0], 0
            pool = eligible[at:]
            if pool.size == 0:
                continue
            ctx = ctx_pool[pool]
            free = room[k] - self.c.kv_headroom_seqs * float(ctx.mean())  # the headroom admission keeps
            most = int(seats[k])  # no more than its free seats: the running sum beyond them is not needed
            n = min(int(ctx[:most].cumsum().searchsorted(free, side="right")), most)
            chosen = pool[: max(n, 1)]
            at += chosen.size
            taken[chosen] = True
            left -= chosen.size
            reqs = pool_all[chosen]
            under_way = reqs[~self.fresh[reqs]]
            self.pending[under_way] = self.ctx[under_way]  # re-prefill the whole context on the new instance
            self.rebalanced += int(under_way.size)
            self.rebalanced_tokens += int(self.ctx[under_way].sum())
            self.stolen[reqs] |= home[chosen] < inst.bucket[k]
            self.where[reqs] = k
        return bool(taken.any())

    def _note_freed(self, reqs: np.ndarray, at: np.ndarray) -> None:
        fk, ft = self._freed
        self._freed = (np.concatenate([fk, self.where[reqs]]), np.concatenate([ft, at]))
