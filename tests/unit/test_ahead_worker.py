"""compile_ahead's worker process (compile/ahead_worker.py): jobs run there and their
results, or their exceptions with the worker's traceback, come back; a worker that exits
fails its pending jobs with a true message, and the next request starts a new one."""

import os

import pytest

from dsgraph.compile import ahead_worker


def _pid_and_sum(a, b):
    return os.getpid(), a + b


def _raise(message):
    raise ValueError(message)


def _exit():
    os._exit(3)


@pytest.fixture(scope="module")
def worker():  # one start for the file (seconds each); the last test shuts it down
    w = ahead_worker.Worker()
    yield w
    w.shutdown()


def test_a_job_runs_in_another_process_and_its_result_comes_back(worker):
    pid, total = worker.submit(_pid_and_sum, 2, 3).result(timeout=120)
    assert total == 5
    assert pid == worker.process.pid != os.getpid()
    # jobs are answered by id, several in flight at once
    futures = [worker.submit(_pid_and_sum, i, i) for i in range(4)]
    assert [f.result(timeout=60)[1] for f in futures] == [0, 2, 4, 6]


def test_an_exception_comes_back_with_the_workers_traceback(worker):
    with pytest.raises(ValueError, match="boom") as info:
        worker.submit(_raise, "boom").result(timeout=120)
    assert "in dsgraph's compile worker" in info.value.__notes__[0]
    assert "_raise" in info.value.__notes__[0]
    assert worker.submit(_pid_and_sum, 1, 1).result(timeout=60)[1] == 2  # still serving


def test_a_worker_that_exits_fails_its_jobs_and_a_new_one_is_started():
    first = ahead_worker.worker()
    assert ahead_worker.worker() is first
    with pytest.raises(ahead_worker.WorkerExited, match="code 3"):
        first.submit(_exit).result(timeout=120)
    first.process.wait(timeout=30)
    assert not first.alive()
    second = ahead_worker.worker()
    assert second is not first
    assert second.submit(_pid_and_sum, 4, 5).result(timeout=120)[1] == 9


def test_shutdown_ends_an_idle_worker(worker):
    worker.submit(_pid_and_sum, 0, 0).result(timeout=120)
    worker.shutdown()
    assert worker.process.returncode == 0
    assert not worker.alive()
