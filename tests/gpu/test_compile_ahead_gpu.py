"""compile_ahead on a CUDA GPU: the backward compiled in dsgraph's worker is served, with
gradients bitwise equal to the in-process compile under deterministic algorithms, and the
budget's check reads the same plan (skipped without CUDA). Passed on the H200 in session 18
(docs/BENCHMARKS.md)."""

import pytest
import torch

from tests.e2e.test_compile_ahead import _bitwise, _step

pytestmark = pytest.mark.gpu


@pytest.fixture
def deterministic():
    """The embedding backward accumulates with atomics on CUDA: two runs of one graph differ
    in the last bit. With deterministic algorithms the worker must compile as this process
    does (the setting travels with the graph)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("budget", [None, "256MiB"])
def test_the_backward_is_served_bitwise(budget, deterministic):
    options = {"compile_ahead": True} if budget is None else {"compile_ahead": True, "memory_budget": budget}
    here = _step({**options, "compile_ahead": False}, "cuda")
    ahead = _step(options, "cuda")
    figures = ahead[2]["backward"].memory
    assert figures.get("compile_ahead_served") is True, figures
    assert _bitwise(here, ahead)
    if budget is not None:
        assert ahead[2]["joint"].memory["checkpoint_inductor_peak"] == here[2]["joint"].memory["checkpoint_inductor_peak"]
