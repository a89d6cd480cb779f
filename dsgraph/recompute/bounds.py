"""A true lower bound on the peak of any partition of a joint graph, and what sets it.

Whatever is saved and recomputed, some memory exists at some step of every partition:

- ``external``: the primals (parameters, buffers, inputs) through the whole step;
- ``gradients``: every gradient the backward returns exists at its end (but for those the
  gradient pool takes: the pool's buffer is in ``external``, and they are written into it);
- ``random``: the random values the backward reads exist together when it starts (they
  are saved, never recomputed);
- ``kernel``: a kernel's inputs and outputs exist while it runs. With FX execution
  every node is a kernel; through Inductor only those it cannot fuse away (matmuls,
  convolutions, attention, fallback kernels), whose inputs it stores first.

The bound is ``external`` plus the largest of the other three: no plan the planner makes
(nor any other partition of this graph) peaks below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Node

from ..analysis.inductor_ops import EXTERN
from ..analysis.lifetimes import storage_key, storage_nbytes, tensor_values
from ..analysis.step_model import StepModel
from ..units import format_bytes
from .joint import JointGraph


@dataclass(frozen=True)
class LowerBound:
    nbytes: int
    external: int
    term: str  # "gradients", "random" or "kernel"
    term_bytes: int
    node: str | None = None  # the kernel, when a kernel sets it

    def describe(self) -> str:
        what = {"gradients": "the gradients the backward returns",
                "random": "the random values saved for the backward",
                "kernel": f"the inputs and outputs of {self.node}"}[self.term]
        return (f"{format_bytes(self.nbytes)}: {format_bytes(self.external)} of parameters and inputs plus "
                f"{format_bytes(self.term_bytes)} for {what}")


def _bytes(nodes, exclude) -> int:
    seen: dict = {}
    for n in nodes:
        if not tensor_values(n.meta.get("val")):
            continue
        key = storage_key(n)
        if key not in exclude:
            seen.setdefault(key, storage_nbytes(n))
    return sum(seen.values())


def lower_bound(joint: JointGraph, model: StepModel, executor: str) -> LowerBound:
    # what ``external`` holds already: the primals and, with the gradient pool, the pooled
    # gradients (its buffer is in ``external``; they are written into their slots)
    pooled = {storage_key(model.nodes[i]) for i in model.pooled_outputs}
    primals = set(joint.primal_storages) | pooled
    external = model.external
    output = joint.gm.graph.output_node()
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    grads = _bytes([o for o in outs[joint.num_fwd_outputs:] if isinstance(o, Node)], primals)
    needed = set(joint.backward_reads)
    random = _bytes([n for n in joint.unreproducible if n in needed], primals)
    best, best_node = 0, None
    for n in joint.gm.graph.nodes:
        if n.op != "call_function" or not (n in joint.backward or n in joint.position):
            continue
        if executor == "inductor" and model.info[model.index[n]].kind != EXTERN:
            continue
        io = _bytes(list(n.all_input_nodes) + [n], primals)
        if io > best:
            best, best_node = io, n
    terms = [("gradients", grads, None), ("random", random, None),
             ("kernel", best, f"{best_node.name} ({best_node.target})" if best_node is not None else None)]
    term, nbytes, node = max(terms, key=lambda t: t[1])
    return LowerBound(external + nbytes, external, term, nbytes, node)
