"""CostModel: how long each node takes to run, as ``a * FLOPs + b * bytes``.

FLOPs come from torch's own formulas (``torch.utils.flop_counter``: matmuls, convolutions,
attention) evaluated on the fake tensors' shapes; every other op is memory-bound and costs
the bytes it reads and writes over the bandwidth its kernels reach. The rates default to
what was measured on an H200 here (FACTS.md: bf16 matmul about 790 TFLOP/s, copies about
4.3 TB/s counting bytes read and written); fp32 matmuls use the plain fp32 rate (TF32 off).
Views and getitems cost nothing. This is what the checkpoint planner weighs recomputation
with: recomputing a cheap pointwise op costs bytes, recomputing a matmul costs FLOPs.

Calibration (``DeviceRates``): generated pointwise and reduction kernels do not reach the
copy bandwidth. ``memory_efficiency`` is the fraction they reach (FACTS.md: a recomputed
GPT-2 GELU, 16 x 1024 x 3072 bf16, takes 107 us on the H200, about 0.44 of 4.3 TB/s; the
measured recomputation of GPT-2 plans cost 1.6 to 6.3 ms per step more than bytes over
the copy bandwidth: about a third, the default); ``compute_efficiency`` the fraction of the
matmul rate reached; ``launch_s`` a fixed cost per kernel. ``DeviceRates.calibrate`` fits
the two efficiencies to measured kernels (``KernelSample``: bytes, FLOPs, dtype, seconds,
from ``benchmarks/profile_step.py``), ``DeviceRates.from_json`` reads them from a file.

``H200_MEASURED`` (``checkpoint{rates=profile}``) is fitted to what recomputation took in the
H200's profile of a budgeted GPT-2 step, item by item: GEMMs and attention at the FLOP rates
their kernels reached, their reads and writes inside that time (``flop_op_bytes=False``:
the default rates charge them again at the generated kernels' bandwidth, 1.7x what the
GEMMs took), attention with its own efficiency, the memory-bound chains at what they took
beyond the stock partition's own recomputation (docs/BENCHMARKS.md, session 10).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node


from .. import compat
from .base import Analysis
from .forward_variants import forward_variant
from .lifetimes import is_view, node_bytes, tensor_bytes, tensor_values


@dataclass(frozen=True)
class KernelSample:
    """One measured kernel: what it moves and computes, and how long it took."""

    bytes: int
    flops: int
    seconds: float
    dtype: torch.dtype = torch.bfloat16


@dataclass(frozen=True)
class DeviceRates:
    flops_per_s: dict = field(default_factory=lambda: {
        torch.bfloat16: 790e12, torch.float16: 790e12, torch.float32: 60e12, torch.float64: 30e12,
    })
    bytes_per_s: float = 4.3e12  # copy bandwidth, bytes read plus written
    memory_efficiency: float = 1.0  # fraction of ``bytes_per_s`` generated kernels reach
    compute_efficiency: float = 1.0  # fraction of the matmul rate reached
    launch_s: float = 0.0  # fixed cost per kernel
    # fraction of the matmul rate attention kernels reach on torch's FLOP count (None: as
    # matmuls, ``compute_efficiency``)
    attention_efficiency: float | None = None
    # whether the fused model charges bytes, at ``memory_rate``, for what an op with FLOPs
    # (a GEMM, attention) reads and writes; False when its efficiency was fitted to the
    # whole kernel's time, which holds its memory traffic
    flop_op_bytes: bool = True

    def flop_rate(self, dtype: torch.dtype) -> float:
        return self.flops_per_s.get(dtype, self.flops_per_s[torch.float32]) * self.compute_efficiency

    def node_flop_rate(self, node: Node, dtype: torch.dtype) -> float:
        """``flop_rate`` for ``node``: attention ops at ``attention_efficiency`` when set."""
        if self.attention_efficiency is not None and is_attention(node):
            return self.flops_per_s.get(dtype, self.flops_per_s[torch.float32]) * self.attention_efficiency
        return self.flop_rate(dtype)

    @property
    def memory_rate(self) -> float:
        return self.bytes_per_s * self.memory_efficiency

    def calibrate(self, samples: list[KernelSample]) -> "DeviceRates":
        """Efficiencies fitted to measured kernels: memory-bound ones (no FLOPs) set
        ``memory_efficiency`` (predicted over measured time, summed), the others
        ``compute_efficiency`` from the time left after their bytes. Kernels shorter than
        ``launch_s`` are not used."""
        import dataclasses

        memory = [s for s in samples if s.flops == 0 and s.seconds > self.launch_s]
        compute = [s for s in samples if s.flops > 0 and s.seconds > self.launch_s]
        changes = {}
        if memory:
            changes["memory_efficiency"] = (sum(s.bytes for s in memory) / self.bytes_per_s
                                            / sum(s.seconds - self.launch_s for s in memory))
        rates = dataclasses.replace(self, **changes)
        if compute:
            ideal = sum(s.flops / self.flops_per_s.get(s.dtype, self.flops_per_s[torch.float32]) for s in compute)
            spent = sum(max(s.seconds - self.launch_s - s.bytes / rates.memory_rate, 1e-12) for s in compute)
            rates = dataclasses.replace(rates, compute_efficiency=ideal / spent)
        return rates

    @staticmethod
    def from_json(path: str) -> "DeviceRates":
        """Rates from a JSON object with any of ``bytes_per_s``, ``memory_efficiency``,
        ``compute_efficiency``, ``launch_s`` and ``flops_per_s`` (dtype name -> FLOP/s)."""
        import json

        raw = json.loads(open(path).read())
        base = DeviceRates()
        flops = dict(base.flops_per_s)
        for name, rate in raw.pop("flops_per_s", {}).items():
            flops[getattr(torch, name)] = float(rate)
        flags = {k: bool(raw.pop(k)) for k in ("flop_op_bytes",) if k in raw}
        return DeviceRates(flops_per_s=flops, **flags, **{k: float(v) for k, v in raw.items()})


H200 = DeviceRates()
# what generated kernels reach on the H200 (FACTS.md): used to price recomputation
H200_CALIBRATED = DeviceRates(memory_efficiency=1 / 3)
# dsgraph's own Triton kernels for recomputed chains and norms, launched by Inductor as
# user-defined kernels (``lower_triton``), as measured on the H200: bytes moved and
# microseconds through Inductor of the memory-bound cases of ``benchmarks.lowering``
# (docs/results/2026-12-01-h200-s6-lowering.json: gelu_fwd, gelu_bwd, layer_norm,
# rms_norm, softmax); the fit gives about 0.85 of the copy bandwidth
LOWERED_KERNELS_H200 = (
    KernelSample(402_653_184, 0, 107.71e-6), KernelSample(301_989_888, 0, 81.25e-6),
    KernelSample(268_599_296, 0, 91.65e-6), KernelSample(268_451_840, 0, 72.64e-6),
    KernelSample(536_870_912, 0, 132.83e-6),
)
H200_LOWERED = H200.calibrate(list(LOWERED_KERNELS_H200))

# What recomputation measured on the H200, kernel by kernel: session 9's profile of GPT-2-small
# (16 x 1024, bf16 autocast) under ``memory_budget="2.94GiB"`` against Inductor in the same
# process (docs/results/2026-12-02-h200-s9-profile-294.json; docs/BENCHMARKS.md, session 10).
# The plan recomputes 24 GEMMs and 7 attention forwards (the planner's plan at that budget,
# rebuilt on the CPU by ``benchmarks.plan_overhead``: the same counts as the launches the
# profile adds), and memory-bound chains that the fused model charges 3,217,606,656 bytes,
# of which 1,563,697,152 are what the stock partition recomputes too (in Inductor's time).
# Device time the plan adds over Inductor, per item:
# - GEMMs: the two forward addmm kernel families (``nvjet_..._bias_TNT`` 36 -> 53 launches,
#   2.934 -> 4.123 ms; ``..._bias_TNN`` 12 -> 19, 1.066 -> 1.690 ms): 24 launches, 1.813 ms,
#   for 7 x (16384 x 2304 x 768) + 9 x (16384 x 768 x 768) + 8 x (16384 x 3072 x 768) FLOPs;
# - attention: cuDNN's forward kernel, 12 -> 19 launches, 1.009 -> 1.593 ms, for 7 forwards
#   of (16, 12, 1024, 64) (torch's FLOP formula: the full, not the causal, square);
# - memory-bound chains: Inductor's Triton kernels other than the loss's, 7.104 ms listed for
#   Inductor (every kernel), 7.145 ms for the plan's 60 listed kernels with 0.438 ms in
#   kernels below the listing: at most 0.479 ms for the 1,653,909,504 bytes the plan adds
#   (an upper bound of the time, so a lower bound of the rate: 0.80 of the copy bandwidth,
#   where the generated kernels' default is a third; Inductor fuses most recomputed chains
#   into the backward kernels that read their inputs anyway).
# GEMM and attention times are whole kernels (their reads and writes included), so their
# bytes are not charged again (``flop_op_bytes``). No launch cost is fitted: wall time is
# about 3 ms above device time for Inductor and for every plan alike (session 9).
PROFILE_294_GEMMS = ((16384, 2304, 768, 7), (16384, 768, 768, 9), (16384, 3072, 768, 8))  # (M, N, K, count)
PROFILE_294_GEMM_S = ((4.123 - 2.934) + (1.690 - 1.066)) * 1e-3
PROFILE_294_ATTENTION = ((16, 12, 1024, 64, 7),)  # (batch, heads, length, head dim, count)
PROFILE_294_ATTENTION_S = (1.593 - 1.009) * 1e-3
PROFILE_294_MEMORY_BYTES = 3_217_606_656 - 1_563_697_152
PROFILE_294_MEMORY_S = ((7.145 + 0.438) - 7.104) * 1e-3


def _profile_294_rates() -> DeviceRates:
    bf16 = H200.flops_per_s[torch.bfloat16]
    gemm_flops = sum(2 * m * n * k * c for m, n, k, c in PROFILE_294_GEMMS)
    # torch.utils.flop_counter's SDPA forward formula: two (L x L x d) products per head
    attention_flops = sum(4 * b * h * l * l * d * c for b, h, l, d, c in PROFILE_294_ATTENTION)
    return DeviceRates(
        compute_efficiency=gemm_flops / bf16 / PROFILE_294_GEMM_S,
        attention_efficiency=attention_flops / bf16 / PROFILE_294_ATTENTION_S,
        memory_efficiency=PROFILE_294_MEMORY_BYTES / H200.bytes_per_s / PROFILE_294_MEMORY_S,
        flop_op_bytes=False)


H200_MEASURED = _profile_294_rates()


# what the checkpoint pass's ``rates`` argument accepts: ``bandwidth`` (the default: generated
# kernels at a third of the copy bandwidth, GEMMs and attention at the matmul rate plus their
# bytes) or ``profile`` (``H200_MEASURED``)
RATES = ("bandwidth", "profile")


def recompute_rates(device_type: str, lowered: bool, source: str = "bandwidth") -> DeviceRates:
    """What recomputation is priced with: on a GPU, the bandwidth Inductor's generated
    kernels reach (a third of the copy bandwidth), or dsgraph's lowered kernels' when
    ``lower_triton`` will run the recomputed chains through Inductor, or with ``source``
    ``"profile"`` (and no lowering) ``H200_MEASURED``; elsewhere the uncalibrated rates
    (the CPU's own are not modelled: plans stay comparable)."""
    if source not in RATES:
        raise ValueError(f"rates must be one of {list(RATES)}, got {source!r}")
    if device_type != "cuda":
        return H200
    if lowered:
        return H200_LOWERED
    return H200_MEASURED if source == "profile" else H200_CALIBRATED


@dataclass(frozen=True)
class NodeCost:
    flops: int
    bytes: int
    seconds: float


def is_attention(node: Node) -> bool:
    """A fused attention op (``scaled_dot_product_*attention*``, CPU or CUDA, forward or
    backward)."""
    if node.op != "call_function" or not compat.is_op(node.target):
        return False
    return "attention" in node.target.overloadpacket.__name__


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, Node) else x


# CPU attention kernels take the same leading (q, k, v) or (grad, q, k, v) arguments as the
# CUDA flash kernels torch has formulas for
_SAME_FORMULA = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
}


def node_flops(node: Node) -> int:
    """FLOPs of one call, from torch's flop formulas; 0 for ops without one."""
    from torch.utils.flop_counter import flop_registry

    if node.op != "call_function" or not compat.is_op(node.target):
        return 0
    packet = node.target.overloadpacket
    alias = _SAME_FORMULA.get(packet.__name__)
    if alias is not None:
        packet = getattr(torch.ops.aten, alias)
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    args, kwargs = compat.tree_map(_val, (node.args, node.kwargs))
    flops = formula(*args, out_val=node.meta.get("val"), **kwargs)
    # symbolic shapes give a SymInt: read its size hint (int() would specialize the graph)
    return int(compat.size_hint(flops)) if not isinstance(flops, int) else flops


# ops whose FLOPs run in another dtype than their first output's (a fused op returning an fp32
# loss from bf16 matmuls): op -> fn(node) -> the dtype its matmuls run in
_FLOP_DTYPE: dict[Any, Any] = {}


def register_flop_dtype(op: Any, fn) -> None:
    """``fn(node)``: the dtype a call of ``op`` at ``node`` does its FLOPs in. Without it a
    node's FLOPs are priced at its first output's dtype, which for
    ``dsgraph::linear_cross_entropy_grads`` is the fp32 loss: its three bf16 GEMMs were
    priced at the fp32 rate, 13x too slow (a 24-layer GPT's recomputed loss head 41 ms)."""
    _FLOP_DTYPE[op] = fn


def _dtype(node: Node) -> torch.dtype:
    try:
        fn = _FLOP_DTYPE.get(node.target)
    except TypeError:  # an unhashable callable: not a registered op
        fn = None
    if fn is not None:
        return fn(node)
    vals = tensor_values(node.meta.get("val"))
    return vals[0][1].dtype if vals else torch.float32


def node_bytes_moved(node: Node) -> int:
    """Bytes a kernel for this node reads (its tensor inputs) and writes (its outputs)."""
    if node.op != "call_function" or is_view(node):
        return 0
    read = sum(tensor_bytes(t) for a in node.all_input_nodes for _, t in tensor_values(a.meta.get("val")))
    written = node_bytes(node)
    return read + written


# Inductor keeps a reduction's row in registers (a persistent reduction) up to this many
# elements for an inner reduction (``should_use_persistent_reduction``; 64 for the others,
# not modelled); above it the kernel loops over the row, and what consumes the result in
# the same kernel loops over the row again
PERSISTENT_RNUMEL = 1024


class CostModel(Analysis):
    name = "CostModel"

    def __init__(self, gm: GraphModule, rates: DeviceRates = H200, looped: frozenset = frozenset()):
        """``looped``: the reductions Inductor runs as looped kernels (``looped_reductions``),
        whose inputs a recomputation reads once more (``fused_seconds``)."""
        self.rates = rates
        self.looped = frozenset(looped)
        self.costs: dict[Node, NodeCost] = {}
        for node in gm.graph.nodes:
            flops = node_flops(node)
            moved = node_bytes_moved(node)
            dtype = _dtype(node)
            charged = moved if (rates.flop_op_bytes or not flops) else 0
            seconds = flops / rates.node_flop_rate(node, dtype) + charged / rates.memory_rate
            if moved or flops:
                seconds += rates.launch_s
            self.costs[node] = NodeCost(flops, moved, seconds)
        # what recomputing a node costs in FLOPs, where that is not its own FLOPs: an op the
        # forward then runs in a lighter form (``forward_variants``) costs the FLOPs the
        # forward still computes, the backward's call computing the rest
        self.recompute_flops: dict[Node, int] = {}
        for node in gm.graph.nodes:
            variant = forward_variant(node)
            if variant is not None and node in self.costs:
                self.recompute_flops[node] = min(int(variant.flops(node)), self.costs[node].flops)

    @classmethod
    def compute(cls, gm: GraphModule, ctx: Any) -> "CostModel":
        return cls(gm)

    def seconds(self, nodes) -> float:
        """Recomputing ``nodes``, each as its own kernel (FX execution)."""
        total = 0.0
        for n in nodes:
            total += self.costs[n].seconds
            if n in self.recompute_flops:
                total -= (self.costs[n].flops - self.recompute_flops[n]) / self.rates.node_flop_rate(n, _dtype(n))
        return total

    def _flops_recomputed(self, n: Node) -> int:
        return self.recompute_flops.get(n, self.costs[n].flops)

    @staticmethod
    def _inlined_reads(node: Node, group: set, held) -> set:
        """What ``node``'s kernel reads from memory: its inputs, seen through the group's
        values that are inlined (not ``held``) into it."""
        reads, stack, seen = set(), list(node.all_input_nodes), set()
        while stack:
            a = stack.pop()
            if a in seen:
                continue
            seen.add(a)
            if a in group and a not in held:
                stack.extend(a.all_input_nodes)
            else:
                reads.add(a)
        return reads

    def fused_seconds(self, nodes, held) -> float:
        """Recomputing ``nodes`` as Inductor would run them: every node's FLOPs, but memory traffic
        only for tensors that exist in memory: what the group reads from outside itself or
        from its ``held`` members (materialized: matmul outputs, reductions, what matmuls
        read), and what its held members write. Inlined pointwise values cost no bytes."""
        group = set(nodes)
        flop_seconds = sum(self._flops_recomputed(n) / self.rates.node_flop_rate(n, _dtype(n)) for n in group)
        # with ``flop_op_bytes`` off, an op with FLOPs is its own kernel whose time holds its
        # reads and writes; the bytes are those of the memory-bound members only
        flop_ops = set() if self.rates.flop_op_bytes else {n for n in group if self.costs[n].flops}
        memory = group - flop_ops
        reads = {a for n in memory for a in n.all_input_nodes if a not in group or a in held}
        writes = {n for n in memory if n in held}
        moved = sum(tensor_bytes(t) for a in reads | writes for _, t in tensor_values(a.meta.get("val")))
        # a looped reduction reads its inputs (through the pointwise ops inlined into it) in
        # a loop of its own before anything can use its result: those reads come on top of
        # the group's one pass; reductions over the same inputs share the loop, also when one
        # reads the other's result (Inductor's online softmax: the row maximum and the sum
        # of exponentials in one pass)
        passes = {frozenset(a for a in self._inlined_reads(r, group, held) if a not in self.looped)
                  for r in memory & self.looped}
        moved += sum(tensor_bytes(t) for leaves in passes for a in leaves for _, t in tensor_values(a.meta.get("val")))
        kernels = len(writes) + (1 if memory - writes else 0) + len(flop_ops)
        return flop_seconds + moved / self.rates.memory_rate + kernels * self.rates.launch_s
