"""StepModel: the peak of a training step for any choice of saved activations, without
building the partitioned graphs.

``StepModel(joint_gm, num_fwd_outputs, static_input_indices)`` reads the joint graph once
into index arrays. ``evaluate(saved, executor)`` then predicts what the step peaks at when
the backward receives exactly ``saved`` (joint nodes: activations, random masks and the
primals it reads), as the executor will run the two graphs:

- the partition as ``dsgraph.recompute.partition.partition`` builds it (torch's extraction,
  ``reordering_to_mimic_autograd_engine``, ``raise_getitems``, then
  ``sink_recomputation``), emulated on ids: the forward is what the forward outputs and
  ``saved`` need, in joint order; the backward is what the gradients need, stopping at
  ``saved`` and the tangents, ordered as those passes order it (``sink=False``: the
  stock partitioner's order, without the sink);
- ``executor="fx"``: FX execution (``TensorLifetimes``: every node allocates its storage,
  views alias, storages die after their last use, the backward's saved inputs and
  tangents too); ``"inductor"``: Inductor's buffers (``inductor_model.emulate``);
- stitched as ``dsgraph.analysis.timeline.stitch`` stitches real plans: external memory
  (primals) throughout, saved activations from their forward step to their last backward
  use, gradients to the end.

Before/after, for a saved set ``{relu}`` of ``y = relu(x @ w); loss = y.sum()``::

    forward:  mm, relu, sum -> (loss, relu)       backward: le(relu), where, mm ...
    evaluate({relu}, "fx").peak = external + the largest live set along that clock
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch.fx import GraphModule, Node

from .. import compat
from .inductor_index import IndexMaps
from .inductor_layout import (channels_last_copies, channels_last_outputs, copied_to_channels_last, dense_4d,
                              prefer_channels_last)
from .inductor_model import EmulatedGraph, emulate
from .inductor_ops import GETITEM, PLACEHOLDER, VIEW, OpInfo, Rules, classify
from .lifetimes import TensorLifetimes, tensor_values
from .step_order import mimic_autograd, raise_getitems, sink_recomputation
from .sweep import live_per_step
from .forward_variants import forward_variant
from .workspace import workspace_bytes

FX, INDUCTOR = "fx", "inductor"


@dataclass
class StepPeak:
    peak: int
    executor: str
    peak_step: int
    live: list[int]  # live bytes per clock step: start, forward steps, backward steps, end
    steps: list[tuple[str, int]]  # (graph, joint node id) per clock step (-1: start / end)
    forward: list[int]  # forward node ids in execution order
    backward: list[int]  # backward node ids in execution order
    saved: list[int]  # what the backward receives from the forward (unused saved values dropped)
    recomputed: list[int]  # forward nodes the backward computes again
    external: int = 0
    intervals: list[tuple[int, int, int, str]] | None = None  # (start, stop, bytes, what), with explain=True

    def live_at(self, step: int) -> list[tuple[int, int, int, str]]:
        """What is live at a clock step (``explain=True`` evaluations), largest first."""
        return sorted((iv for iv in self.intervals or () if iv[0] <= step <= iv[1]), key=lambda iv: -iv[2])

    @property
    def peak_node(self) -> tuple[str, int]:
        return self.steps[self.peak_step]


def _is_tangent(node: Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


class StepModel:
    def __init__(self, gm: GraphModule, num_fwd_outputs: int, static_input_indices: Sequence[int] = (),
                 device_type: str | None = None, extra_external: int = 0, external: int | None = None,
                 pooled: frozenset[str] = frozenset(), handled: frozenset[str] = frozenset()):
        """``external``: bytes alive through the step (default: the primals' storages, each
        once), plus ``extra_external`` (a gradient pool). ``pooled``: names of backward
        outputs the gradient pool takes (its bytes are in ``extra_external``): the backward
        writes them into their slots (``EmulatedGraph.pooled``), so they are not held to the
        end of the step. ``handled``: names of primals the backward also receives a handle
        on (``compile.partition_edit``, the gradient pool's parameters): Inductor's layout
        optimization does not copy them to channels last as saved outputs; a convolution,
        and a ``convolution_backward`` computing an input gradient, copies its weight for
        itself (``EmulatedGraph.conv_copied_inputs``)."""
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self.nodes = nodes
        # what an op allocates for itself while it runs (dsgraph.analysis.workspace: the
        # chunked loss), live at its own step, as the FX and Inductor plans count it
        self.workspace = {i: w for i, n in enumerate(nodes) if (w := workspace_bytes(n))}
        index = {n: i for i, n in enumerate(nodes)}
        self.index = index
        n_nodes = len(nodes)
        self.ins: list[tuple[int, ...]] = [tuple(dict.fromkeys(index[a] for a in n.all_input_nodes)) for n in nodes]
        self.users: list[tuple[int, ...]] = [tuple(index[u] for u in n.users) for n in nodes]
        output = gm.graph.output_node()
        self.output_id = index[output]
        outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        self.fwd_outputs = [index[o] for o in outs[:num_fwd_outputs] if isinstance(o, Node)]
        self.bwd_outputs = [index[o] for o in outs[num_fwd_outputs:] if isinstance(o, Node)]
        self.pooled_outputs = frozenset(i for i in self.bwd_outputs if nodes[i].name in pooled)
        self.user_visible = frozenset(self.fwd_outputs)
        self.placeholders = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
        self.tangents = frozenset(i for i in self.placeholders if _is_tangent(nodes[i]))
        self.primals = [i for i in self.placeholders if i not in self.tangents]
        # nodes that can only be in the backward (torch's extraction: tangent descendants and
        # ``must_be_in_backward``) and only in the forward
        bw_only = set(self.tangents)
        for i, n in enumerate(nodes):
            if n.op == "call_function" and (n.meta.get("partitioner_tag") == "must_be_in_backward"
                                            or any(a in bw_only for a in self.ins[i])):
                bw_only.add(i)
        self.bw_only = frozenset(bw_only)
        self.impure = [n.op == "call_function" and n.is_impure() for n in nodes]
        self.getitem_index = {i: n.args[1] for i, n in enumerate(nodes) if n.target is operator.getitem}
        self.is_getitem = [n.target is operator.getitem for n in nodes]
        self.is_call = [n.op == "call_function" for n in nodes]
        # a pointwise op (``is_pointwise_use``'s test of the target)
        self.pointwise_target = [n.op == "call_function" and compat.is_op(n.target)
                                 and torch.Tag.pointwise in n.target.tags for n in nodes]
        # Inductor's view of each node
        if device_type is None:
            device_type = _device_type(nodes)
        self.device_type = device_type
        self.rules = Rules.for_device(device_type)
        self.info: list[OpInfo] = [classify(n, self.rules) for n in nodes]
        self.is_convolution = [n.target is torch.ops.aten.convolution.default for n in nodes]
        self.layout_opt_possible = compat.inductor_layout_opt_possible(device_type)
        # placeholders not in channels-last layout, and those of them Inductor copies to
        # channels last where they are a saved output (not the ones with a handle)
        self.not_channels_last = [n.op == "placeholder" and copied_to_channels_last(n) for n in nodes]
        self.copied_to_channels_last = [c and n.name not in handled for n, c in zip(nodes, self.not_channels_last)]
        self.dense_4d = [n.op == "call_function" and dense_4d(n) for n in nodes]
        self.targets = [n.target for n in nodes]
        self.index_maps = IndexMaps()  # the index maps' compositions, shared by every partition's emulation
        self.realizing_user = [any(self.info[u].realizes_inputs for u in self.users[i]) for i in range(n_nodes)]
        # FX: storages (views alias their base; a multi-output node's elements have their own)
        lifetimes = TensorLifetimes(gm)
        storages = lifetimes.storages
        self.storage_bytes = [s.nbytes for s in storages]
        self.storage_of = [lifetimes.storage_of[n].id if n in lifetimes.storage_of else -1 for n in nodes]
        # a pooled gradient's storage: the output may be a view of what its kernel wrote
        self.pooled_storages = frozenset(self.storage_of[i] for i in self.pooled_outputs) - {-1}
        self.alloc: list[tuple[int, ...]] = [()] * n_nodes
        roots: dict[int, list[int]] = {}
        for s in storages:
            if not s.is_input:
                roots.setdefault(index[s.root], []).append(s.id)
        for i, ids in roots.items():
            self.alloc[i] = tuple(ids)
        elements: dict[int, list[int]] = {}
        for (node, _), s in lifetimes._elements.items():
            elements.setdefault(index[node], []).append(s.id)
        # ops that run in a lighter form in the forward when the backward recomputes them
        # (``forward_variants``): the storages of the elements that form still returns, and
        # its workspace
        self.variant_alloc: dict[int, tuple[int, ...]] = {}
        self.variant_workspace: dict[int, int] = {}
        for i, n in enumerate(nodes):
            variant = forward_variant(n)
            if variant is not None:
                kept = {lifetimes._elements[(n, k)].id for k in variant.kept if (n, k) in lifetimes._elements}
                self.variant_alloc[i] = tuple(s for s in self.alloc[i] if s in kept)
                self.variant_workspace[i] = int(variant.workspace(n))
        # storages each node keeps alive by reading it (a multi-output node: all its elements)
        self.uses: list[tuple[int, ...]] = []
        for i in range(n_nodes):
            touched = []
            for a in self.ins[i]:
                s = self.storage_of[a]
                if s >= 0:
                    touched.append(s)
                else:
                    touched.extend(elements.get(a, ()))
            self.uses.append(tuple(dict.fromkeys(touched)))
        self.primal_storages = frozenset(self.storage_of[i] for i in self.primals if self.storage_of[i] >= 0)
        if external is None:
            external = sum(self.storage_bytes[s] for s in self.primal_storages)
        self.external = external + extra_external
        self.order_of_output_args = [index[o] for o in outs if isinstance(o, Node)]

    # -- the partition, emulated --------------------------------------------------------

    def partition(self, saved: Iterable[int], sink: bool = True):
        """(forward order, backward order, backward inputs, saved used, recomputed)."""
        saved = set(saved)
        ins = self.ins
        tangents = self.tangents
        bw: set[int] = set()
        bw_inputs: set[int] = set()
        stack = list(self.bwd_outputs)
        while stack:
            i = stack.pop()
            if i in bw or i in bw_inputs:
                continue
            if i in saved or i in tangents or self.info[i].kind == PLACEHOLDER:
                bw_inputs.add(i)
                continue
            bw.add(i)
            stack.extend(ins[i])
        used_saved = sorted(i for i in bw_inputs if i not in tangents)
        fw: set[int] = set()
        fw_inputs: set[int] = set()
        stack = list(self.fwd_outputs) + [i for i in used_saved if self.info[i].kind != PLACEHOLDER]
        while stack:
            i = stack.pop()
            if i in fw or i in fw_inputs:
                continue
            if self.info[i].kind == PLACEHOLDER:
                fw_inputs.add(i)
                continue
            fw.add(i)
            stack.extend(ins[i])
        fw_order = raise_getitems(self, sorted(fw), fw)
        bw_order = raise_getitems(self, mimic_autograd(self, sorted(bw), bw), bw)
        if sink:
            bw_order = sink_recomputation(self, bw_order, bw)
        recomputed = [i for i in bw_order if i not in self.bw_only]
        return fw_order, bw_order, sorted(fw_inputs), used_saved, recomputed

    # -- evaluation ---------------------------------------------------------------------

    def evaluate(self, saved: Iterable[int], executor: str = INDUCTOR, sink: bool = True,
                 explain: bool = False) -> StepPeak:
        """``explain``: keep every interval with a label (``StepPeak.live_at``)."""
        fw_order, bw_order, fw_inputs, used_saved, recomputed = self.partition(saved, sink)
        labels = [] if explain else None
        # recomputed ops with a lighter forward form: the forward runs that form
        # (``recompute.light_forward`` rewrites the partition's forward the same way)
        light = frozenset(i for i in recomputed if i in self.variant_alloc)
        if executor == FX:
            return self._fx(fw_order, bw_order, used_saved, recomputed, labels, light)
        if executor == INDUCTOR:
            return self._inductor(fw_order, bw_order, fw_inputs, used_saved, recomputed, labels, light)
        raise ValueError(f"executor must be 'fx' or 'inductor', not {executor!r}")

    def _clock(self, fw_steps: list[int], bw_steps: list[int]):
        steps = [("start", -1)] + [("forward", i) for i in fw_steps] + [("backward", i) for i in bw_steps]
        steps.append(("end", -1))
        return steps, 1, 1 + len(fw_steps), 1 + len(fw_steps) + len(bw_steps)

    def _result(self, executor, intervals, steps, fw_order, bw_order, used_saved, recomputed, labels=None,
                light=frozenset()) -> StepPeak:
        if self.workspace:
            intervals = list(intervals)
            for step, (graph, i) in enumerate(steps):
                if i in self.workspace:
                    light_here = graph == "forward" and i in light
                    intervals.append((step, step, self.variant_workspace[i] if light_here else self.workspace[i]))
                    if labels is not None:
                        labels.append(f"{graph}:{self.nodes[i].name}:workspace")
        live = live_per_step(len(steps), intervals)
        live = [x + self.external for x in live]
        peak_step = max(range(len(live)), key=live.__getitem__)
        explained = None
        if labels is not None:
            explained = [(a, b, c, label) for (a, b, c), label in zip(intervals, labels)]
        return StepPeak(live[peak_step], executor, peak_step, live, steps, fw_order, bw_order, used_saved,
                        recomputed, self.external, explained)

    def _fx(self, fw_order, bw_order, used_saved, recomputed, labels=None, light=frozenset()) -> StepPeak:
        steps, fw0, bw0, end = self._clock(fw_order, bw_order)
        sbytes = self.storage_bytes
        primal_storages = self.primal_storages
        # last use of each storage in each graph (step indices of that graph)
        fw_last: dict[int, int] = {}
        for k, i in enumerate(fw_order):
            for s in self.uses[i]:
                fw_last[s] = k
        bw_last: dict[int, int] = {}
        for k, i in enumerate(bw_order):
            for s in self.uses[i]:
                bw_last[s] = k
        saved_storages = {self.storage_of[i] for i in used_saved}
        user_out = {self.storage_of[i] for i in self.fwd_outputs}
        intervals = []
        for k, i in enumerate(fw_order):
            for s in (self.variant_alloc[i] if i in light else self.alloc[i]):
                if s in user_out:
                    stop = end
                elif s in saved_storages:
                    stop = bw0 + bw_last[s] if s in bw_last else bw0
                else:
                    stop = fw0 + fw_last.get(s, k)
                intervals.append((fw0 + k, stop, sbytes[s]))
                if labels is not None:
                    labels.append(f"forward:{self.nodes[i].name}")
        fw_alloc = {s for i in fw_order for s in self.alloc[i]}
        # backward inputs that are not forward storages nor held: the tangents
        for t in self.tangents:
            s = self.storage_of[t]
            if s >= 0 and s not in primal_storages:
                intervals.append((bw0, bw0 + max(bw_last.get(s, 0), 0), sbytes[s]))
                if labels is not None:
                    labels.append(f"tangent:{self.nodes[t].name}")
        # saved values that are views of storages the forward did not allocate here
        # (inputs): held, counted as external
        bw_out = {self.storage_of[i] for i in self.bwd_outputs} - self.pooled_storages
        for k, i in enumerate(bw_order):
            for s in self.alloc[i]:
                stop = end if s in bw_out else bw0 + bw_last.get(s, k)
                intervals.append((bw0 + k, stop, sbytes[s]))
                if labels is not None:
                    labels.append(f"backward:{self.nodes[i].name}")
        del fw_alloc
        return self._result(FX, intervals, steps, fw_order, bw_order, used_saved, recomputed, labels, light)

    def _graph(self, order, inputs, outputs, donated=frozenset(), pooled=frozenset(),
               arrive_channels_last=frozenset(), light=frozenset()) -> EmulatedGraph:
        """``arrive_channels_last``: inputs the forward returned in channels-last layout
        (``EmulatedGraph.channels_last_arrivals``). ``light``: ops run in their lighter
        forward form (``forward_variants``)."""
        members = set(order) | set(inputs)
        output_set = set(outputs)
        users = {}
        realizing = {}
        pointwise = {}
        all_users = self.users
        info = self.info
        memo: dict[tuple[int, int], bool] = {}
        for i in members:
            us = [u for u in all_users[i] if u in members]
            users[i] = len(set(us)) + (1 if i in output_set else 0)
            realizing[i] = any(info[u].realizes_inputs for u in us)
            if info[i].name == "add" and len(self.ins[i]) == 2:  # all the addmm pattern asks about
                pointwise[i] = i not in output_set and all(self._pointwise_use(u, members, 0, memo) for u in us)
        # ``GraphLowering.decide_layout_opt``: on a CPU with mkldnn, any convolution turns it
        # on (the GPU's heuristics are not modelled: a convolution turns it on there too)
        layout_opt = self.layout_opt_possible and any(self.is_convolution[i] for i in order)
        copies, channels_last = [], []
        if layout_opt:
            prefer = prefer_channels_last(order, inputs, all_users, self.is_convolution, self.targets)
            copies = channels_last_copies(inputs, output_set, self.copied_to_channels_last, self.user_visible, prefer)
            channels_last = channels_last_outputs(order, output_set, self.dense_4d, self.user_visible, prefer)
        # a convolution copies an input not in channels last for itself: with layout
        # optimization, or (``convolution_backward``) without it where its input arrived so
        conv_copied = frozenset(i for i in inputs if self.not_channels_last[i]) - set(copies) - arrive_channels_last
        kept = {i: frozenset(forward_variant(self.nodes[i]).kept) for i in light}
        return EmulatedGraph(order, inputs, self.ins, users, outputs, self.info, self.getitem_index, realizing,
                             frozenset(donated), pointwise, self.index_maps, layout_opt, copies, frozenset(pooled),
                             conv_copied, frozenset(arrive_channels_last), channels_last, light=kept)

    def _pointwise_use(self, u: int, members: set[int], depth: int, memo: dict) -> bool:
        """``torch._inductor.utils.is_pointwise_use``: a pointwise op, or a view whose users are.
        ``memo``: answers already found for these ``members``, by (node, depth)."""
        key = (u, depth)
        found = memo.get(key)
        if found is None:
            if depth > 8 or not self.is_call[u]:
                found = False
            elif self.info[u].kind in (VIEW, GETITEM):
                found = all(self._pointwise_use(w, members, depth + 1, memo) for w in self.users[u] if w in members)
            else:
                found = self.pointwise_target[u]
            memo[key] = found
        return found

    def _inductor(self, fw_order, bw_order, fw_inputs, used_saved, recomputed, labels=None,
                  light=frozenset()) -> StepPeak:
        saved_out = [i for i in used_saved if self.info[i].kind != PLACEHOLDER]
        # saved inputs are forward outputs too: with layout optimization Inductor may
        # return a channels-last copy of one (``inductor_layout``), a buffer of the forward
        saved_inputs = [i for i in used_saved if self.info[i].kind == PLACEHOLDER]
        fw_outputs = list(dict.fromkeys(self.fwd_outputs + saved_out + saved_inputs))
        fw_graph = self._graph(fw_order, fw_inputs, fw_outputs, light=light)
        fw_run = emulate(fw_graph, self.rules)
        bw_members = set(bw_order)
        bw_inputs = used_saved + sorted(t for t in self.tangents if any(u in bw_members for u in self.users[t]))
        donated = {i for i in saved_out if self.storage_of[i] not in self.primal_storages}
        bw_run = emulate(self._graph(bw_order, bw_inputs, self.bwd_outputs, donated, self.pooled_outputs,
                                     frozenset(fw_graph.channels_last_inputs)
                                     | frozenset(fw_graph.channels_last_outputs)), self.rules)
        steps, fw0, bw0, end = self._clock(fw_run.schedule, bw_run.schedule)
        intervals = []
        user_out = set(self.fwd_outputs)
        # saved value -> last backward step reading it (its buffer in the backward)
        bw_last = bw_run.input_last
        # saved values whose backward input buffer is a backward output
        bw_input_outputs = {b.node for b in bw_run.buffers if b.input and b.output}
        fw_buffer_saved: dict[int, list[int]] = {}
        for node, b in fw_run.output_buffers.items():
            fw_buffer_saved.setdefault(b, []).append(node)
        for b_index, b in enumerate(fw_run.buffers):
            if b.input or b.nbytes == 0:
                continue
            start = fw0 + b.start
            nodes = fw_buffer_saved.get(b_index, [])
            if any(n in user_out for n in nodes):
                stop = end
            elif nodes:
                uses = [bw_last.get(n, -1) for n in nodes]
                last = max(uses)
                stop = end if last >= len(bw_run.schedule) else bw0 + max(last, 0)
                if any(n in bw_input_outputs for n in nodes):
                    stop = end
            else:
                stop = fw0 + max(b.end, b.start)
            intervals.append((start, stop, b.nbytes))
            if labels is not None:
                labels.append(f"forward:{self.nodes[b.node].name}")
        for b in bw_run.buffers:
            if b.input:
                if b.node in self.tangents and self.storage_of[b.node] not in self.primal_storages:
                    stop = end if b.output else bw0 + max(b.end, 0)
                    intervals.append((bw0, stop, b.nbytes))
                    if labels is not None:
                        labels.append(f"tangent:{self.nodes[b.node].name}")
                continue
            if b.nbytes == 0:
                continue
            # pooled gradients are no outputs of the emulated backward (``EmulatedGraph.pooled``)
            stop = end if b.output else bw0 + max(b.end, b.start)
            intervals.append((bw0 + b.start, stop, b.nbytes))
            if labels is not None:
                labels.append(f"backward:{self.nodes[b.node].name}")
        return self._result(INDUCTOR, intervals, steps, fw_run.schedule, bw_run.schedule, used_saved, recomputed,
                            labels, light)


def _device_type(nodes: list[Node]) -> str:
    for n in nodes:
        for _, t in tensor_values(n.meta.get("val")):
            return t.device.type
    return "cpu"
