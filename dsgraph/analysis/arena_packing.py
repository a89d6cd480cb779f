"""Packing the arena's blocks: best fit at the size hints, offsets as sympy expressions
that stay valid at every size, and the split of a graph's blocks into buffers over time.
The reasoning is in ``dsgraph/analysis/arena_plan.py``'s docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy

from .sweep import live_per_step


@dataclass(eq=False)
class ArenaBlock:
    slot: Any
    start: int
    end: int
    size: int  # aligned, at the hints
    size_expr: sympy.Expr
    offset: int = 0
    below: list["ArenaBlock"] = field(default_factory=list)  # live at the same time, lower


def best_fit(blocks: list[ArenaBlock]) -> None:
    """Place blocks at hint offsets: in allocation order (larger first at the same node),
    each in the smallest gap among the blocks live with it that holds it, else on top.
    Records for each block the blocks live at the same time that end below it."""
    for b in blocks:
        b.below = []
    live: list[ArenaBlock] = []
    for b in sorted(blocks, key=lambda b: (b.start, -b.size)):
        live = [p for p in live if p.end >= b.start]  # placed ones started no later than b
        best, cursor = None, 0
        for p in sorted(live, key=lambda p: p.offset):
            gap = p.offset - cursor
            if gap >= b.size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, p.offset + p.size)
        b.offset = best[1] if best is not None else cursor
        for p in live:
            if p.offset + p.size <= b.offset:
                b.below.append(p)
            else:
                p.below.append(b)
        live.append(b)


def symbolic_offsets(blocks: list[ArenaBlock]) -> tuple[dict[ArenaBlock, sympy.Expr], sympy.Expr, int]:
    """Offsets as expressions that keep best fit's order of every pair of blocks live at
    the same time (valid at any sizes); also the arena's size, as an expression and at the
    hints. Hint offsets are lowered to the expressions' values (never above best fit's)."""
    exprs: dict[ArenaBlock, sympy.Expr] = {}
    below = {b: set(b.below) for b in blocks}
    for b in sorted(blocks, key=lambda b: b.offset):
        # X below Z below b: Z's offset already covers X (fewer Max arguments)
        direct = [x for x in b.below if not any(x in below[z] for z in b.below)]
        if direct:
            b.offset = max(x.offset + x.size for x in direct)
            exprs[b] = sympy.Max(*[exprs[x] + x.size_expr for x in direct])
        else:
            b.offset, exprs[b] = 0, sympy.Integer(0)
    covered = {x for b in blocks for x in b.below}
    tops = [b for b in blocks if b not in covered]
    if not tops:
        return exprs, sympy.Integer(0), 0
    total = sympy.Max(*[exprs[b] + b.size_expr for b in tops])
    return exprs, total, max(b.offset + b.size for b in tops)


def split_in_time(blocks: list[ArenaBlock], live: list[int], bound: int) -> tuple[list[list[ArenaBlock]], list[ArenaBlock]]:
    """Cut the blocks' time span into segments, each packed into its own buffer, so that
    holding a segment's buffer over its whole span keeps the estimated live bytes of the
    graph (``live``: per node, without the arena) within ``bound``.

    Greedy in node order: the open segment grows one node at a time; its estimate is the
    most bytes live outside it at one of its nodes plus the most of its blocks live at one
    of its nodes (the least its buffer can be). Past ``bound``, it is cut after the node
    of the segment that the fewest of its block bytes live across; blocks live across a
    cut keep their own allocations. Returns (segments, blocks left out)."""
    if not blocks:
        return [], []
    by_start: dict[int, list[ArenaBlock]] = {}
    for b in blocks:
        by_start.setdefault(b.start, []).append(b)
    last = max(b.end for b in blocks)
    segments: list[list[ArenaBlock]] = []
    dropped: list[ArenaBlock] = []
    seg_start = min(by_start)

    def close(cut: int) -> None:
        members = [b for t in range(seg_start, cut + 1) for b in by_start.get(t, ())]
        segments.append([b for b in members if b.end <= cut])
        dropped.extend(b for b in members if b.end > cut)

    while True:
        active: list[ArenaBlock] = []
        crossing: list[int] = []  # per node of the segment: its block bytes live past that node
        most_outside = most_inside = 0
        cut = None
        for t in range(seg_start, last + 1):
            active += by_start.get(t, ())
            inside = sum(b.size for b in active)
            most_inside = max(most_inside, inside)
            most_outside = max(most_outside, live[t] - sum(b.slot.nbytes for b in active))
            active = [b for b in active if b.end > t]
            crossing.append(sum(b.size for b in active))
            if most_outside + most_inside > bound and t > seg_start:
                fewest = min(crossing[:-1])
                cut = seg_start + max(i for i, c in enumerate(crossing[:-1]) if c == fewest)
                break
        if cut is None:
            close(last)
            break
        close(cut)
        seg_start = cut + 1
    return [seg for seg in segments if seg], dropped


def _outside(segment: list[ArenaBlock], live: list[int]) -> int:
    """Most bytes live outside the segment's blocks at one node of its span."""
    start, end = min(b.start for b in segment), max(b.end for b in segment)
    inside = live_per_step(end + 1, ((b.start, b.end, b.slot.nbytes) for b in segment))
    return max(live[t] - inside[t] for t in range(start, end + 1))
