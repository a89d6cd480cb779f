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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node


from .. import compat
from .base import Analysis
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

    def flop_rate(self, dtype: torch.dtype) -> float:
        return self.flops_per_s.get(dtype, self.flops_per_s[torch.float32]) * self.compute_efficiency

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
        return DeviceRates(flops_per_s=flops, **{k: float(v) for k, v in raw.items()})


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


def recompute_rates(device_type: str, lowered: bool) -> DeviceRates:
    """What recomputation is priced with: on a GPU, the bandwidth Inductor's generated
    kernels reach (a third of the copy bandwidth), or dsgraph's lowered kernels' when
    ``lower_triton`` will run the recomputed chains through Inductor; elsewhere the
    uncalibrated rates (the CPU's own are not modelled: plans stay comparable)."""
    if device_type != "cuda":
        return H200
    return H200_LOWERED if lowered else H200_CALIBRATED


@dataclass(frozen=True)
class NodeCost:
    flops: int
    bytes: int
    seconds: float


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


def _dtype(node: Node) -> torch.dtype:
    vals = tensor_values(node.meta.get("val"))
    return vals[0][1].dtype if vals else torch.float32


def node_bytes_moved(node: Node) -> int:
    """Bytes a kernel for this node reads (its tensor inputs) and writes (its outputs)."""
    if node.op != "call_function" or is_view(node):
        return 0
    read = sum(tensor_bytes(t) for a in node.all_input_nodes for _, t in tensor_values(a.meta.get("val")))
    written = node_bytes(node)
    return read + written


class CostModel(Analysis):
    name = "CostModel"

    def __init__(self, gm: GraphModule, rates: DeviceRates = H200):
        self.rates = rates
        self.costs: dict[Node, NodeCost] = {}
        for node in gm.graph.nodes:
            flops = node_flops(node)
            moved = node_bytes_moved(node)
            vals = tensor_values(node.meta.get("val"))
            dtype = vals[0][1].dtype if vals else torch.float32
            seconds = flops / rates.flop_rate(dtype) + moved / rates.memory_rate
            if moved or flops:
                seconds += rates.launch_s
            self.costs[node] = NodeCost(flops, moved, seconds)

    @classmethod
    def compute(cls, gm: GraphModule, ctx: Any) -> "CostModel":
        return cls(gm)

    def seconds(self, nodes) -> float:
        """Each node as its own kernel (FX execution)."""
        return sum(self.costs[n].seconds for n in nodes)

    def fused_seconds(self, nodes, held) -> float:
        """``nodes`` run as Inductor would run them: every node's FLOPs, but memory traffic
        only for tensors that exist in memory: what the group reads from outside itself or
        from its ``held`` members (materialized: matmul outputs, reductions, what matmuls
        read), and what its held members write. Inlined pointwise values cost no bytes."""
        group = set(nodes)
        flop_seconds = sum(self.costs[n].flops / self.rates.flop_rate(_dtype(n)) for n in group)
        reads = {a for n in group for a in n.all_input_nodes if a not in group or a in held}
        writes = {n for n in group if n in held}
        moved = sum(tensor_bytes(t) for a in reads | writes for _, t in tensor_values(a.meta.get("val")))
        kernels = len(writes) + (1 if group - writes else 0)
        return flop_seconds + moved / self.rates.memory_rate + kernels * self.rates.launch_s
