"""A larger bad-input fuzz run over the `libra` CLI and its loaders (the seeded cases of tests/cli/fuzz_cases.py),
each case in a forked child with a time and a memory limit; prints a table of verdicts per command and every case
that broke the contract (traceback, internal error, crash, hang, several lines).

    python scripts/fuzz_cli.py --cases 3000 --seed 1 [--timeout 60] [--memory-gib 3] [--kinds plan,trace]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cli.fuzz_cases import _MAKERS, cases, memory_limit, run_case  # noqa: E402

BAD = ("traceback", "internal", "crash", "hang", "several-lines")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=3000, help="number of cases (default 3000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    p.add_argument("--memory-gib", type=float, default=3.0, help="address space per case above the parent's")
    p.add_argument("--kinds", default=",".join(_MAKERS), help="commands to fuzz, comma-separated (default all)")
    args = p.parse_args()
    unknown = sorted(set(args.kinds.split(",")) - set(_MAKERS))
    if unknown:
        p.error(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(_MAKERS)}")
    if args.cases < 1 or not args.timeout > 0 or not args.memory_gib > 0:
        p.error("--cases must be >= 1, --timeout and --memory-gib > 0")
    from tqdm import tqdm

    import libra.cli  # noqa: F401 - imported once, before the forks

    kinds = tuple(args.kinds.split(","))
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    broken = []
    limit = memory_limit(args.memory_gib)
    with tempfile.TemporaryDirectory(prefix="libra-fuzz-") as tmp:
        for i, case in enumerate(tqdm(list(cases(args.seed, args.cases, kinds)), desc="fuzz", file=sys.stderr)):
            outcome = run_case(case, Path(tmp) / str(i), timeout_s=args.timeout, memory_bytes=limit)
            counts[case.kind][outcome.verdict] += 1
            if outcome.verdict in BAD:
                broken.append(outcome)
    verdicts = ["ok", "error", "usage", *BAD]
    print(f"{args.cases} cases, seed {args.seed}, {args.timeout:g} s and +{args.memory_gib:g} GiB per case\n")
    print("| command | " + " | ".join(verdicts) + " |")
    print("|---" * (len(verdicts) + 1) + "|")
    for kind in sorted(counts):
        print(f"| {kind} | " + " | ".join(str(counts[kind][v]) for v in verdicts) + " |")
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    print("| all | " + " | ".join(str(total[v]) for v in verdicts) + " |")
    for o in broken:
        print(f"\n{o.verdict}: libra {' '.join(o.case.argv)} (exit {o.code}, {o.seconds:.1f} s)")
        for name, content in o.case.files:
            print(f"  file {name}: {content[:200]!r}")
        print("  " + o.stderr.strip().replace("\n", "\n  ")[-800:])
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
