"""Routing on every source of the real-trajectory corpus, and the leave-one-source-out choice of C-MLFQ options.

    python scripts/eval_corpus.py [--corpus data/corpus] [--json FILE] [--orders K [--order-seed S]]

Per source: four buckets at its own 25/50/75 % length quantiles, and on coding sources also `1:8000,2:16000,
4:32000,8:inf`; the baselines, the C-MLFQ presets and the candidate structures of the adaptive preset on each.
Then, per source, the candidate that did best on the *other* sources (mean margin over the best baseline over
their bucket sets, among the candidates that carry at most 12 % of the tokens on each of them; sources of >= 100
trajectories only), reported on the held-out source, and the default (the `adaptive` preset) on every source.
Prints markdown tables (docs/routing.md).

With `--orders K`, each source is also replayed in K random orders of its trajectories (`shuffled_runs`: a
trajectory's turns stay in order, and the runs of one task keep their file order, since a retry comes after the
first run in any real log), the baselines in the same order as the default each time; a last table gives, per
source and bucket set, the default's margin over the best baseline and its migrated tokens in file order, their
min / median / max over the K orders, and how many orders meet the target (>= 5 points, <= 12 % migrated).
With `--variants`, one-option variants of the default (VARIANTS) are replayed in the same orders too, and a summary
compares them with the default: units met in file order, orders met, mean and least median margin.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from libra.scheduling import CMLFQ_PRESETS
from libra.scheduling.sources import (
    BASELINES,
    MAX_MIGRATED,
    gap_over_baselines,
    margin,
    meets_target,
    quantile_buckets,
    score_source,
)
from libra.spec import Bucket, format_buckets, parse_buckets
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from libra.workloads.trace import Trajectory

BASE = CMLFQ_PRESETS["adaptive"]
MECHANISMS: dict[str, dict[str, Any]] = {
    "fixed": {"shrink": 0.0, "budget_mix": False},
    "fitted": {"shrink": "auto", "budget_mix": True},
}
ADMISSION = {"experts": {"admit_select": True}, "tree": {"admit_select": False}}
# (size classes: `breaks:4` throughout; `quantile:3` was within a point of it on every source when it was a
# dimension of this choice, docs/routing.md)
# The candidates are structures, compared without the default's migration ceiling (a guarantee laid over the chosen
# structure afterwards, docs/routing-log.md): with it every candidate that promotes blindly rides the ceiling (11-12 %
# migrated), so the 12 % constraint of the choice would no longer tell the structures apart.
CANDIDATES = {
    f"{adm}/{cold}/{beyond}/{mech}": {
        **BASE,
        "ceiling": None,
        "cold": cold,
        "beyond": beyond,
        **MECHANISMS[mech],
        **ADMISSION[adm],
    }
    for mech in ("fitted", "fixed")
    for adm in ("experts", "tree")
    for cold in ("budget", "stay", "promote")
    for beyond in ("root", "promote")
}
PRESETS = {"cmlfq-published": CMLFQ_PRESETS["published"], "cmlfq-priced": CMLFQ_PRESETS["priced"], "default": BASE}
CODING_BUCKETS = "1:8000,2:16000,4:32000,8:inf"
MIN_SELECT = 100
# One-option changes of the default, compared with it over random orders (`--variants`; docs/routing-log.md)
VARIANTS = {
    "cold stay": {"cold": "stay"},
    "no repay": {"repay": None},
    "no hold_first": {"hold_first": False},
    "no recent expert": {"recent_expert": 0},
    "no budget mix": {"budget_mix": False},
    "tree admission": {"admit_select": False},
}


def shuffled_runs(trajectories: Sequence[Trajectory], rng: np.random.Generator) -> list[Trajectory]:
    """A random order of `trajectories`, every one exactly once, in which the runs of one task (prompt id) keep
    their file order: a uniform permutation, then each task's slots refilled with its runs in file order. That is
    uniform over the orders that keep the runs of each task in sequence (each is hit by the same number of
    permutations)."""
    runs: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        runs.setdefault(t.prompt_id, []).append(t)
    queues = {task: iter(ts) for task, ts in runs.items()}
    return [next(queues[trajectories[i].prompt_id]) for i in rng.permutation(len(trajectories))]


def source_orders(name: str, trajectories: Sequence[Trajectory], num_orders: int, seed: int) -> list[list[Trajectory]]:
    """`num_orders` orders of one source, from a generator seeded by `seed` and the source's name (so a source's
    orders do not depend on which other sources the corpus holds)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return [shuffled_runs(trajectories, rng) for _ in range(num_orders)]


def variant_options(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The default and the named VARIANTS, as router options."""
    return {"default": BASE, **{v: {**BASE, **VARIANTS[v]} for v in names}}


def gaps(
    trajectories: Sequence[Trajectory], buckets: Sequence[Bucket], variants: Sequence[str] = ()
) -> dict[str, tuple[float, float, str]]:
    """Per router (the default, then each variant): its margin over the best baseline (accuracy minus accuracy), its
    migrated-token fraction, and the best baseline, the baselines replayed in the same order."""
    res = score_source(trajectories, buckets, variant_options(variants))
    return {name: gap_over_baselines(res, name) for name in ("default", *variants)}


def order_row(source: str, buckets: str, file_order: tuple[float, float, str], orders: list[tuple]) -> str:
    """One markdown row: file order, then min / median / max over the orders, and the orders meeting the target."""
    gaps = [100 * g for g, _, _ in orders]
    moved = [100 * m for _, m, _ in orders]
    met = sum(meets_target(g, m) for g, m, _ in orders)

    def spread(xs: list[float], fmt: str) -> str:
        return " / ".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))

    return (
        f"| {source} | {buckets} | {100 * file_order[0]:+.1f} ({100 * file_order[1]:.1f}%) | {spread(gaps, '+.1f')} "
        f"| {spread(moved, '.1f')} | {met} / {len(orders)} |"
    )


def order_table(corpus: dict, units: dict, num_orders: int, seed: int, variants: Sequence[str] = ()) -> dict[str, Any]:
    """Print the table of the default in `num_orders` random orders per source, and with `variants` the summary of
    the default against them; return the figures (for --json)."""
    print(
        "| source | buckets | file order: margin (migrated) | margin min / median / max | migrated % min / median "
        "/ max | orders meeting the target |"
    )
    print("|---|---|---:|---:|---:|---:|")
    out: dict[str, Any] = {}
    summary: dict[str, list[tuple[tuple, list[tuple]]]] = {}  # router -> per unit of >= MIN_SELECT: (file, orders)
    for name, trajs in corpus.items():
        shuffles = source_orders(name, trajs, num_orders, seed)
        for buckets, res in units[name]:
            print(f"{name}: {num_orders} orders, buckets {buckets}", file=sys.stderr)
            per_order = [gaps(order, parse_buckets(buckets), variants) for order in shuffles]
            by_router = {router: [o[router] for o in per_order] for router in ("default", *variants)}
            print(order_row(name, buckets, gap_over_baselines(res, "default"), by_router["default"]))
            out.setdefault(name, {})[buckets] = {
                router: [{"margin": g, "migrated_token_fraction": m, "best_baseline": b} for g, m, b in rows]
                for router, rows in by_router.items()
            }
            if len(trajs) >= MIN_SELECT:
                for router, rows in by_router.items():
                    summary.setdefault(router, []).append((gap_over_baselines(res, router), rows))
    if variants:
        print()
        variant_summary(summary, num_orders)
    return out


def variant_summary(summary: dict[str, list[tuple[tuple, list[tuple]]]], num_orders: int) -> None:
    """The default against its variants over the units of >= MIN_SELECT trajectories: units met in file order,
    orders met, the mean of the units' median margins and the least of them."""
    print("| router | units met, file order | orders met | mean of the median margins | least median margin |")
    print("|---|---:|---:|---:|---:|")
    for router, unit_rows in summary.items():
        met_file = sum(meets_target(g, m) for (g, m, _), _ in unit_rows)
        met = sum(meets_target(g, m) for _, rows in unit_rows for g, m, _ in rows)
        medians = [statistics.median(100 * g for g, _, _ in rows) for _, rows in unit_rows]
        print(
            f"| {router} | {met_file} / {len(unit_rows)} | {met} / {num_orders * len(unit_rows)} "
            f"| {statistics.mean(medians):+.2f} | {min(medians):+.1f} |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="corpus folder (default data/corpus)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every result as JSON")
    p.add_argument("--orders", type=int, default=0, metavar="K", help="also replay each source in K random orders")
    p.add_argument("--order-seed", type=int, default=0, metavar="S", help="seed of those orders (default 0)")
    p.add_argument(
        "--variants",
        default="",
        metavar="NAMES",
        help=f"with --orders: also these variants of the default, comma-separated, or all ({', '.join(VARIANTS)})",
    )
    args = p.parse_args()
    variants = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants {unknown[0]!r}: wanted one of {', '.join(VARIANTS)} or all")
    if variants and not args.orders:
        p.error("--variants needs --orders K (K >= 1)")
    if args.orders < 0:
        p.error(f"--orders {args.orders}: wanted a number of orders >= 0")
    if args.order_seed < 0:  # (numpy seeds are non-negative)
        p.error(f"--order-seed {args.order_seed}: wanted an integer >= 0")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        p.error(f"--json {args.json}: its folder does not exist")
    try:
        corpus = load_corpus(args.corpus)
        kinds = {s["name"]: s["kind"] for s in load_manifest(args.corpus)["sources"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"eval_corpus: error: cannot read the corpus in {args.corpus}: {exc}", file=sys.stderr)
        return 2
    units: dict[str, list[tuple[str, dict]]] = {}  # source -> [(buckets, results)]
    for name, trajs in corpus.items():
        bucket_sets = [quantile_buckets(trajs)]
        if kinds[name].startswith("coding"):
            bucket_sets.append(parse_buckets(CODING_BUCKETS))
        for buckets in bucket_sets:
            print(f"{name}: {len(trajs)} trajectories, buckets {format_buckets(buckets)}", file=sys.stderr)
            res = score_source(trajs, buckets, {**CANDIDATES, **PRESETS, **variant_options(variants)})
            units.setdefault(name, []).append((format_buckets(buckets), res))

    def source_margin(source: str, cand: str) -> float:
        return float(np.mean([margin(res, cand) for _, res in units[source]]))

    print("| held-out source | buckets | chosen on the other sources | C-MLFQ held out | best baseline | margin |")
    print("|---|---|---|---:|---:|---:|")
    loso = {}
    for held in units:
        # sources of fewer than MIN_SELECT trajectories are reported, not used to choose: one trajectory moves
        # their accuracy by 5 points
        others = [s for s in units if s != held and len(corpus[s]) >= MIN_SELECT]
        if not others:  # nothing to choose on
            print(f"| {held} | | no other source of >= {MIN_SELECT} trajectories | | | |")
            continue
        # the bound is a constraint: candidates over 12 % migrated tokens on any unit of the others are out
        feasible = [
            c
            for c in CANDIDATES
            if all(res[c].migrated_token_fraction <= MAX_MIGRATED for s in others for _, res in units[s])
        ] or list(CANDIDATES)
        chosen = max(feasible, key=lambda c: np.mean([source_margin(s, c) for s in others]))
        loso[held] = chosen
        for label, res in units[held]:
            r = res[chosen]
            best = max(BASELINES, key=lambda b: res[b].routing_accuracy)
            print(
                f"| {held} | {label} | {chosen} | {r.routing_accuracy:.1%} / {r.migrated_token_fraction:.1%} | "
                f"{best} {res[best].routing_accuracy:.1%} | "
                f"{100 * (r.routing_accuracy - res[best].routing_accuracy):+.1f} |"
            )
    print()
    cols = [*BASELINES, "cmlfq-published", "cmlfq-priced", "default"]
    print("| source | buckets | " + " | ".join(cols) + " | margin |")
    print("|---|---|" + "---:|" * (len(cols) + 1))
    for s, rows in units.items():
        for label, res in rows:
            cells = [f"{res[c].routing_accuracy:.1%} ({res[c].migrated_token_fraction:.1%})" for c in cols]
            top = max(res[b].routing_accuracy for b in BASELINES)
            gap = 100 * (res["default"].routing_accuracy - top)
            print(f"| {s} | {label} | " + " | ".join(cells) + f" | {gap:+.1f} |")
    print()
    print(
        "| candidate | mean margin (sources >= 100) | "
        + " | ".join(f"{s} {b}" for s in units for b, _ in units[s])
        + " |"
    )
    print("|---|---:|" + "---:|" * sum(len(v) for v in units.values()))
    for c in CANDIDATES:
        mean = np.mean([source_margin(s, c) for s in units if len(corpus[s]) >= MIN_SELECT])
        cells = [
            f"{r[c].routing_accuracy:.1%} ({r[c].migrated_token_fraction:.1%})" for s in units for _, r in units[s]
        ]
        print(f"| {c} | {100 * mean:+.1f} | " + " | ".join(cells) + " |")
    orders: dict[str, Any] = {}
    if args.orders:
        print()
        orders = order_table(corpus, units, args.orders, args.order_seed, variants)
    if args.json:
        out: dict[str, Any] = {
            s: {b: {k: v.to_dict() for k, v in r.items()} for b, r in rows} for s, rows in units.items()
        }
        out["_loso"] = loso
        if orders:
            out["_orders"] = {"seed": args.order_seed, "sources": orders}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
