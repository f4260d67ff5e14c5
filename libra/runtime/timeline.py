"""`timeline.png`: one row per worker (rollout instances, the trainer), coloured spans for rollout, training and
switching (engine start/stop, weight loads); white is idle."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from libra.runtime.clock import Span
from libra.spec.files import write_whole

COLOURS = {"rollout": "#4c72b0", "train": "#dd8452", "switching": "#c44e52", "weights": "#8172b3"}


def draw_timeline(spans: Sequence[Span], path: Path, *, title: str = "libra run") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    workers = sorted({s.worker for s in spans}, key=lambda w: (not w.startswith("train"), w))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.45 * max(1, len(workers))))
    for row, worker in enumerate(workers):
        for s in spans:
            if s.worker == worker and s.end_s > s.start_s:
                ax.broken_barh([(s.start_s, s.end_s - s.start_s)], (row - 0.4, 0.8), color=COLOURS.get(s.kind, "grey"))
    ax.set_yticks(range(len(workers)), workers)
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    ax.set_title(title)
    ax.legend(
        handles=[Patch(color=c, label=k) for k, c in COLOURS.items()] + [Patch(color="white", label="idle")],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=5,
        frameon=False,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    write_whole(path, buf.getvalue())
