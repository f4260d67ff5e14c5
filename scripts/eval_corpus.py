"""Routing on every source of the real-trajectory corpus, and the leave-one-source-out choice of C-MLFQ options.

    python scripts/eval_corpus.py [--corpus data/corpus] [--json FILE]

Per source: four buckets at its own 25/50/75 % length quantiles (coding sources also `1:8000,2:16000,4:32000,
8:inf`), the baselines, the C-MLFQ presets and the candidate structures of the adaptive preset; then, per source,
the candidate that did best on the other sources (mean margin over the best baseline, less twice any migrated-token
share above 12 %), reported on the held-out source. Prints markdown tables (docs/routing.md).
"""

from __future__ import annotations

import argparse
import json
import sys

from libra.scheduling import CMLFQ_PRESETS
from libra.scheduling.sources import BASELINES, leave_one_source_out, quantile_buckets, score_source
from libra.spec import format_buckets, parse_buckets
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest

BASE = CMLFQ_PRESETS["adaptive"]
CANDIDATES = {
    f"{edges}/{cold}/{beyond}": {**BASE, "size_edges": edges, "cold": cold, "beyond": beyond}
    for edges in ("breaks:4", "quantile:3")
    for cold in ("stay", "promote")
    for beyond in ("root", "promote")
}
PRESETS = {"cmlfq-published": CMLFQ_PRESETS["published"], "cmlfq-priced": CMLFQ_PRESETS["priced"]}
CODING_BUCKETS = "1:8000,2:16000,4:32000,8:inf"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    p.add_argument("--json", default=None)
    args = p.parse_args()
    corpus = load_corpus(args.corpus)
    kinds = {s["name"]: s["kind"] for s in load_manifest(args.corpus)["sources"]}
    scores, extra = {}, {}
    for name, trajs in corpus.items():
        buckets = quantile_buckets(trajs)
        print(f"{name}: {len(trajs)} trajectories, buckets {format_buckets(buckets)}", file=sys.stderr)
        scores[name] = score_source(trajs, buckets, {**CANDIDATES, **PRESETS})
        scores[name]["_buckets"] = format_buckets(buckets)
        if kinds[name].startswith("coding"):
            extra[name] = score_source(trajs, parse_buckets(CODING_BUCKETS), {"adaptive": BASE, **PRESETS})
    clean = {s: {k: v for k, v in r.items() if k != "_buckets"} for s, r in scores.items()}
    loso = leave_one_source_out(clean, list(CANDIDATES))
    print("| source | trajectories | buckets | chosen on the others | C-MLFQ held out | best baseline | margin |")
    print("|---|---:|---|---|---:|---:|---:|")
    for s, row in loso.items():
        r = row["result"]
        best = max(BASELINES, key=lambda b: clean[s][b].routing_accuracy)
        print(
            f"| {s} | {r.trajectories} | {scores[s]['_buckets']} | {row['chosen']} | "
            f"{r.routing_accuracy:.1%} / {r.migrated_token_fraction:.1%} | {best} {clean[s][best].routing_accuracy:.1%}"
            f" | {100 * (r.routing_accuracy - clean[s][best].routing_accuracy):+.1f} |"
        )
    print()
    cols = [*BASELINES, "cmlfq-published", "cmlfq-priced", "breaks:4/stay/root"]
    print("| source | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for s, res in clean.items():
        cells = [f"{res[c].routing_accuracy:.1%} ({res[c].migrated_token_fraction:.1%})" for c in cols]
        print(f"| {s} | " + " | ".join(cells) + " |")
    for s, res in extra.items():
        cells = [
            f"{res[c if c != 'breaks:4/stay/root' else 'adaptive'].routing_accuracy:.1%} "
            f"({res[c if c != 'breaks:4/stay/root' else 'adaptive'].migrated_token_fraction:.1%})"
            for c in cols
        ]
        print(f"| {s} `{CODING_BUCKETS}` | " + " | ".join(cells) + " |")
    print()
    print("| candidate | " + " | ".join(clean) + " |")
    print("|---|" + "---:|" * len(clean))
    for c in CANDIDATES:
        cells = [f"{clean[s][c].routing_accuracy:.1%} ({clean[s][c].migrated_token_fraction:.1%})" for s in clean]
        print(f"| {c} | " + " | ".join(cells) + " |")
    if args.json:
        out = {s: {k: v.to_dict() for k, v in r.items()} for s, r in clean.items()}
        out["_loso"] = {s: {"chosen": v["chosen"], "margin": v["margin"]} for s, v in loso.items()}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
