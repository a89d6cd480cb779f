"""The checkpoint solver on plain numbers: the DP frontier equals exhaustive enumeration,
and selection by budget is monotone."""

import random

import pytest

from dsgraph.recompute.solver import Terms, evaluate, exhaustive, frontier, pareto_dp


def random_instance(rng, segments, options):
    rows = []
    for _ in range(segments):
        row = []
        for _ in range(rng.randint(1, options)):
            row.append(Terms(saved=rng.randint(0, 100), forward=rng.randint(0, 80),
                             backward=rng.randint(0, 120), seconds=rng.choice([0.0, 0.5, 1.0, 2.5, rng.random()])))
        rows.append(row)
    return rows, rng.randint(0, 150)


@pytest.mark.parametrize("seed", range(40))
def test_dp_frontier_equals_exhaustive(seed):
    rng = random.Random(seed)
    rows, const = random_instance(rng, rng.randint(1, 7), 3)
    dp = pareto_dp(rows, const)
    ex = exhaustive(rows, const)
    assert [(p.peak, p.seconds) for p in dp] == [(p.peak, p.seconds) for p in ex]
    for p in dp:  # every DP point is what its choice really costs
        q = evaluate(rows, const, p.choice)
        assert (q.peak, q.seconds) == (p.peak, p.seconds)


def test_frontier_is_strictly_decreasing_in_peak():
    rng = random.Random(7)
    rows, const = random_instance(rng, 6, 3)
    points = pareto_dp(rows, const)
    assert len(points) > 1
    for a, b in zip(points, points[1:]):
        assert a.seconds < b.seconds or (a.seconds == b.seconds and a.peak > b.peak)
        assert b.peak < a.peak


def test_coarse_resolution_still_reports_exact_costs():
    rng = random.Random(3)
    rows, const = random_instance(rng, 8, 3)
    for p in pareto_dp(rows, const, resolution=16):
        q = evaluate(rows, const, p.choice)
        assert (q.peak, q.seconds) == (p.peak, p.seconds)


def test_frontier_drops_dominated_points():
    from dsgraph.recompute.solver import Point

    pts = [Point(10, 1.0, (0,)), Point(12, 2.0, (1,)), Point(5, 3.0, (2,)), Point(5, 4.0, (3,))]
    assert [p.choice for p in frontier(pts)] == [(0,), (2,)]


@pytest.mark.parametrize("seed", range(30))
def test_dp_equals_exhaustive_with_spans_and_shared_boundaries(seed):
    rng = random.Random(100 + seed)
    m = rng.randint(2, 7)
    rows = []
    for pos in range(m):
        row = []
        for _ in range(rng.randint(1, 3)):
            row.append(Terms(rng.randint(0, 60), rng.randint(0, 80), rng.randint(0, 120), rng.choice([0.0, 1.0, rng.random()]),
                             carried_in=rng.randint(0, 40), saves_in=rng.random() < 0.5, saves_out=rng.random() < 0.3))
        for length in range(2, m - pos + 1):
            if rng.random() < 0.5:
                row.append(Terms(rng.randint(0, 20), rng.randint(0, 80), rng.randint(0, 200), rng.random() * 3,
                                 carried_in=rng.randint(0, 40), saves_in=True, length=length))
        rows.append(row)
    first_in = rng.random() < 0.5
    dp = pareto_dp(rows, 30, first_in_saved=first_in)
    ex = exhaustive(rows, 30, first_in)
    assert [(p.peak, p.seconds) for p in dp] == [(p.peak, p.seconds) for p in ex]
    for p in dp:
        q = evaluate(rows, 30, p.choice, first_in)
        assert (q.peak, q.seconds) == (p.peak, p.seconds)
