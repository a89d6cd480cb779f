"""Choose one option per segment: the least recomputation time for each predicted peak.

The peak model is additive over segments. With ``S_k`` the bytes saved by segments
``0..k`` (in forward order), the step's live bytes are bounded by

    const                                  (the prefix, the start and the end of the step)
    S_{k-1} + F_k(option_k)                while segment k runs forward
    S_k     + R_k(option_k)                while segment k runs backward (later segments'
                                           saved activations are freed by then)

``F`` and ``R`` (what is live besides the saved activations of earlier segments) come from
simulating the step (``dsgraph.recompute.model``). The peak of a plan is the largest of
these terms. ``pareto_dp`` computes the Pareto frontier (peak, time) over all plans with a
dynamic program over the segments whose state is (S, running peak, time): a state that is
no better in all three than another is dropped, which keeps the frontier exact.
(The state also remembers whether the last option saved its outgoing boundary tensor,
which decides whether the next segment is charged for it.) ``resolution`` merges states whose bytes agree to that many bytes (a speed knob; 1 is
exact). ``exhaustive`` enumerates every plan and is what the tests hold the DP against.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Terms:
    """One option of one segment in the peak model.

    The tensor entering segment k (its boundary tensor) may be saved by segment k's option
    (``saves_in``) or by segment k-1's (``saves_out``); it is charged once, to segment k,
    when either saves it (``carried_in`` bytes)."""

    saved: int  # bytes it saves besides the boundary tensors at its two ends
    forward: int  # F: live besides earlier segments' saved bytes while it runs forward
    backward: int  # R: live besides saved bytes of segments <= k while it runs backward
    seconds: float  # recomputation time
    carried_in: int = 0
    saves_in: bool = False
    saves_out: bool = False
    length: int = 1  # segments it covers (a span recomputed from its first boundary tensor)

    def charge(self, previous_saves_out: bool) -> int:
        return self.saved + (self.carried_in if (self.saves_in or previous_saves_out) else 0)


@dataclass(frozen=True)
class Point:
    peak: int
    seconds: float
    choice: tuple[int, ...]  # option index at each position the plan visits


def _path(options_at: list[list[Terms]], choice: tuple[int, ...]):
    pos = 0
    for i in choice:
        t = options_at[pos][i]
        yield t
        pos += t.length
    if pos != len(options_at):
        raise ValueError(f"choice {choice} covers {pos} of {len(options_at)} segments")


def charges(options_at: list[list[Terms]], choice: tuple[int, ...], first_in_saved: bool = False) -> list[int]:
    """Bytes each chosen option adds to what is saved, boundary tensors counted once."""
    out, prev = [], first_in_saved
    for t in _path(options_at, choice):
        out.append(t.charge(prev))
        prev = t.saves_out
    return out


def evaluate(options_at: list[list[Terms]], const: int, choice: tuple[int, ...], first_in_saved: bool = False) -> Point:
    """The model's peak and time of one plan, computed directly (no recurrence)."""
    peak, saved, seconds = const, 0, 0.0
    for t, c in zip(_path(options_at, choice), charges(options_at, choice, first_in_saved)):
        peak = max(peak, saved + t.forward, saved + c + t.backward)
        saved += c
        seconds += t.seconds
    return Point(peak, seconds, tuple(choice))


def frontier(points: list[Point]) -> list[Point]:
    """Pareto-minimal points, by increasing time (so decreasing peak)."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.seconds, p.peak, p.choice)):
        if not out or p.peak < out[-1].peak:
            out.append(p)
    return out


def exhaustive(options_at: list[list[Terms]], const: int, first_in_saved: bool = False) -> list[Point]:
    def paths(pos):
        if pos == len(options_at):
            yield ()
            return
        for i, t in enumerate(options_at[pos]):
            if pos + t.length <= len(options_at):
                for rest in paths(pos + t.length):
                    yield (i,) + rest

    return frontier([evaluate(options_at, const, c, first_in_saved) for c in paths(0)])


def pareto_dp(options_at: list[list[Terms]], const: int, resolution: int = 1, first_in_saved: bool = False) -> list[Point]:
    """``options_at[k]``: the options starting at segment k (a span covers ``length``)."""
    m = len(options_at)
    # state: (saved S, running peak M, seconds, back pointer, last option saves its outgoing
    # boundary tensor); back pointers are (previous back pointer, option index) chains
    buckets: list[dict[tuple, tuple]] = [dict() for _ in range(m + 1)]
    buckets[0][(0, 0, first_in_saved)] = (0, const, 0.0, None, first_in_saved)
    for pos in range(m):
        states = _prune(list(buckets[pos].values()))
        buckets[pos] = {}
        for t_index, t in enumerate(options_at[pos]):
            target = pos + t.length
            if target > m:
                continue
            best = buckets[target]
            charge, charge_after_out = t.charge(False), t.charge(True)  # by the previous option's saves_out
            forward, backward, seconds, saves_out = t.forward, t.backward, t.seconds, t.saves_out
            for s, mx, sec, back, prev_out in states:
                s2 = s + (charge_after_out if prev_out else charge)
                m2 = mx
                if s + forward > m2:
                    m2 = s + forward
                if s2 + backward > m2:
                    m2 = s2 + backward
                sec2 = sec + seconds
                key = (s2 // resolution, m2 // resolution, saves_out)
                old = best.get(key)
                if old is None or (sec2, m2, s2) < (old[2], old[1], old[0]):
                    best[key] = (s2, m2, sec2, (back, t_index), saves_out)
    points = []
    for s, mx, sec, back, _ in _prune(list(buckets[m].values())):
        choice = []
        while back is not None:
            back, i = back
            choice.append(i)
        points.append(Point(mx, sec, tuple(reversed(choice))))
    return frontier(points)


def _prune(states: list[tuple]) -> list[tuple]:
    """Drop states another state beats or equals in saved bytes, peak and time. A state
    whose last option saves its outgoing boundary tensor can dominate only states that
    also do (the next segment may be charged for that tensor otherwise).

    States are taken by increasing time, so a state is dominated exactly when an earlier
    kept one has no more saved bytes and no higher peak: a staircase query (the kept
    states' (S, M) Pareto front, M falling as S grows), one per boundary flag."""
    states.sort(key=lambda st: (st[2], st[1], st[0], st[4]))
    fronts = {False: _Staircase(), True: _Staircase()}
    kept: list[tuple] = []
    for st in states:
        s, m, out = st[0], st[1], st[4]
        if fronts[False].dominates(s, m) or (out and fronts[True].dominates(s, m)):
            continue
        fronts[out].add(s, m)
        kept.append(st)
    return kept


class _Staircase:
    """(S, M) points, none dominating another: S ascending, M strictly descending."""

    def __init__(self) -> None:
        self.s: list[int] = []
        self.m: list[int] = []

    def dominates(self, s: int, m: int) -> bool:
        i = bisect.bisect_right(self.s, s) - 1  # the point with the largest S <= s has the least M
        return i >= 0 and self.m[i] <= m

    def add(self, s: int, m: int) -> None:
        i = bisect.bisect_left(self.s, s)
        j = i
        while j < len(self.s) and self.m[j] >= m:  # points it now dominates
            j += 1
        self.s[i:j] = [s]
        self.m[i:j] = [m]
