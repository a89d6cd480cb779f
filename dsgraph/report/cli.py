"""Command line: ``dsgraph report <dump dir>`` (or ``python -m dsgraph report <dump dir>``).

Prints the per-pass table of a dump folder and renders its memory plots (one PNG per
whole-step timeline, one per graph) from the CSV files the dump holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import plots
from .dumps import step_series_label
from .reports import GraphReport, PassRecord, format_table


def _load_reports(root: str) -> list[GraphReport]:
    path = os.path.join(root, "reports.json")
    if not os.path.exists(path):
        raise SystemExit(f"{root} holds no reports.json: not a dsgraph dump folder (or written by an older dsgraph)")
    with open(path) as f:
        data = json.load(f)
    out = []
    for r in data["reports"]:
        passes = [PassRecord(**p) for p in r.pop("passes")]
        out.append(GraphReport(**r, passes=passes))
    return out


def report(root: str) -> list[str]:
    """Print the pass table; render the PNGs; return the paths written."""
    print(format_table(_load_reports(root)))
    written = []
    if not plots.have_matplotlib():
        print("\nmatplotlib is not installed (pip install 'dsgraph[plot]'): no plots rendered")
        return written
    by_compile: dict[str, dict[str, list[dict]]] = {}
    for path in plots.step_csvs(root):
        name = os.path.basename(path)[: -len(".csv")]
        compile_id, label = name.split("_step_memory_")
        by_compile.setdefault(compile_id, {})[step_series_label(label)] = plots.read_step_csv(path)
    for compile_id, series in sorted(by_compile.items()):
        png = os.path.join(root, f"{compile_id}_step_memory_plot.png")
        if plots.plot_step(series, png, f"{compile_id}: live bytes over the step"):
            written.append(png)
    for entry in sorted(os.listdir(root)):
        csv_path = os.path.join(root, entry, "memory_timeline.csv")
        if os.path.isfile(csv_path):
            png = os.path.join(root, entry, "memory_timeline.png")
            if plots.plot_graph_csv(csv_path, png, f"{entry}: live bytes per node (FX order)"):
                written.append(png)
    print("\nplots:")
    for path in written:
        print(f"  {path}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsgraph", description="dsgraph's command line (also: python -m dsgraph)")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="print a dump folder's pass table and render its memory plots")
    rep.add_argument("dump_dir")
    args = parser.parse_args(argv)
    if args.command == "report":
        if not os.path.isdir(args.dump_dir):
            print(f"no such folder: {args.dump_dir}", file=sys.stderr)
            return 2
        report(args.dump_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
