"""What the three plots of a simulation report show, read back from the matplotlib figures `write_plots` saves: the
axes' labels and titles, one line, area or bar group per policy with its name (policies with the same results drawn
once, under all their names), the data each draws (the series of tests/sim/test_report_summary.py), whole steps on
the step axes, the last stage drawn with its width, and the grid of small plots with its spare cells hidden."""

from __future__ import annotations

import json
import math

import attrs
import pytest
from test_report_summary import _fields, _run, _stage

from libra.sim import PolicyResult, SimReport
from libra.sim.report import (
    breakdown_series,
    gpu_series,
    same_results,
    throughput_series,
    write_json,
    write_plots,
)


def _scaled(run: PolicyResult, name: str, factor: int) -> PolicyResult:
    """`run` with every stage's tokens times `factor`: another policy's results."""
    records = tuple(attrs.evolve(x, tokens=x.tokens * factor) for x in run.records)
    return PolicyResult(name=name, records=records, decisions=(), num_gpus=16)


def _report(*, twins: bool = False) -> SimReport:
    """Five policies (a grid of 4 x 2 small plots, three of them spare); `shared` holds more GPUs than the cluster
    has, training and rolling out in turn on the same GPUs, as `colocated` does. With `twins`, p2 and p3 repeat p1's
    results (as the planner's ablations do when the plan is one TP degree)."""
    run = _run()
    runs = [_scaled(run, f"p{i}", min(i, 1) + 1 if twins else i + 1) for i in range(4)]
    both = {"train_gpus": 16, "rollout_gpus": 16}
    turns = tuple(_stage(x.step, x.start, x.end, **{**_fields(x), **both}) for x in run.records)
    runs.append(PolicyResult(name="shared", records=turns, decisions=(), num_gpus=16))
    return SimReport(workload="w", num_gpus=16, num_steps=2, seed=0, results=tuple(runs), elapsed_s=0.0)


def _saved_figures(tmp_path, monkeypatch, report: SimReport) -> dict:
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    paths = write_plots(report, tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "allocation.png", "breakdown.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    return dict(zip([p.name for p in paths], saved, strict=True))


@pytest.fixture
def figures(tmp_path, monkeypatch):
    """The figures `write_plots` saved, by file name."""
    report = _report()
    return report, _saved_figures(tmp_path, monkeypatch, report)


@pytest.fixture
def twin_figures(tmp_path, monkeypatch):
    report = _report(twins=True)
    return report, _saved_figures(tmp_path, monkeypatch, report)


def _whole_steps(ax) -> bool:
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def test_the_throughput_plot_draws_one_named_line_per_policy(figures) -> None:
    report, figs = figures
    (ax,) = figs["throughput.png"].axes
    assert ax.get_xlabel().startswith("step\n") and "fill" in ax.get_xlabel()  # says what step 0 is
    assert ax.get_ylabel() == "throughput (tokens / s over each stage)"
    assert ax.get_title() == "w, 16 GPUs: throughput per step"
    assert [line.get_label() for line in ax.get_lines()] == ["p0", "p1", "p2", "p3", "shared"]
    for line, r in zip(ax.get_lines(), report.results, strict=True):
        steps, rates = throughput_series(r)
        assert list(line.get_xdata()) == steps and list(line.get_ydata()) == rates
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p0", "p1", "p2", "p3", "shared"]
    assert ax.get_ylim()[0] == 0.0 and _whole_steps(ax)


def test_policies_with_the_same_results_are_one_line_under_all_their_names(twin_figures) -> None:
    """Four lines drawn on top of each other showed one colour and a legend of four (`libra simulate --steps 3`:
    static-optimal, libra-homogeneous, libra-hetero-tp and libra-cmlfq run one plan)."""
    report, figs = twin_figures
    (ax,) = figs["throughput.png"].axes
    assert [line.get_label() for line in ax.get_lines()] == ["p0", "p1 = p2 = p3", "shared"]
    assert list(ax.get_lines()[1].get_ydata()) == throughput_series(report.results[1])[1]
    shown = figs["allocation.png"].axes[:5]
    assert [a.get_title() for a in shown] == ["p0", "p1", "p2 (= p1)", "p3 (= p1)", "shared"]
    (bars,) = figs["breakdown.png"].axes
    labels = [t.get_text() for t in bars.get_xticklabels()]
    assert labels == ["p0", "p1", "p2\n(= p1)", "p3\n(= p1)", "shared"]


def test_report_json_names_the_policies_with_the_same_results(tmp_path) -> None:
    report = _report(twins=True)
    assert same_results(report) == [["p1", "p2", "p3"]]
    saved = json.loads(write_json(report, tmp_path / "report.json").read_text())
    assert saved["same_results"] == [["p1", "p2", "p3"]]
    assert set(saved["policies"]) == {"p0", "p1", "p2", "p3", "shared"}
    assert same_results(_report()) == []


def test_the_allocation_plot_stacks_each_side_or_draws_turns_as_steps(figures) -> None:
    report, figs = figures
    fig = figs["allocation.png"]
    assert len(fig.axes) == 8  # 4 columns, 2 rows
    assert fig.get_suptitle().startswith("GPUs training vs rolling out per step, mean over each stage")
    shown, spare = fig.axes[:5], fig.axes[5:]
    assert [ax.get_title() for ax in shown] == ["p0", "p1", "p2", "p3", "shared"]
    assert all(ax.get_xlabel() == "step" for ax in shown) and all(ax.axison for ax in shown)
    assert all(_whole_steps(ax) for ax in shown)
    assert not any(ax.axison for ax in spare)
    assert shown[0].get_ylabel() == "GPUs"
    assert [t.get_text() for t in shown[0].get_legend().get_texts()] == ["training", "rollout", "all GPUs"]
    assert all(ax.get_legend() is None for ax in shown[1:])
    steps, train, roll = gpu_series(report.results[0])
    stacked = shown[0].collections  # two areas, training under rollout
    assert [c.get_label() for c in stacked] == ["training", "rollout"]
    (cluster,) = shown[0].get_lines()  # the cluster's GPUs, a dotted line: what lies under it is held by no side
    assert list(cluster.get_ydata()) == [16, 16] and cluster.get_linestyle() == ":"
    top = stacked[1].get_paths()[0].vertices
    assert max(top[:, 1]) == pytest.approx(max(t + r for t, r in zip(train, roll, strict=True)))
    assert max(top[:, 0]) == steps[-1] + 1  # the last stage (the drain) spans [2, 3)
    turns = shown[4]  # more GPUs than the cluster: two step lines, not stacked
    assert not turns.collections
    lines = turns.get_lines()
    assert [line.get_label() for line in lines] == ["training", "rollout", "all GPUs"]
    assert all(line.get_drawstyle() == "steps-post" for line in lines[:2])
    steps, train, roll = gpu_series(report.results[4])
    assert list(lines[0].get_ydata()) == [*train, train[-1]] and list(lines[1].get_ydata()) == [*roll, roll[-1]]
    assert list(lines[0].get_xdata()) == [*steps, steps[-1] + 1]


def test_the_breakdown_plot_draws_four_bars_per_policy_side_by_side(figures) -> None:
    report, figs = figures
    (ax,) = figs["breakdown.png"].axes
    assert ax.get_ylabel() == "seconds"
    title = ax.get_title()
    assert "steady stage" in title and "fill and drain included" in title
    assert "step = max of both sides" not in title  # the wall-time bar is not that: it counts the fill and the drain
    assert [t.get_text() for t in ax.get_xticklabels()] == ["p0", "p1", "p2", "p3", "shared"]
    assert all(t.get_rotation() == 30 for t in ax.get_xticklabels())
    assert list(ax.get_xticks()) == [0, 1, 2, 3, 4]
    bars = breakdown_series(report)
    labels = ["rollout", "training", "steady stage (wall)", "run wall / steps"]
    groups = ax.containers
    assert [g.get_label() for g in groups] == labels
    for offset, group, label in zip((-0.3, -0.1, 0.1, 0.3), groups, labels, strict=True):
        assert [b.get_height() for b in group] == bars[label]
        assert [b.get_x() + b.get_width() / 2 for b in group] == pytest.approx([i + offset for i in range(5)])
        assert all(b.get_width() == pytest.approx(0.2) for b in group)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels


def test_a_one_step_run_draws_no_steady_stage(tmp_path, monkeypatch) -> None:
    one = PolicyResult(name="p", records=_run().records[:1], decisions=(), num_gpus=16)
    report = SimReport(workload="w", num_gpus=16, num_steps=1, seed=0, results=(one,), elapsed_s=0.0)
    assert breakdown_series(report)["steady stage (wall)"] == [None]
    figs = _saved_figures(tmp_path, monkeypatch, report)
    (ax,) = figs["breakdown.png"].axes
    assert math.isnan(ax.containers[2][0].get_height())
