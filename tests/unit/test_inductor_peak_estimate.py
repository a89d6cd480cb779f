"""The emulation's copy of Inductor's peak estimate (``inductor_reuse.peak_estimate``)
against the installed torch's own ``memory.estimate_peak_memory`` on the same two-step
graph: a buffer made at step 0 and read at step 1, a graph output made at step 1. torch
2.11 and 2.12 free an output at step 0 (its bytes are taken off until it is made), 2.13
keeps it; ``compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START`` must say which one runs, since
the wrapper's buffer pool and ``reorder_for_peak_memory`` decide by this estimate."""

import torch
from torch._inductor import memory
from torch.utils._ordered_set import OrderedSet

from dsgraph import compat
from dsgraph.analysis.inductor_graph import Buffer, InductorRun
from dsgraph.analysis.inductor_reuse import peak_estimate

TMP, OUT = 5, 10  # bytes of the step-0 buffer and of the output


class _Node:
    def __init__(self):
        self.outputs = []

    def get_outputs(self):
        return self.outputs


class _Buf:
    def __init__(self, name, size, succ):
        self.name = name
        self.mpi_buffer = memory.MemoryPlanningInfoForBuffer(
            size_alloc=size, size_free=size, succ_nodes=OrderedSet(succ), succ_nodes_for_ordering=OrderedSet(succ))

    def get_name(self):
        return self.name


def _inductors_estimate():
    n0, n1 = _Node(), _Node()
    n0.outputs = [_Buf("tmp", TMP, [n1])]
    n1.outputs = [_Buf("out", OUT, [])]
    return memory.estimate_peak_memory([n0, n1], {}, OrderedSet(["out"]))


def _emulations_estimate():
    run = InductorRun([0, 1])
    run.buffers = [Buffer(TMP, torch.uint8, 0, 1, 0, planned=(0, 1, TMP), planned_bytes=TMP, kernel=0),
                   Buffer(OUT, torch.uint8, 1, -1, 1, output=True, planned=(1, -1, OUT), planned_bytes=OUT, kernel=1)]
    return peak_estimate(run, frozenset())


def test_the_flag_says_how_the_installed_inductor_counts_outputs():
    peak, _ = _inductors_estimate()
    expected = TMP if compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START else TMP + OUT
    assert peak == expected


def test_the_emulated_estimate_is_inductors_step_by_step():
    peak, curve = _inductors_estimate()
    got_peak, got_curve = _emulations_estimate()
    assert got_peak == peak
    assert got_curve == list(curve[:len(got_curve)])
