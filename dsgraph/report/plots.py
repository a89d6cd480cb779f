"""PNG plots of memory timelines (needs matplotlib: ``pip install dsgraph[plot]``).

Plots read the CSV files dumps write, so ``python -m dsgraph report <dir>`` can redraw
them later on any machine.
"""

from __future__ import annotations

import csv
import os
from typing import Iterable

from .analysis.timeline import MemoryTimeline

STEP_FIELDS = ["index", "graph", "node", "live_bytes"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401

        return True
    except ImportError:
        return False


def write_step_csv(timeline: MemoryTimeline, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STEP_FIELDS)
        for i, e in enumerate(timeline.entries):
            w.writerow([i, e.graph, e.node, e.live_bytes])


def read_step_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return [dict(row, index=int(row["index"]), live_bytes=int(row["live_bytes"])) for row in csv.DictReader(f)]


def plot_step(series: dict[str, list[dict]], path: str, title: str) -> bool:
    """Live GiB over the step, forward then backward, one line per series, peaks marked.
    Each series is scaled to the same width, since passes change the number of nodes."""
    if not have_matplotlib():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, rows in series.items():
        n = max(len(rows) - 1, 1)
        xs = [r["index"] / n for r in rows]
        ys = [r["live_bytes"] / 2**30 for r in rows]
        style = "--" if "after" in label else "-"
        (line,) = ax.plot(xs, ys, style, label=label, linewidth=1.2)
        peak = max(range(len(ys)), key=ys.__getitem__)
        ax.plot([xs[peak]], [ys[peak]], "o", color=line.get_color())
        ax.annotate(f"peak {ys[peak]:.3g} GiB\n{rows[peak]['graph']}:{rows[peak]['node']}", (xs[peak], ys[peak]),
                    textcoords="offset points", xytext=(5, 5), fontsize=7, color=line.get_color())
        boundary = next((r["index"] / n for r in rows if r["graph"] == "backward"), None)
        if boundary is not None:
            ax.axvline(boundary, color="gray", linestyle=":", linewidth=0.8)
    ax.set_xlabel("step progress (forward | backward)")
    ax.set_ylabel("live GiB")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_graph_csv(csv_path: str, png_path: str, title: str) -> bool:
    """One graph's memory_timeline.csv (live bytes per node) as a PNG."""
    if not have_matplotlib():
        return False
    with open(csv_path, newline="") as f:
        rows = [dict(r, index=int(r["index"]), live_bytes=int(r["live_bytes"]), graph="") for r in csv.DictReader(f)]
    return plot_step({"live bytes": rows}, png_path, title)


def step_csvs(root: str) -> Iterable[str]:
    for name in sorted(os.listdir(root)):
        if name.endswith(".csv") and "_step_memory_" in name:
            yield os.path.join(root, name)
