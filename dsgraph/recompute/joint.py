"""JointGraph: the forward/backward structure of a joint graph, as the checkpoint planner sees it.

AOTAutograd's joint graph takes ``primals_*`` (parameters, buffers, inputs) and
``tangents_*`` and computes the forward outputs and the gradients. For recomputation what
matters is:

- which nodes are forward (computable from the primals alone) and which are backward
  (depend on a tangent, or are tagged ``must_be_in_backward``);
- which primals are parameters or buffers (``static_lifetime_input_indices``: they exist
  for the whole step anyway) and which are data inputs;
- which forward nodes are *static* (depend on no data input: weight casts and transposes,
  masks, random seeds) and which carry activations;
- which forward nodes are *random* (a ``nondeterministic_seeded`` op, or derived from one
  without any activation input), and which of them are *unreproducible*: recomputing them
  would draw new numbers, so they are saved. A seeded op always is; Inductor's
  ``inductor_random`` (dropout's numbers, from a seed its joint-graph passes draw) is when
  the graphs run as FX code, which ignores the seed (FACTS.md), but not when Inductor
  compiles them: its kernels draw from (seed, element index), so the backward recomputes
  the same mask from the saved seed, as Inductor's own partition does for per-block
  checkpointing (``replays_inductor_random``);
- which forward nodes are *free*: static ones and *input-only* ones (computed from data
  inputs alone, such as a padding mask or the labels' one-hot): the backward can compute
  them again from the primals, which live through the step, so they never cost a cut.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Sequence

from torch.fx import GraphModule, Node

from ..analysis.inductor_ops import op_name
from ..analysis.lifetimes import node_bytes, storage_key
from ..analysis.ops import is_random


def _is_tangent(node: Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


_INDUCTOR_RANDOM = ("inductor_random", "inductor_randint")


def _seeded(node: Node) -> bool:
    """Inductor's random op drawing from one of the step's seeds (``inductor_lookup_seed`` of
    ``inductor_seeds``, the default path): its numbers are a function of the seed and the
    element. Any other seed (``align_random_eager``'s generator offsets) is not replayed."""
    seeds = [a for a in node.all_input_nodes if a.op == "call_function"]
    return len(seeds) == 1 and op_name(seeds[0]) == "inductor_lookup_seed" and all(
        a.op == "call_function" and op_name(a) == "inductor_seeds" for a in seeds[0].all_input_nodes)


@dataclass
class JointGraph:
    gm: GraphModule
    num_fwd_outputs: int
    primals: list[Node]
    tangents: list[Node]
    params: set[Node]  # primals that live for the whole step (parameters, buffers)
    forward: list[Node]  # forward call_function nodes, in graph order
    backward: set[Node]  # nodes the backward computes (depend on tangents, or tagged backward)
    static: set[Node]  # forward nodes that depend on no data input
    random: set[Node]  # random forward nodes and static nodes derived from them
    # random nodes whose recomputation draws new numbers (a seeded op, Inductor's
    # inductor_random run as FX code): always saved when the backward needs them
    unreproducible: set[Node] = field(default_factory=set)
    position: dict[Node, int] = field(default_factory=dict)  # forward node -> index in ``forward``
    input_only: set[Node] = field(default_factory=set)  # forward nodes computed from data inputs alone
    primal_storages: frozenset = frozenset()  # storage keys of the primals (views of them are free)
    backward_reads: list[Node] = field(default_factory=list)  # non-backward nodes the backward reads
    order: dict[Node, int] = field(default_factory=dict)  # every node -> its index in the graph

    @classmethod
    def build(cls, gm: GraphModule, num_fwd_outputs: int, static_input_indices: Sequence[int],
              replays_inductor_random: bool = False) -> "JointGraph":
        """``replays_inductor_random``: the graphs run through Inductor, whose
        ``inductor_random`` kernels give the same numbers for the same seed."""
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        primals = [n for n in placeholders if not _is_tangent(n)]
        tangents = [n for n in placeholders if _is_tangent(n)]
        params = {primals[i] for i in static_input_indices if i < len(primals)}

        backward: set[Node] = set(tangents)
        for n in nodes:
            if n.op != "call_function":
                continue
            # as torch's classify_nodes: AOTAutograd's "is_backward" tag alone does not pin
            # a node to the backward (a detach or a weight transpose the backward formula
            # made may be computed in the forward and saved); "must_be_in_backward" does
            if n.meta.get("partitioner_tag") == "must_be_in_backward" or any(a in backward for a in n.all_input_nodes):
                backward.add(n)
        backward -= set(tangents)

        # forward: ancestors of the forward outputs (the "core"), plus nodes the backward
        # reads that need no tangent (a detach or a weight transpose a backward formula
        # made, masks): AOTAutograd places those among the backward nodes, so each is put
        # right after its latest forward input instead, where it could run
        output = gm.graph.output_node()
        outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        core = _ancestors([o for o in outs[:num_fwd_outputs] if isinstance(o, Node)], backward)
        forward_set = core | _ancestors([a for b in nodes if b in backward for a in b.all_input_nodes], backward)
        index = {n: i for i, n in enumerate(nodes)}
        anchor: dict[Node, int] = {}
        for n in nodes:
            if n in forward_set:
                ins = [anchor[a] for a in n.all_input_nodes if a in anchor]
                anchor[n] = index[n] if n in core else max(ins, default=-1)
        forward = sorted(forward_set, key=lambda n: (anchor[n], n not in core, index[n]))

        static: set[Node] = set()
        random: set[Node] = set()
        for n in forward:
            ins = n.all_input_nodes
            if all((a in params) or (a in static) for a in ins if a.op != "get_attr"):
                static.add(n)
            derived = any(a in random for a in ins) and (n in static or n.target is operator.getitem)
            if is_random(n) or derived:  # an element of a random op (native_dropout's mask) too
                random.add(n)
        joint = cls(gm, num_fwd_outputs, primals, tangents, params, forward, backward, static, random)
        joint.position = {n: i for i, n in enumerate(forward)}
        joint.order = index
        joint.unreproducible = {n for n in random if is_random(n)
                                or (op_name(n) in _INDUCTOR_RANDOM and not (replays_inductor_random and _seeded(n)))}
        joint.primal_storages = frozenset(storage_key(p) for p in primals)
        joint.backward_reads = list(dict.fromkeys(a for b in nodes if b in backward for a in b.all_input_nodes
                                                  if a not in backward))
        data_inputs = set(primals) - params
        # a static value derived from a parameter (autocast's bf16 weight copy) is not an
        # input: counting it as one marked a whole bf16 network input-only (a conv of the
        # image and a cast weight), so the planner found no cut at all (ResNet-50 bf16)
        weight_derived = set(params)
        for n in forward:
            if n in static and any(a in weight_derived for a in n.all_input_nodes):
                weight_derived.add(n)
        for n in forward:
            ins = [a for a in n.all_input_nodes if a.op != "get_attr"]
            if n not in static and ins and all(
                    a in data_inputs or a in joint.input_only or (a in static and a not in weight_derived) for a in ins):
                joint.input_only.add(n)
        return joint

    def is_free(self, node: Node) -> bool:
        """Costs nothing to keep across a cut: a primal (or a view of one), a static or an
        input-only value (computed again from the primals), or a random value (saved
        whatever the plan)."""
        return (node.op == "placeholder" or node in self.static or node in self.input_only or node in self.random
                or storage_key(node) in self.primal_storages)

    def is_activation(self, node: Node) -> bool:
        """A forward tensor that depends on the data inputs (not static, not a primal)."""
        return node in self.position and node not in self.static and node_bytes(node) > 0


def _ancestors(roots, backward: set[Node]) -> set[Node]:
    """call_function ancestors of ``roots`` (roots included) outside the backward."""
    out: set[Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in out or n.op != "call_function" or n in backward:
            continue
        out.add(n)
        stack.extend(n.all_input_nodes)
    return out

