"""Compile reports: what dsgraph did to each graph it compiled in this process.

``dsgraph.reports()`` returns them in compile order, the last ``MAX_REPORTS`` of the
process (a long job that recompiles often does not grow without bound; ``clear_reports``
empties the list); ``format_table`` renders the per-pass table that examples print and that
dumps put in index.md.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

from ..units import format_bytes


@dataclass
class PassRecord:
    name: str
    ms: float
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GraphReport:
    compile_id: str  # "c000": one Dynamo graph compiled by dsgraph
    kind: str  # "joint", "forward", "backward" or "inference"
    pipeline: str
    inductor: bool
    nodes_before: int = 0
    nodes_after: int = 0
    passes: list[PassRecord] = field(default_factory=list)
    # Figures from dsgraph's analyses: peak live bytes of the graph as FX would run it,
    # bytes the forward saves for backward, and what else a pass reports.
    memory: dict[str, Any] = field(default_factory=dict)
    compile_seconds: float = 0.0  # passes plus the backend compiler for this graph
    fallback: str | None = None  # why this graph was compiled stock instead

    @property
    def name(self) -> str:
        return f"{self.compile_id}_{self.kind}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


MAX_REPORTS = 1000  # graph reports kept per process, oldest dropped first

_lock = threading.Lock()
_reports: collections.deque[GraphReport] = collections.deque(maxlen=MAX_REPORTS)


def record(report: GraphReport) -> None:
    with _lock:
        _reports.append(report)


def reports() -> list[GraphReport]:
    """This process's compile reports, oldest first."""
    with _lock:
        return list(_reports)


def clear_reports() -> None:
    with _lock:
        _reports.clear()


# stats named like this are byte counts: printed with units (MiB, GiB) in tables and logs
BYTE_STAT_SUFFIXES = ("bytes", "peak", "budget", "margin", "gap", "external")


def format_stats(stats: dict[str, Any]) -> str:
    parts = []
    for k, v in stats.items():
        if isinstance(v, int) and not isinstance(v, bool) and k.endswith(BYTE_STAT_SUFFIXES):
            v = format_bytes(v)
        elif isinstance(v, float):
            v = f"{v:.3g}"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _rows(items: list[GraphReport]) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for r in items:
        if r.fallback:
            rows.append((r.name, "(stock fallback)", "", "", r.fallback))
        if not r.passes:
            rows.append((r.name, "(no passes)", "", "", f"nodes={r.nodes_after}"))
        for p in r.passes:
            rows.append((r.name, p.name, f"{p.ms:.1f}", "yes" if p.changed else "no", format_stats(p.stats)))
    return rows


def format_table(items: list[GraphReport] | None = None, markdown: bool = False) -> str:
    """One row per graph and pass: graph, pass, ms, changed, stats (plain text or Markdown)."""
    items = reports() if items is None else items
    head = ("graph", "pass", "ms", "changed", "stats")
    rows = _rows(items)
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|---" * 5 + "|"]
                         + ["| " + " | ".join(row) + " |" for row in rows])
    rows = [head] + [row[:4] + (row[4][:80] if row[1] == "(stock fallback)" else row[4],) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 5)
    return "\n".join(line.rstrip() for line in lines)
