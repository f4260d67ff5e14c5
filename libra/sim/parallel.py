"""Independent policies in worker processes: the same numbers as one process, in less wall time.

Policies never share state that depends on another policy: every run reads the same steps of work, and the C-MLFQ
prefix tree learns each step's trajectories whatever the policies do. So a group of policies simulated alone gives
exactly the records it gives among all the others, and `simulate(..., workers=N)` runs groups of policies in N
forked processes and merges their results in the order asked. The policies that use the shared prefix tree stay in
one group, so the tree is updated (and each step's C-MLFQ replay done) in one process only; each worker builds the
step's work itself (sending 8,192 trajectories through a pipe costs about as much as generating them).

Forked, not spawned: the scenario (its work source may hold a closure over a trace) is inherited, not pickled.
Where `fork` is not available the caller runs serially. A worker asks numpy for small pages (`small_pages`), runs
without the cyclic collector's automatic passes (`no_cycle_collection`) and freezes what is alive at each step end
(`freeze_long_lived`); the caller's process keeps its own settings.
"""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import queue as queue_module
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from libra.sim.policies import uses_shared_tree
from libra.spec import SpecError

# Relative CPU cost of the work a group carries, for balancing groups: a policy's simulation, in units of the mean
# policy, and the prefix tree's step-end work in the group that holds it (the C-MLFQ replay of each step for each
# bucket set, the tree's update and the step's `Trajectory` values, which only the tree reads). Measured
# 2026-12-05 17:05-17:20 UTC (after the slice kernels' gathers and the workers' collector change), CPU seconds over
# the default scenario's 100 steps (48 GPUs, r2e-gym, 8,192 requests a step), each policy alone in a worker process
# (`run_groups`, two rounds, the mean), less the 2.67 s every run pays (building the 100 steps): colocated 12.28,
# static-uniform 8.49, greedy 10.15, static-optimal 10.21, libra-homogeneous 10.06, libra-hetero-tp 13.10;
# libra-cmlfq 15.34 and libra 10.64 (each: the pair together less the other alone), the tree 13.46 (each alone, added,
# less the pair, less the steps); mean policy 11.28. A policy's time moved by up to 0.9 s between the two rounds.
# At 1,024 GPUs (65,536 requests a step, 3 steps) the policies are closer (0.8-1.0 s each) and the tree is about one.
POLICY_COST = {
    "libra": 0.94,
    "libra-hetero-tp": 1.16,
    "libra-cmlfq": 1.36,
    "colocated": 1.09,
    "greedy": 0.90,
    "static-optimal": 0.91,
    "libra-homogeneous": 0.89,
    "static-uniform": 0.75,
}
TREE_COST = 1.19
POLL_S = 1.0  # how often the parent checks, while no worker reports, that they are all still alive


def _cost(policy: str) -> float:
    return POLICY_COST.get(policy, 1.0)


EXACT_SPLITS = 200_000  # assignments `policy_groups` tries one by one before it falls back to costliest-first


def policy_groups(policies: Sequence[str], workers: int) -> list[list[str]]:
    """Split `policies` into at most `workers` non-empty groups of balanced cost; the policies that use the shared
    prefix tree go together, and their group also carries the tree's work (`TREE_COST`). The split with the least
    cost of its costliest group, of every way to place the other policies (groups that are still empty are alike:
    one is tried for each); where there are more than `EXACT_SPLITS` ways, the costliest first, each to the cheapest
    group. Each group keeps the order of `policies`. Deterministic: ties go to the split found first."""
    if workers < 1:
        raise SpecError(f"workers must be >= 1, got {workers}")
    tree = [p for p in policies if uses_shared_tree(p)]
    rest = [p for p in policies if not uses_shared_tree(p)]
    groups: list[list[str]] = [tree] if tree else []
    cost: list[float] = [sum(_cost(p) for p in tree) + TREE_COST] if tree else []
    if workers ** len(rest) <= EXACT_SPLITS:
        _best_split(rest, workers, groups, cost)
    else:
        _costliest_first(rest, workers, groups, cost)
    rank = {p: i for i, p in enumerate(policies)}
    return [sorted(g, key=rank.__getitem__) for g in groups if g]


def _costliest_first(rest: list[str], workers: int, groups: list[list[str]], cost: list[float]) -> None:
    for p in sorted(rest, key=lambda q: -_cost(q)):  # stable: equal costs keep their order
        if len(groups) < workers:
            groups.append([p])
            cost.append(_cost(p))
            continue
        i = min(range(len(groups)), key=lambda j: (cost[j], j))
        groups[i].append(p)
        cost[i] += _cost(p)


def _best_split(rest: list[str], workers: int, groups: list[list[str]], cost: list[float]) -> None:
    """Place `rest` into `groups` (extended to at most `workers`) so that the costliest group costs least: a depth
    first search over each policy's group, a new group tried only once per placement."""
    best_max, best_where = math.inf, tuple[int, ...]()
    loads = cost + [0.0] * (workers - len(cost))
    where: list[int] = []

    def place(i: int, used: int) -> None:
        nonlocal best_max, best_where
        if max(loads) >= best_max:  # (costs only grow: no better split below)
            return
        if i == len(rest):
            best_max, best_where = max(loads), tuple(where)
            return
        for g in range(min(used + 1, workers)):  # the groups in use, and one empty one
            loads[g] += _cost(rest[i])
            where.append(g)
            place(i + 1, max(used, g + 1))
            where.pop()
            loads[g] -= _cost(rest[i])

    place(0, len(cost))
    groups.extend([] for _ in range(max(best_where, default=-1) + 1 - len(groups)))
    cost.extend(0.0 for _ in range(len(groups) - len(cost)))
    for p, g in zip(rest, best_where, strict=True):
        groups[g].append(p)
        cost[g] += _cost(p)


def small_pages() -> bool:
    """Stop numpy asking the kernel for transparent huge pages for its large arrays (it does by default on Linux).
    A simulation makes and frees tens of MB of arrays a step; with huge pages every first touch of a new one made
    the kernel zero (and first compact) 2 MB pages: 0.5-0.9 s of system time per worker over three 1,024-GPU
    steps, against 0.2 s with small pages (`getrusage`, 2026-12-04). Called in the workers, whose processes the
    simulator owns; False where this numpy has no such switch."""
    switch = getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)
    if switch is None:
        return False
    switch(False)
    return True


def freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic collector's reach (`gc.freeze`), at a step's end in a worker
    process the simulator owns. What lives then lives long: the C-MLFQ prefix tree (160,000 nodes by step 80 of the
    default scenario, each a few containers) and the policies' state; left in the collector's older generations
    they were traversed again at every collection of those generations: 7.3 s of the tree worker's 84 s of CPU over
    the 100 default steps, 1.2 s with a freeze after each step (`gc.callbacks`, 2026-12-04). The tree and the steps'
    values hold no reference cycles, so what they drop is still freed, by reference counting."""
    gc.freeze()


def no_cycle_collection() -> None:
    """Turn the cyclic collector's automatic passes off in a worker process the simulator owns (the parent's
    setting is its own). What the simulation makes is acyclic: all eight policies over 10 default steps leave 125
    objects in reference cycles (`gc.collect()` after a run with the collector off, 2026-12-05), kept until the
    worker exits. What the collector did there was trace each step's new acyclic objects once, right after they
    were made: a step's 8,192 `Trajectory` values (about 300,000 objects) and the prefix tree's new nodes, 2.2 of
    the tree worker's 57 s of CPU over the 100 default steps (`gc.callbacks`), for nothing: reference counting
    frees them, and `freeze_long_lived` moves what stays out of the collector's reach at each step end."""
    gc.disable()


def _child(run_group: Callable[..., Any], group: list[str], index: int, queue: Any) -> None:
    try:
        small_pages()
        no_cycle_collection()

        def progress(policy: str, step: int) -> None:
            queue.put(("progress", index, (policy, step)))

        queue.put(("done", index, run_group(group, progress)))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the child's traceback
        queue.put(("error", index, traceback.format_exc()))


def run_groups(
    run_group: Callable[[list[str], Callable[[str, int], None]], Any],
    groups: list[list[str]],
    progress: Callable[[str, int], None] | None = None,
) -> list[Any]:
    """`run_group(group, progress)` for each group in its own forked process; the results in group order.
    `progress(policy, step)` is called in this process as the workers report."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(run_group, g, i, queue), daemon=True) for i, g in enumerate(groups)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    gone: set[int] = set()  # workers seen exited without a result at the last empty poll
    try:
        while len(results) < len(groups):
            try:
                kind, index, payload = queue.get(timeout=POLL_S)
            except queue_module.Empty:
                # A worker flushes its messages before it exits, so one that has exited and still said nothing
                # after a whole further poll never will (killed, out of memory): fail instead of waiting forever.
                exited = {i for i, p in enumerate(procs) if i not in results and p.exitcode is not None}
                dead = exited & gone
                if dead:
                    i = min(dead)
                    raise RuntimeError(
                        f"simulation worker for {', '.join(groups[i])} died (exit code {procs[i].exitcode})"
                    ) from None
                gone = exited
                continue
            if kind == "progress":
                if progress:
                    progress(*payload)
            elif kind == "done":
                results[index] = payload
            else:
                raise RuntimeError(f"simulation worker for {', '.join(groups[index])} failed:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return [results[i] for i in range(len(groups))]


def fork_available() -> bool:
    return "fork" in mp.get_all_start_methods()
