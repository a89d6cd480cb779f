"""PNG plots of memory timelines (needs matplotlib: ``pip install dsgraph[plot]``).

Plots read the CSV files dumps write, so ``python -m dsgraph report <dir>`` can redraw
them later on any machine.
"""

from __future__ import annotations

import csv
import os
from typing import Iterable

from ..analysis.timeline import MemoryTimeline

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


def _unit(peak_bytes: float) -> tuple[str, float]:
    """The binary unit that shows this many bytes as a number between 1 and 1024."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak_bytes >= scale:
            return unit, scale
    return "B", 1


def plot_step(series: dict[str, list[dict]], path: str, title: str,
              xlabel: str = "step progress: forward, then backward") -> bool:
    """Live bytes over the step, one line per series, peaks marked. Each series is scaled
    to the same width, since passes change the number of nodes. A series equal to one drawn
    before it is drawn dashed on top and its label says so (it would hide under the other)."""
    if not have_matplotlib():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max((r["live_bytes"] for rows in series.values() for r in rows), default=1)
    unit, scale = _unit(top)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    drawn: dict[tuple, str] = {}
    boundary_labelled = False
    for z, (label, rows) in enumerate(series.items()):
        n = max(len(rows) - 1, 1)
        xs = [r["index"] / n for r in rows]
        ys = [r["live_bytes"] / scale for r in rows]
        same = drawn.get(tuple(ys))
        style, shown = ("-", label) if same is None else ((0, (4, 4)), f"{label} (same as {same})")
        drawn.setdefault(tuple(ys), label)
        (line,) = ax.plot(xs, ys, linestyle=style, label=shown, linewidth=1.2, zorder=2 + z)
        peak = max(range(len(ys)), key=ys.__getitem__)
        where = f"{rows[peak]['graph']}:{rows[peak]['node']}" if rows[peak].get("graph") else rows[peak]["node"]
        ax.plot([xs[peak]], [ys[peak]], "o", color=line.get_color(), zorder=2 + z)
        if same is None:
            ax.annotate(f"peak {ys[peak]:.3g} {unit}\n{where}", (xs[peak], ys[peak]), textcoords="offset points",
                        xytext=(5, 5), fontsize=7, color=line.get_color(), annotation_clip=False)
        boundary = next((r["index"] / n for r in rows if r.get("graph") == "backward"), None)
        if boundary is not None:
            ax.axvline(boundary, color="gray", linestyle=":", linewidth=0.8,
                       label=None if boundary_labelled else "forward | backward boundary")
            boundary_labelled = True
    ax.set_ylim(0, top / scale * 1.2)  # room for the peak labels
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"live {unit}")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
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
    return plot_step({"live bytes": rows}, png_path, title, xlabel="node, in FX execution order")


def step_csvs(root: str) -> Iterable[str]:
    for name in sorted(os.listdir(root)):
        if name.endswith(".csv") and "_step_memory_" in name:
            yield os.path.join(root, name)
