"""What the three plots of a simulation report show, read back from the matplotlib figures `write_plots` saves: the
axes' labels and titles, one line, area or bar group per policy with its name, the data each draws (the series of
tests/sim/test_report_summary.py), and the grid of small plots with its spare cells hidden."""

from __future__ import annotations

import pytest
from test_report_summary import _fields, _run, _stage

from libra.sim import PolicyResult, SimReport
from libra.sim.report import breakdown_series, gpu_series, throughput_series, write_plots


def _report() -> SimReport:
    """Five policies (a grid of 4 x 2 small plots, three of them spare); `shared` holds more GPUs than the cluster
    has, training and rolling out in turn on the same GPUs, as `colocated` does."""
    run = _run()
    runs = [PolicyResult(name=f"p{i}", records=run.records, decisions=(), num_gpus=16) for i in range(4)]
    both = {"train_gpus": 16, "rollout_gpus": 16}
    turns = tuple(_stage(x.step, x.start, x.end, **{**_fields(x), **both}) for x in run.records)
    runs.append(PolicyResult(name="shared", records=turns, decisions=(), num_gpus=16))
    return SimReport(workload="w", num_gpus=16, num_steps=2, seed=0, results=tuple(runs), elapsed_s=0.0)


@pytest.fixture
def figures(tmp_path, monkeypatch):
    """The figures `write_plots` saved, by file name."""
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    report = _report()
    paths = write_plots(report, tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "allocation.png", "breakdown.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    return report, dict(zip([p.name for p in paths], saved, strict=True))


def test_the_throughput_plot_draws_one_named_line_per_policy(figures) -> None:
    report, figs = figures
    (ax,) = figs["throughput.png"].axes
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "tokens / s (stage)"
    assert ax.get_title() == "w, 16 GPUs: throughput per step"
    assert [line.get_label() for line in ax.get_lines()] == ["p0", "p1", "p2", "p3", "shared"]
    for line, r in zip(ax.get_lines(), report.results, strict=True):
        steps, rates = throughput_series(r)
        assert list(line.get_xdata()) == steps and list(line.get_ydata()) == rates
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p0", "p1", "p2", "p3", "shared"]


def test_the_allocation_plot_stacks_each_side_or_draws_turns_as_steps(figures) -> None:
    report, figs = figures
    fig = figs["allocation.png"]
    assert len(fig.axes) == 8  # 4 columns, 2 rows
    assert fig.get_suptitle() == "GPUs training vs rolling out per step (colocated: the same GPUs take turns)"
    shown, spare = fig.axes[:5], fig.axes[5:]
    assert [ax.get_title() for ax in shown] == ["p0", "p1", "p2", "p3", "shared"]
    assert all(ax.get_xlabel() == "step" for ax in shown) and all(ax.axison for ax in shown)
    assert not any(ax.axison for ax in spare)
    assert shown[0].get_ylabel() == "GPUs"
    assert [t.get_text() for t in shown[0].get_legend().get_texts()] == ["training", "rollout"]
    assert all(ax.get_legend() is None for ax in shown[1:])
    steps, train, roll = gpu_series(report.results[0])
    stacked = shown[0].collections  # two areas, training under rollout
    assert [c.get_label() for c in stacked] == ["training", "rollout"] and not shown[0].get_lines()
    top = stacked[1].get_paths()[0].vertices[:, 1]
    assert max(top) == pytest.approx(max(t + r for t, r in zip(train, roll, strict=True)))
    turns = shown[4]  # more GPUs than the cluster: two step lines, not stacked
    assert not turns.collections
    lines = turns.get_lines()
    assert [line.get_label() for line in lines] == ["training", "rollout"]
    assert all(line.get_drawstyle() == "steps-post" for line in lines)
    steps, train, roll = gpu_series(report.results[4])
    assert list(lines[0].get_ydata()) == train and list(lines[1].get_ydata()) == roll
    assert list(lines[0].get_xdata()) == steps


def test_the_breakdown_plot_draws_three_bars_per_policy_side_by_side(figures) -> None:
    report, figs = figures
    (ax,) = figs["breakdown.png"].axes
    assert ax.get_ylabel() == "seconds"
    assert ax.get_title() == "Step-time breakdown (asynchronous: step = max of both sides; colocated: their sum)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["p0", "p1", "p2", "p3", "shared"]
    assert all(t.get_rotation() == 30 for t in ax.get_xticklabels())
    assert list(ax.get_xticks()) == [0, 1, 2, 3, 4]
    bars = breakdown_series(report)
    groups = ax.containers
    assert [g.get_label() for g in groups] == ["rollout", "training", "step (wall)"]
    for offset, group, label in zip((-0.27, 0.0, 0.27), groups, ("rollout", "training", "step (wall)"), strict=True):
        assert [b.get_height() for b in group] == bars[label]
        assert [b.get_x() + b.get_width() / 2 for b in group] == pytest.approx([i + offset for i in range(5)])
        assert all(b.get_width() == pytest.approx(0.27) for b in group)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rollout", "training", "step (wall)"]
