"""Sweep `libra simulate` over prompts per step and print every policy's throughput relative to `colocated`.

    python examples/sim_sweep.py                                  # the three workloads at 64, 128, 256 prompts x 16
    python examples/sim_sweep.py --workloads r2e-gym --prompts 64 --coeffs my_cluster_coeffs.yaml

The batch per step decides whether a rollout is throughput-bound (many waves of requests per instance: every GPU
stays busy and GPUs scale the rollout almost linearly) or tail-bound (one wave: the step waits for the longest chains
of turns while most GPUs idle), and with it how much any resource manager can gain over `colocated`. `docs/sim.md`
("How the picture changes with the batch") has the tables this prints. Steps default to 100 for r2e-gym and 40 for
the others, as in the main tables there.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from libra.planning.cost import load_coefficients
from libra.sim import Scenario, WorkSource, simulate
from libra.sim.policies import POLICY_NAMES
from libra.spec import ClusterSpec, RLSettings, SpecError, get_gpu, load_model

DEFAULT_STEPS = {"r2e-gym": 100, "search-r1": 40, "dapo-math": 40}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="r2e-gym,search-r1,dapo-math", help="comma-separated workload names")
    p.add_argument("--prompts", type=_ints, default=[64, 128, 256], help="prompts per step, comma-separated")
    p.add_argument("--samples", type=_positive, default=16, help="samples per prompt (default 16)")
    p.add_argument("--steps", type=_positive, default=None, help="steps per run (default 100 r2e-gym, 40 the others)")
    p.add_argument("--gpus", type=int, default=48, help="total GPUs (default 48, 8 per node, A800-80GB)")
    p.add_argument("--model", default="Qwen3-14B", help="model preset name or YAML/JSON file")
    p.add_argument("--coeffs", metavar="FILE", help="YAML/JSON file of cost-model coefficients")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=_positive, default=2, help="worker processes per run (same numbers as 1)")
    return p.parse_args(argv)


def sweep(args: argparse.Namespace) -> list[str]:
    """Markdown rows: per workload and batch, colocated's step and idle share, then each policy over colocated."""
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=args.gpus, gpus_per_node=8)
    model = load_model(args.model)
    coeffs = load_coefficients(args.coeffs) if args.coeffs else None
    others = [p for p in POLICY_NAMES if p != "colocated"]
    rows = [
        "| workload (steps) | prompts x "
        + str(args.samples)
        + " | colocated step s | colocated GPU idle | "
        + " | ".join(others)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(others),
    ]
    runs = [(w, p) for w in args.workloads.split(",") for p in args.prompts]
    for workload, prompts in tqdm(runs, desc="sweep", unit="run", file=sys.stderr):
        steps = args.steps or DEFAULT_STEPS.get(workload, 40)
        source = WorkSource.from_generator(
            workload, seed=args.seed, num_prompts=prompts, samples_per_prompt=args.samples, max_model_len=40960
        )
        rl = RLSettings(num_prompts=prompts, samples_per_prompt=args.samples, max_model_len=40960)
        report = simulate(
            Scenario(cluster=cluster, model=model, rl=rl, source=source, coeffs=coeffs),
            num_steps=steps,
            workers=args.workers,
        )
        s = report.summary()
        base = s["colocated"]
        best = max(s[p]["throughput_tok_s"] for p in others)
        cells = [
            ("**{:.2f}**" if s[p]["throughput_tok_s"] == best else "{:.2f}").format(
                s[p]["throughput_tok_s"] / base["throughput_tok_s"]
            )
            for p in others
        ]
        rows.append(
            f"| {workload} ({steps}) | {prompts} | {base['mean_step_s']:,.0f} | "
            f"{base['gpu_idle_fraction']:.2f} | " + " | ".join(cells) + " |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = sweep(args)
    except SpecError as exc:
        print(f"sim_sweep: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
