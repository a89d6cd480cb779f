"""Live bytes per step from intervals: the one sweep every memory analysis uses."""

from __future__ import annotations

from typing import Iterable


def live_per_step(steps: int, intervals: Iterable[tuple[int, int, int]]) -> list[int]:
    """``intervals``: (first step, last step, bytes), both ends inclusive and clamped to
    ``[0, steps - 1]``; returns the bytes live at each step."""
    delta = [0] * (steps + 1)
    for start, stop, nbytes in intervals:
        start = min(max(start, 0), steps - 1)
        stop = min(max(stop, start), steps - 1)
        delta[start] += nbytes
        delta[stop + 1] -= nbytes
    live, acc = [], 0
    for d in delta[:-1]:
        acc += d
        live.append(acc)
    return live
