"""The checkpoint planner's forked evaluation workers (dsgraph.recompute.workers): plans
with workers are the plans without them, a worker that dies leaves the results exact, the
worker count is read and checked."""

import os
import signal

import pytest

from dsgraph.analysis.step_model import StepModel
from dsgraph.errors import BudgetError
from dsgraph.recompute import truth, workers
from dsgraph.recompute.options import POLICIES
from dsgraph.recompute.planner import MAX_RELAXED, plan_checkpoint
from tests import zoo

pytestmark = pytest.mark.skipif(not workers.can_fork(), reason="the workers are forked processes (Linux)")


@pytest.fixture(scope="module")
def joint():
    model, inputs = zoo.build("gated")
    return truth.capture_joint(model, inputs)


def _plan(j, budget, executor, count):
    return plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, budget, executor=executor, workers=count)


@pytest.mark.parametrize("executor", ["inductor", "fx"])
def test_plans_with_workers_are_the_plans_without(joint, executor):
    """At a budget between the stock peak and the smallest plan, and at the smallest plan:
    the same candidates (names, exact peaks, prices), saved values and prediction with 1, 2
    and 3 worker processes. The evaluation counts may differ by the relaxed intervals only:
    workers try an interval's cheaper options together, the planner's process one at a time
    until one is taken (``search.relax``)."""
    stock = _plan(joint, 1 << 50, executor, 1).stock_peak
    with pytest.raises(BudgetError) as info:
        _plan(joint, 1, executor, 1)
    smallest = info.value.smallest_feasible
    for budget in ((stock + smallest) // 2, smallest):
        plans = [_plan(joint, budget, executor, count) for count in (1, 2, 3)]
        first = plans[0]
        assert first.regions, "the budget must make the planner recompute something"
        for other in plans[1:]:
            assert other.candidates == first.candidates
            assert [s.name for s in other.saved] == [s.name for s in first.saved]
            assert other.predicted_peak == first.predicted_peak
            assert first.evaluations <= other.evaluations <= first.evaluations + MAX_RELAXED * (len(POLICIES) - 2)
    # the smallest plan is found with workers as without
    with pytest.raises(BudgetError) as info:
        _plan(joint, 1, executor, 2)
    assert info.value.smallest_feasible == smallest


def test_a_dead_worker_leaves_every_result_exact(joint):
    """A worker killed before it answers: its plan and every later one are evaluated in the
    planner's process, equal to the model's own evaluation; the workers are reaped."""
    j = joint
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], j.kwargs.get("static_lifetime_input_indices") or [])
    by_name = {n.name: n for n in j.gm.graph.nodes}
    stock = [model.index[by_name[n]] for n in j.stock_saved]
    saved_sets = [stock[:k] for k in range(0, len(stock), max(1, len(stock) // 6))]
    expected = [model.evaluate(s, "inductor") for s in saved_sets]
    pool = workers.Workers(model, "inductor", 2)
    pids = [pid for pid, _, _ in pool.procs]
    try:
        assert pool.evaluate(saved_sets[:2]) and not pool.broken
        os.kill(pids[0], signal.SIGKILL)
        got = pool.evaluate(saved_sets)
    finally:
        pool.close()
    assert pool.broken
    assert [g.peak for g in got] == [e.peak for e in expected]
    assert [g.live for g in got] == [e.live for e in expected]
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_fork_with_threads_running_warns_nobody(joint):
    """Python 3.12+ warns when a process with threads forks; the planner's forks do not
    raise under ``-W error`` (the warning would come after the child exists)."""
    import threading
    import warnings

    j = joint
    model = StepModel(j.gm, j.kwargs["num_fwd_outputs"], j.kwargs.get("static_lifetime_input_indices") or [])
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with workers.Workers(model, "inductor", 2) as pool:
                assert len(pool.procs) == 2
                assert [p.peak for p in pool.evaluate([[], []])] == [model.evaluate([], "inductor").peak] * 2
    finally:
        stop.set()
        thread.join()


def test_worker_count(monkeypatch):
    monkeypatch.setenv(workers.ENV, "3")
    assert workers.default_workers() == 3
    for bad in ("0", "two"):
        monkeypatch.setenv(workers.ENV, bad)
        with pytest.raises(ValueError, match=workers.ENV):
            workers.default_workers()
    monkeypatch.delenv(workers.ENV)
    assert 1 <= workers.default_workers() <= workers.MAX_WORKERS
    model, inputs = zoo.build("gated")
    j = truth.capture_joint(model, inputs)
    with pytest.raises(ValueError, match="workers"):
        plan_checkpoint(j.gm, j.joint_inputs, j.kwargs, 1 << 50, workers=0)
