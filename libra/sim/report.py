"""Write a simulation report: one JSON file and three PNG plots (matplotlib, imported lazily, Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from libra.planning.cost import CostModel
from libra.sim.engine import weight_sync_s
from libra.sim.records import PolicyResult
from libra.sim.simulator import SimReport
from libra.spec.jsonable import jsonable

FILL_NOTE = (
    "asynchronous policies: step 0 is the pipeline's fill (rollout only); the drain (training only) is not drawn"
)
_PLAN_VS_SIM = 'docs/sim.md, "`libra plan` against `libra simulate`"'


def switch_note(summary: dict[str, dict[str, Any]]) -> str | None:
    """One line for `libra simulate`'s table: the seconds per step its policies spend moving the weights between
    training and rollout (`mean_switch_s`), which `libra plan`'s makespan leaves out; None where none do."""
    groups: dict[str, list[str]] = {}
    for name, s in summary.items():
        if s["mean_switch_s"] > 0:
            groups.setdefault(f"{s['mean_switch_s']:.1f} s", []).append(name)
    if not groups:
        return None
    parts = [f"{', '.join(names)} {secs} a step" for secs, names in groups.items()]
    return (
        "note: the simulated steps include moving the weights between training and rollout ("
        + "; ".join(parts)
        + f"), which the makespan of `libra plan` leaves out ({_PLAN_VS_SIM})"
    )


def plan_note(cm: CostModel) -> str:
    """One line for `libra plan`'s prediction: what its makespan leaves out that `libra simulate` charges."""
    return (
        "note: the makespan is training against rollout alone; each asynchronous step also waits "
        f"{weight_sync_s(cm):.1f} s for the weight broadcast before its rollout, which `libra simulate` includes "
        f"({_PLAN_VS_SIM})"
    )


def same_results(report: SimReport) -> list[list[str]]:
    """Groups of two or more policies whose every stage record is the same, in the report's order: the planner's
    ablations often run one plan (one TP degree, nothing to route), so their numbers are identical. report.json lists
    them under `same_results`; the plots draw each group once and name every member."""
    groups: dict[tuple, list[str]] = {}
    for r in report.results:
        groups.setdefault(r.records, []).append(r.name)
    return [names for names in groups.values() if len(names) > 1]


def _same_as(report: SimReport) -> dict[str, str]:
    """Each policy that repeats an earlier one's results -> the first of its group."""
    return {name: group[0] for group in same_results(report) for name in group[1:]}


def write_json(report: SimReport, path: str | Path) -> Path:
    path = Path(path)
    d = report.to_dict()
    d["same_results"] = same_results(report)
    path.write_text(json.dumps(jsonable(d), indent=1))
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


def _held(steps: list[int], *values: list[float]) -> tuple[list, ...]:
    """A step plot's points with the last stage held to its end: stage k spans [k, k + 1), so the last one gets a
    width too (drawn with `where="post"`, a series ending at its last point shows the last stage as nothing)."""
    if not steps:
        return (steps, *values)
    return ([*steps, steps[-1] + 1], *([*v, v[-1]] for v in values))


def breakdown_series(report: SimReport) -> dict[str, list]:
    """What breakdown.png draws: per policy, its mean rollout and training seconds, its mean steady stage (the
    stages after the first that rolled out, the time `steady_throughput_tok_s` divides by; None for one step) and
    its run's wall time over its steps (`mean_step_s`, the table's "step s": the fill and the drain included)."""
    summ = [r.summary() for r in report.results]
    steady = []
    for r in report.results:
        full = [x.duration for x in r.records if x.trajectories and x.step > 0]
        steady.append(sum(full) / len(full) if full else None)
    return {
        "policy": [r.name for r in report.results],
        "rollout": [s["mean_rollout_s"] for s in summ],
        "training": [s["mean_train_s"] for s in summ],
        "steady stage (wall)": steady,
        "run wall / steps": [s["mean_step_s"] for s in summ],
    }


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def write_plots(report: SimReport, out: str | Path) -> list[Path]:
    """throughput.png (tokens/s per step, per policy), allocation.png (training vs rollout GPUs per step),
    breakdown.png (mean rollout, training and stage time per policy). Policies with the same results are drawn
    once, under all their names."""
    out = Path(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    same = _same_as(report)
    groups = {g[0]: g for g in same_results(report)}
    paths = []
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in report.results:
        if r.name in same:
            continue
        ax.plot(*throughput_series(r), marker="o", markersize=4, label=" = ".join(groups.get(r.name, [r.name])))
    ax.set_xlabel(f"step\n({FILL_NOTE})")
    ax.set_ylabel("throughput (tokens / s over each stage)")
    ax.set_ylim(bottom=0)
    _integer_steps(ax)
    ax.set_title(f"{report.workload}, {report.num_gpus} GPUs: throughput per step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    n = len(report.results)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for ax, r in zip(axes.flat, report.results):
        steps, train, roll = _held(*gpu_series(r))
        if any(x.train_gpus + x.rollout_gpus > r.num_gpus for x in r.records):  # time-shared (colocated)
            ax.step(steps, train, where="post", label="training")
            ax.step(steps, roll, where="post", label="rollout")
        else:
            ax.stackplot(steps, train, roll, labels=["training", "rollout"], step="post")
        ax.axhline(r.num_gpus, color="grey", linestyle=":", linewidth=1, label="all GPUs")
        ax.set_title(r.name + (f" (= {same[r.name]})" if r.name in same else ""), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        _integer_steps(ax)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes[0][0].set_ylabel("GPUs")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(
        "GPUs training vs rolling out per step, mean over each stage\n(colocated: the same GPUs take turns; "
        "below the dotted line: GPUs no side holds)",
        fontsize=10,
    )
    fig.tight_layout()
    paths.append(out / "allocation.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 5))
    bars = breakdown_series(report)
    names = bars.pop("policy")
    width = 0.2
    offsets = (-1.5 * width, -0.5 * width, 0.5 * width, 1.5 * width)
    for offset, (label, heights) in zip(offsets, bars.items(), strict=True):
        ax.bar(
            [x + offset for x in range(len(names))],
            [math.nan if h is None else h for h in heights],
            width,
            label=label,
        )
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(
        [n + (f"\n(= {same[n]})" if n in same else "") for n in names], rotation=30, ha="right", fontsize=8
    )
    ax.set_ylabel("seconds")
    ax.set_title(
        "Mean seconds per step: each side; the steady stage (asynchronous: the longer side, colocated: both);\n"
        "the run's wall time over its steps (the table's 'step s': the pipeline's fill and drain included)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(out / "breakdown.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def write_report(report: SimReport, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [write_json(report, out / "report.json"), *write_plots(report, out)]
