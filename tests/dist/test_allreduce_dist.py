"""Data parallelism on 2 gloo processes (CPU), against torch's DistributedDataParallel.

Each scenario is one 2-process job (worker.py) bounded by a timeout, so a hang fails the
test instead of blocking CI; the checks it made are asserted here, one test per topic.
Graphs run as FX code (inductor=False) except in the Inductor scenario, which checks the
order of collectives, waits and compute in Inductor's generated code.
"""

import pytest

from launch import run_workers

pytestmark = pytest.mark.dist

_cache: dict[str, list[list[dict]]] = {}


# scenarios whose processes need more than the launcher's environment
_ENV = {"lowered": {"TRITON_INTERPRET": "1"}, "lowered_inductor": {"TRITON_INTERPRET": "1"}}  # Triton on the CPU


def results(scenario: str, timeout: float) -> list[list[dict]]:
    if scenario not in _cache:
        _cache[scenario] = run_workers(scenario, timeout=timeout, env=_ENV.get(scenario))
    return _cache[scenario]


def assert_checks(scenario: str, timeout: float, prefixes: tuple[str, ...], ranks=(0, 1)) -> None:
    per_rank = results(scenario, timeout)
    crashed = [c for r in ranks for c in per_rank[r] if c["name"].endswith("ran to the end")]
    assert not crashed, crashed[0]["detail"]
    chosen = [(r, c) for r in ranks for c in per_rank[r] if c["name"].startswith(prefixes)]
    assert chosen, f"no checks named {prefixes} in scenario {scenario}"
    failed = [f"rank {r}: {c['name']}: {c['detail']}" for r, c in chosen if not c["ok"]]
    assert not failed, "\n".join(failed)


def test_replicate_broadcasts_rank0():
    assert_checks("parity", 240, ("replicate broadcasts",))


def test_synced_steps_equal_ddp():
    """Three SGD steps, different data per rank and per step, three buckets: bitwise equal to
    DDP around the same local graphs, within the fp32 rule of DDP on the eager model."""
    assert_checks("parity", 240, ("three buckets", "sync "))


def test_no_sync_accumulates_then_reduces_like_ddp():
    assert_checks("parity", 240, ("no_sync",))


def test_bf16_compression():
    """Bitwise equal to DDP with its bf16 compression hook; against fp32 DDP within the bound
    of two bf16 roundings per element."""
    assert_checks("parity", 240, ("bf16",))


def test_memory_budget_counts_buckets_in_flight():
    assert_checks("parity", 240, ("budget",))


def test_hooks_see_local_gradients_like_ddp():
    """Hooks on one rank only (that rank reduces after the backward, the other inside it), a
    post-accumulate hook, a .grad put there by the user."""
    assert_checks("parity", 240, ("hooks", "post-accumulate"))


def test_plan_mismatch_raises_instead_of_hanging():
    assert_checks("mismatch", 120, ("plan mismatch", "the error names"))


def test_shape_mismatch_refused_by_replicate():
    assert_checks("mismatch", 120, ("shape mismatch",))


def test_data_parallel_on_a_process_group():
    assert_checks("mismatch", 120, ("process group",))


def test_a_backward_reused_for_other_parameters_is_refused():
    assert_checks("mismatch", 240, ("reused data-parallel backward",))


def test_dead_rank_surfaces_torch_error():
    assert_checks("mismatch", 120, ("dead rank",), ranks=(0,))


def test_inductor_keeps_the_planned_order():
    """CPU Inductor: FileCheck of the order (issue after the last write of a bucket, compute,
    next issue, waits at the end), buckets used only by the collectives, and the gradients
    against DDP within the fp32 rule."""
    assert_checks("inductor", 300, ("four buckets", "order of", "buckets are used", "no concatenation", "inductor grads",
                                         "budget check ran"))


def test_lowered_bucket_epilogues_one_kernel_each():
    """lower_triton on the data-parallel backward (FX code, Triton's interpreter): the
    allreduce pass tags one epilogue per bucket (scale, and the bf16 cast with compression),
    each becomes one generated kernel between the bucket's last slot write and its issue."""
    assert_checks("lowered", 300, ("lowered none:", "lowered bf16:"))


def test_lowered_bucket_epilogues_keep_the_gradients_bitwise():
    """fp32: bitwise the pipeline without lowering and DDP around the same local graphs;
    bf16: bitwise the pipeline without lowering and DDP with its bf16 hook (the kernel
    rounds x * 1/world to bf16 to nearest even, as the cast it replaces); with no_sync."""
    assert_checks("lowered", 300, ("lowered none vs", "lowered none params", "lowered bf16 vs", "lowered bf16 params"))


def test_lowered_bucket_epilogues_through_cpu_inductor():
    """CPU Inductor with ``lower_triton{opaque=1}``: in the generated code each bucket's
    kernel runs after ``bucket_ready_`` (after the bucket's slot writes) and right before
    its issue; gradients bitwise those of the same compile without lowering."""
    assert_checks("lowered_inductor", 420, ("inductor lowered",))
