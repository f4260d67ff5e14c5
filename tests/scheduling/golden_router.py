"""Digests of the router's decisions and of the prefix tree's statistics on seeded synthetic traces, for
test_golden.py: speed changes to the router and the tree must leave them identical. `python -m
tests.scheduling.golden_router` prints the current digests (to refresh GOLDEN only for a deliberate behaviour change).
"""

from __future__ import annotations

import hashlib
import json

from libra.scheduling import CMLFQ_PRESETS, PrefixTree, make_router
from libra.spec import parse_buckets
from libra.workloads.generators import WorkloadGenerator

BUCKETS = {"search-r1": "2:5000,4:15000,8:inf", "r2e-gym": "1:4000,2:12000,4:30000,8:inf"}
PRESETS = ("published", "accuracy", "budget", "priced", "adaptive")


def _steps(workload: str, count: int, seed: int = 0, num_prompts: int = 24) -> list:
    gen = WorkloadGenerator(workload, seed=seed, num_prompts=num_prompts)
    return [gen.step(s) for s in range(count)]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


# the adaptive preset without the admission experts and the cold budget (issue 14, second round), and without the
# run-level budget target and the held first warm step (issue 14, third round): its digests are those of the
# adaptive preset before them
PREV = {"admit_select": False, "cold": "stay", "repay": None, "hold_first": False}
# ... and also without the fitted shrinkage and the price mix (issue 14): its digests are those of 544da9f
FIXED = {"shrink": 0.0, "budget_mix": False, **PREV}


def router_digest(workload: str, preset: str, steps: int = 4, max_nodes: int = 200_000, **options) -> str:
    """Every decision of a C-MLFQ router (preset) driven turn by turn over `steps` seeded steps, then its tree."""
    options = {**CMLFQ_PRESETS[preset], "max_nodes": max_nodes, **options}
    router = make_router("cmlfq", parse_buckets(BUCKETS[workload]), **options)
    log = []
    rid = 0
    for step in _steps(workload, steps):
        for traj in step:
            d = router.admit(rid, prompt_id=traj.prompt_id, prompt_tokens=traj.prompt_tokens)
            log.append((d.bucket, d.migrate, d.migrated_tokens, d.reason))
            context = traj.prompt_tokens
            for turn in traj.turns:
                context += turn.gen_tokens
                for c in (context - turn.gen_tokens // 2, context):
                    d = router.on_progress(rid, context_tokens=c)
                    log.append((d.bucket, d.migrate, d.migrated_tokens, d.reason))
                context += turn.tool_tokens
                if turn.tool is not None:
                    d = router.on_tool_return(
                        rid,
                        tool=turn.tool,
                        tool_tokens=turn.tool_tokens,
                        status=turn.tool_status or "ok",
                        context_tokens=context,
                    )
                    log.append((d.bucket, d.migrate, d.migrated_tokens, d.reason))
            router.finish(rid, traj)
            rid += 1
        router.end_step()
        log.append(("price", getattr(router, "price", None)))
    return _digest([log, router.tree.to_dict()])


def tree_digest(workload: str, size_edges, steps: int, max_nodes: int, window: int = 200) -> str:
    """The tree's statistics (to_dict) after each of `steps` updates, with evictions when `max_nodes` is small."""
    tree = PrefixTree(window=window, max_nodes=max_nodes, size_edges=size_edges)
    out = []
    for step in _steps(workload, steps, num_prompts=32):
        tree.update(step)
        out.append([tree.num_nodes, tree.evicted, _digest(tree.to_dict())])
    return _digest(out)


ROUTER_CASES = (
    [(w, p) for w in BUCKETS for p in PRESETS]
    + [(w, "adaptive-fixed") for w in BUCKETS]
    + [(w, "adaptive-prev") for w in BUCKETS]
    + [("r2e-gym", "adaptive-small"), ("r2e-gym", "adaptive-small-fixed"), ("r2e-gym", "adaptive-small-prev")]
)
TREE_CASES = {
    "search-r1-default": ("search-r1", (1000, 4000), 6, 200_000, 200),
    "r2e-gym-breaks-evict": ("r2e-gym", "breaks:4", 8, 3_000, 20),
    "search-r1-quantile-evict": ("search-r1", "quantile:3", 8, 1_500, 200),
}


def compute_router(case: tuple[str, str]) -> str:
    workload, preset = case
    options = FIXED if preset.endswith("-fixed") else PREV if preset.endswith("-prev") else {}
    preset = preset.removesuffix("-fixed").removesuffix("-prev")
    if preset == "adaptive-small":  # a small tree: evictions between the steps
        return router_digest(workload, "adaptive", steps=5, max_nodes=2_000, **options)
    return router_digest(workload, preset, **options)


def compute_tree(name: str) -> str:
    return tree_digest(*TREE_CASES[name])


if __name__ == "__main__":
    print({f"{w}/{p}": compute_router((w, p)) for w, p in ROUTER_CASES})
    print({name: compute_tree(name) for name in TREE_CASES})
