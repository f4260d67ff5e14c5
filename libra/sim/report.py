"""Write a simulation report: one JSON file and three PNG plots (matplotlib, imported lazily, Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from libra.sim.records import PolicyResult
from libra.sim.simulator import SimReport
from libra.spec.jsonable import jsonable


def write_json(report: SimReport, path: Path) -> Path:
    path.write_text(json.dumps(jsonable(report.to_dict()), indent=1))
    return path


def throughput_series(r: PolicyResult) -> tuple[list[int], list[float]]:
    """What throughput.png draws for one policy: each stage that rolled out, its tokens over its duration."""
    stages = [x for x in r.records if x.trajectories]
    return [x.step for x in stages], [x.tokens / x.duration if x.duration > 0 else 0.0 for x in stages]


def gpu_series(r: PolicyResult) -> tuple[list[int], list[float], list[float]]:
    """What allocation.png draws for one policy: per stage, the GPUs training and rolling out on average over the
    stage, counting the workers the elastic pool moved across (lent to training, borrowed back to rollout)."""
    steps = [x.step for x in r.records]
    shift = [(x.lent_gpu_s - x.borrowed_gpu_s) / x.duration if x.duration > 0 else 0.0 for x in r.records]
    train = [x.train_gpus + d for x, d in zip(r.records, shift, strict=True)]
    roll = [x.rollout_gpus - d for x, d in zip(r.records, shift, strict=True)]
    return steps, train, roll


def breakdown_series(report: SimReport) -> dict[str, list]:
    """What breakdown.png draws: per policy, its mean rollout, training and stage (wall) seconds."""
    summ = [r.summary() for r in report.results]
    return {
        "policy": [r.name for r in report.results],
        "rollout": [s["mean_rollout_s"] for s in summ],
        "training": [s["mean_train_s"] for s in summ],
        "step (wall)": [s["mean_step_s"] for s in summ],
    }


def write_plots(report: SimReport, out: Path) -> list[Path]:
    """throughput.png (tokens/s per step, per policy), allocation.png (training vs rollout GPUs per step),
    breakdown.png (mean rollout, training and stage time per policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in report.results:
        ax.plot(*throughput_series(r), label=r.name)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s (stage)")
    ax.set_title(f"{report.workload}, {report.num_gpus} GPUs: throughput per step")
    ax.legend(fontsize=8)
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    n = len(report.results)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for ax, r in zip(axes.flat, report.results):
        steps, train, roll = gpu_series(r)
        if any(x.train_gpus + x.rollout_gpus > r.num_gpus for x in r.records):  # time-shared (colocated)
            ax.step(steps, train, where="post", label="training")
            ax.step(steps, roll, where="post", label="rollout")
        else:
            ax.stackplot(steps, train, roll, labels=["training", "rollout"], step="post")
        ax.set_title(r.name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes[0][0].set_ylabel("GPUs")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("GPUs training vs rolling out per step (colocated: the same GPUs take turns)", fontsize=10)
    fig.tight_layout()
    paths.append(out / "allocation.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 5))
    bars = breakdown_series(report)
    names = bars.pop("policy")
    width = 0.27
    for offset, (label, heights) in zip((-width, 0.0, width), bars.items(), strict=True):
        ax.bar([x + offset for x in range(len(names))], heights, width, label=label)
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("Step-time breakdown (asynchronous: step = max of both sides; colocated: their sum)")
    ax.legend(fontsize=8)
    paths.append(out / "breakdown.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def write_report(report: SimReport, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [write_json(report, out / "report.json"), *write_plots(report, out)]
