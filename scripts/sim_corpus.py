"""Every policy on every source of the real-trajectory corpus: one step as recorded against the steady state.

    python scripts/sim_corpus.py [--steps 5] [--prompts N] [--seed 0] [--corpus DIR ...] [--plot FILE.png]

Each source is one batch of agent runs, so `libra simulate --trace` gives one step: the asynchronous policies then
roll it out with no training step to overlap. For each source this runs `libra simulate` twice on the default
cluster (48 x A800-80GB, Qwen3-14B), once on the trace as it is and once with `--resample --steps STEPS` (and
`--prompts N` where given: N prompt groups a step, drawn with replacement), and prints one markdown row per source:
each policy's throughput over colocated's as "one step / resampled, all steps / resampled, steady" (the steady
throughput leaves out the pipeline's fill, step 0, and its drain). `--plot` also draws `libra`'s three numbers per
source as bars against colocated's 1.0. docs/sim.md, "A short trace".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from libra.sim import POLICY_NAMES
from libra.workloads.corpus import DEFAULT_CORPUS, load_manifest

SHOWN = [p for p in POLICY_NAMES if p != "colocated"]


def _simulate(trace: Path, extra: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "libra", "simulate", "--trace", str(trace), "--policy", "all"]
    cmd += ["--no-plots", "--json", "--out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)["policies"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="steps drawn from each source (default 5, at least 2)")
    ap.add_argument("--prompts", type=int, default=None, help="prompt groups a step (default: the source's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--corpus", nargs="+", default=[str(DEFAULT_CORPUS), str(DEFAULT_CORPUS / "held-out")], help="corpus folders"
    )
    ap.add_argument("--plot", metavar="FILE", default=None, help="also draw libra's ratios per source (PNG)")
    args = ap.parse_args()
    if args.steps < 2:  # the steady throughput leaves out the first step and the last stage
        ap.error(f"--steps must be >= 2 (the steady state needs two steps), got {args.steps}")
    if args.prompts is not None and args.prompts < 1:
        ap.error(f"--prompts must be >= 1, got {args.prompts}")
    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        ap.error(f"--plot {args.plot}: its folder does not exist")
    try:
        sources = [(Path(root), src) for root in args.corpus for src in load_manifest(root)["sources"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"sim_corpus: error: cannot read the corpus manifest: {exc}", file=sys.stderr)
        return 2
    resample = ["--resample", "--steps", str(args.steps), "--seed", str(args.seed)]
    resample += ["--prompts", str(args.prompts)] if args.prompts is not None else []
    drawn: list[tuple[str, list[float]]] = []  # (source, libra's three ratios)
    print("| source | trajectories a step | " + " | ".join(SHOWN) + " |")
    print("|---|---:|" + "---:|" * len(SHOWN))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (root, src) in enumerate(tqdm(sources, desc="sources", leave=False)):
            trace = root / src["file"]
            one = _simulate(trace, ["--seed", str(args.seed)], Path(tmp) / f"one{i}")
            more = _simulate(trace, resample, Path(tmp) / f"more{i}")
            base = [one["colocated"]["throughput_tok_s"], more["colocated"]["throughput_tok_s"]]
            base.append(more["colocated"]["steady_throughput_tok_s"])
            cells = []
            for p in SHOWN:
                got = [one[p]["throughput_tok_s"], more[p]["throughput_tok_s"], more[p]["steady_throughput_tok_s"]]
                ratios = [g / b for g, b in zip(got, base, strict=True)]
                cells.append(" / ".join(f"{r:.2f}" for r in ratios))
                if p == "libra":
                    drawn.append((src["name"], ratios))
            per_step = _trajectories(Path(tmp) / f"more{i}")[0]
            print(f"| {src['name']} | {per_step} | " + " | ".join(cells) + " |", flush=True)
    if args.plot:
        _plot(drawn, Path(args.plot), args.steps)
    return 0


def _plot(drawn: list[tuple[str, list[float]]], path: Path, steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(drawn))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(drawn)), 4.5))
    labels = ("one step as recorded", f"resampled, {steps} steps", "resampled, steady")
    for k, label in enumerate(labels):
        ax.bar(x + (k - 1) * 0.27, [r[k] for _, r in drawn], width=0.27, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, [name for name, _ in drawn], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("libra throughput / colocated")
    ax.set_title("libra against colocated on every corpus source")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def _trajectories(out: Path) -> list[int]:
    """The trajectories of each rollout step of the resampled run (its report)."""
    steps = json.loads((out / "report.json").read_text())["runs"]["colocated"]["steps"]
    return [x["trajectories"] for x in steps if x["trajectories"]]


if __name__ == "__main__":
    raise SystemExit(main())
