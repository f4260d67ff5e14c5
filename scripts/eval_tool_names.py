"""The default router on the corpus with its tool names rewritten: does its margin depend on how a log names tools?

    python scripts/eval_tool_names.py [--corpus data/corpus] [--names real,per-task,groups:10,one]
                                      [--named-all | --share-alone]

Each source in file order, four buckets at its own length quartiles, the default's margin over the best baseline
(points) and its migrated tokens, with every tool return renamed as NAMES says:
- `real`: the names as imported;
- `per-task`: each task's own (`TASK/TOOL`), as a log whose tool names carry an id gives, or an API-calling agent
  whose every query has its own tools;
- `groups:N`: shared by N tasks (`gK/TOOL`, tasks grouped at random, seeded by their ids), a wide tool vocabulary
  each of whose names a few tasks use;
- `one`: a single name for every tool.
`--named-all` keys every tool by its name (a closed `tools` set: the router as it was before rare tools were grouped,
docs/routing-log.md); `--share-alone` keys a tool by its name once it returns in a tenth of the runs, without the
test of what follows it (`tool_test=None`: the router as it was before names were kept only when told apart).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence

import attrs

from libra.scheduling import CMLFQ_PRESETS, PrefixTree
from libra.scheduling.size_classes import QuantileStateCodec
from libra.scheduling.sources import gap_over_baselines, meets_target, quantile_buckets, score_source
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus
from libra.workloads.trace import Trajectory


def renamed(trajectories: Sequence[Trajectory], mode: str) -> list[Trajectory]:
    """`trajectories` with every tool renamed as `mode` says (module docstring)."""
    if mode == "real":
        return list(trajectories)
    group: dict[str, int] = {}
    if mode.startswith("groups:"):
        size = int(mode.partition(":")[2])
        tasks = sorted({t.prompt_id for t in trajectories}, key=lambda p: (zlib.crc32(p.encode()), p))
        group = {task: i // size for i, task in enumerate(tasks)}

    def name(traj: Trajectory, tool: str) -> str:
        if mode == "one":
            return "tool"
        if mode == "per-task":
            return f"{traj.prompt_id}/{tool}"
        return f"g{group[traj.prompt_id]}/{tool}"

    return [
        attrs.evolve(t, turns=tuple(attrs.evolve(u, tool=name(t, u.tool)) if u.tool else u for u in t.turns))
        for t in trajectories
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="corpus folder (default data/corpus)")
    p.add_argument("--names", default="real,per-task,groups:10,one", help="naming modes, comma-separated")
    router = p.add_mutually_exclusive_group()  # (a tree given to the router would drop --named-all's tools set)
    router.add_argument("--named-all", action="store_true", help="key every tool by its name (a closed tools set)")
    router.add_argument(
        "--share-alone", action="store_true", help="name a tool by its share alone, without the test (tool_test=None)"
    )
    args = p.parse_args()
    modes = [m for m in args.names.split(",") if m]
    for m in modes:
        if m not in ("real", "per-task", "one") and not (m.startswith("groups:") and m[7:].isdigit() and int(m[7:])):
            p.error(f"--names {m!r}: wanted real, per-task, one or groups:N (N >= 1)")
    try:
        corpus = load_corpus(args.corpus)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"eval_tool_names: error: cannot read the corpus in {args.corpus}: {exc}", file=sys.stderr)
        return 2
    print("| source | " + " | ".join(modes) + " |")
    print("|---|" + "---:|" * len(modes))
    met = dict.fromkeys(modes, 0)
    for source, trajs in corpus.items():
        buckets = quantile_buckets(trajs)
        cells = []
        for m in modes:
            trace = renamed(trajs, m)
            options = dict(CMLFQ_PRESETS["adaptive"])
            if args.named_all:
                options["tools"] = sorted({u.tool for t in trace for u in t.turns if u.tool is not None})
            if args.share_alone:
                options["tree"] = PrefixTree(codec=QuantileStateCodec.from_spec(options["size_edges"], tool_test=None))
            gap, migrated, _ = gap_over_baselines(score_source(trace, buckets, {"default": options}), "default")
            met[m] += meets_target(gap, migrated)
            cells.append(f"{100 * gap:+.1f} ({100 * migrated:.1f} %)")
        print(f"| {source} | " + " | ".join(cells) + " |", flush=True)
    print("| met (>= +5.0 at <= 12 %) | " + " | ".join(f"{met[m]} / {len(corpus)}" for m in modes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
