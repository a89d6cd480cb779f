"""DSGRAPH_TEST_FAIL_PASS for the required pass, allreduce, on 2 gloo ranks (and grad_pool
inside a data-parallel pipeline): the documented behaviour is a raise on every rank naming
the pass, whatever ``fallback`` says, never a stock compile (which would train each rank on
its local gradients). The job runs under a timeout, so a hang fails the test.

A collective-plan mismatch between ranks (a different ``bucket_mb`` per rank) is tested in
tests/dist/test_allreduce_dist.py::test_plan_mismatch_raises_instead_of_hanging
(ReplicaMismatchError on every rank naming the first differing line, under a timeout).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist"))

from launch import run_workers  # noqa: E402

pytestmark = pytest.mark.dist


def test_a_failing_pass_in_a_data_parallel_pipeline_is_raised_on_every_rank():
    per_rank = run_workers("fail_pass", timeout=150, worker=Path(__file__).with_name("fault_worker.py"))
    for rank, checks in enumerate(per_rank):
        assert len(checks) == 3 * 2 * 3 + 1, checks
        failed = [f"rank {rank}: {c['name']}: {c['detail']}" for c in checks if not c["ok"]]
        assert not failed, "\n".join(failed)
