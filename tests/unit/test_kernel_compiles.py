"""benchmarks.kernel_compiles: where a first step's Triton kernels compiled (its summary
and that recording leaves Inductor as it found it)."""

from torch._inductor.async_compile import AsyncCompile
from torch._inductor.graph import GraphLowering

from benchmarks import kernel_compiles


def test_summary_counts_pooled_and_serial_kernels():
    seen = kernel_compiles.Seen([(1.0, False, 0.5), (2.0, False, 0.25), (3.5, True, 0.01), (4.0, True, 0.02)])
    seen.graphs, seen.waited = [0.5, 3.0], 0.0
    assert kernel_compiles.summary(seen) == {
        "pooled": 2, "serial": 2, "serial_s": 0.75, "first_pooled_at_s": 3.5, "last_serial_at_s": 2.0,
        "graphs_at_s": [0.5, 3.0], "waited_s": 0.0}


def test_recording_restores_inductor():
    triton, init = AsyncCompile.triton, GraphLowering.__init__
    with kernel_compiles.recorded() as seen:
        assert AsyncCompile.triton is not triton and GraphLowering.__init__ is not init
    assert AsyncCompile.triton is triton and GraphLowering.__init__ is init
    assert list(seen) == [] and seen.graphs == []
