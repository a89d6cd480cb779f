"""The data of the Inductor emulation (``inductor_model.emulate``): the graph it lowers
(``EmulatedGraph``), the buffers its plan allocates (``Buffer``) and what a run returns
(``InductorRun``). Kept apart from the lowering so each file has one job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .inductor_index import IndexMaps
from .inductor_ops import OpInfo


@dataclass
class EmulatedGraph:
    """One graph as Inductor lowers it: ``order`` (node ids in execution order, graph
    inputs excluded), ``inputs`` (ids of graph inputs, which are buffers), ``ins[i]`` (the
    ids node i reads, in argument order), ``users[i]`` (how many distinct nodes of this
    graph read node i, the output included), ``realizing_users[i]`` (a user of node i is a
    ``needs_realized_inputs`` op), ``outputs`` (ids the graph returns), ``donated``
    (inputs whose buffer the graph may write into once they are dead),
    ``getitem_index[i]`` (which element of a multi-output node a getitem takes)."""

    order: Sequence[int]
    inputs: Sequence[int]
    ins: Sequence[Sequence[int]]
    users: Sequence[int]
    outputs: Sequence[int]
    info: Sequence[OpInfo]
    getitem_index: dict
    realizing_users: Sequence[bool]
    donated: frozenset = frozenset()
    # every user of node i is pointwise (through views); StepModel fills it for the
    # two-input adds, the nodes ``addmm_patterns`` asks about
    pointwise_users: Sequence[bool] | dict = ()
    # canonical index maps, shared by the emulations of one graph (memoized compositions)
    maps: IndexMaps | None = None
    # Inductor's layout optimization is on for this graph (``decide_layout_opt``): the
    # convolutions' stride constraints do not apply
    layout_opt: bool = False
    # graph inputs Inductor copies to channels last before the first node, the copy
    # taking the input's place (``dsgraph.analysis.inductor_layout``)
    channels_last_inputs: Sequence[int] = ()
    # outputs the gradient pool takes (``dsgraph.passes.grad_pool``): the backward writes
    # them into their slots and returns None for them, so to the scheduler they are no
    # outputs: ``mm_into_`` and the add + ``copy_`` fused into the kernel that computes the
    # gradient allocate nothing; another kernel's own output is freed after its copy into
    # the slot. Each slot is a graph input (``dsgraph_grad_<k>``) that Inductor's peak
    # estimate counts as freeable (``Buffer.slot``)
    pooled: frozenset = frozenset()
    # graph inputs not in channels-last layout, no copy taking their place: a parameter the
    # backward has a handle on (``compile.partition_edit``). A convolution's lowering copies
    # one for itself where it asks for channels last (``OpInfo.channels_last_args``; without
    # layout optimization only a ``convolution_backward`` whose input arrived channels last
    # or is computed in this graph: a block input recomputed in the backward, 147 KB of
    # weight copy missed on a pooled conv net's plan before session 14)
    conv_copied_inputs: frozenset = frozenset()
    # graph inputs the forward returned channels last (its ``channels_last_outputs`` and
    # copies of ``channels_last_inputs``), and this graph's computed 4-D outputs stored so
    channels_last_arrivals: frozenset = frozenset()
    channels_last_outputs: Sequence[int] = ()
    # multi-output ops that run in a lighter form here (``forward_variants``: the forward of
    # a plan that recomputes them): node -> the tuple elements that form returns
    light: dict = field(default_factory=dict)


@dataclass
class Buffer:
    nbytes: int
    dtype: object
    start: int  # kernel step that writes it (-1: a graph input)
    end: int  # last kernel step that reads it (-1: never read)
    node: int  # the node whose value it holds
    output: bool = False  # outlives the graph
    input: bool = False
    reused_by: int = -1  # another buffer written into this one (in-place reuse)
    removed: bool = False  # kernel-local after fusion: never allocated
    planned: tuple = ()  # (start, end, bytes) as Inductor's peak estimate sees it (before fusion and reuse)
    planned_bytes: int = 0  # its bytes before fusion made it kernel-local
    kernel: int = -1  # the kernel that writes it
    self_allocated: bool = False  # made by a fallback kernel, not by the wrapper (``OpInfo.self_allocating``)
    # a fallback kernel's output Inductor assumes unaligned (one of the kernel's inputs is:
    # on a CPU every graph input is): the wrapper's pool never hands it to an allocation
    unaligned: bool = False
    # a pooled gradient's slot (``EmulatedGraph.pooled``), a graph input the kernel that
    # writes the gradient reads. Its bytes are the pool's, outside the graph's plan, but
    # ``get_freeable_input_buf`` takes every input not named ``primals_``/``tangents``
    # (``is_nonfreeable_buffers``) as freed after its last reader: ``reorder_for_peak_memory``
    # and the wrapper's pool reuse hold it live until then (issue: a ViT's backward with
    # the pool ran the FFN's weight-gradient ``mm_into_`` before its input gradient's mm)
    slot: bool = False
    element: int = 0  # which output tensor of its node it holds (a multi-output kernel's)

    def freeable_input(self, donated) -> bool:
        """A graph input Inductor's peak estimate frees after its last reader."""
        return self.input and (self.slot or self.node in donated)


@dataclass
class InductorRun:
    kernels: list[int]  # per step: the node whose realization (or extern call) it is
    kinds: list[int] = field(default_factory=list)  # per step: what the kernel is (POINTWISE, EXTERN, ...)
    buffers: list[Buffer] = field(default_factory=list)
    input_last: dict = field(default_factory=dict)  # graph input id -> last step reading it (-1: none)
    output_buffers: dict = field(default_factory=dict)  # output node id -> buffer index
    # per scheduled step (fused groups placed and reordered): the node of the group's
    # latest kernel. Buffers' ``start`` / ``end`` are on this clock, not ``kernels``'
    schedule: list[int] = field(default_factory=list)
    # per scheduled step: the nodes of the kernels fused into it (for diagnostics, to
    # hold against Inductor's fused kernels; the plan does not read it)
    groups: list[list[int]] = field(default_factory=list)
