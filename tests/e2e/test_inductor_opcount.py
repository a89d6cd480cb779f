"""The op counts behind the planner's store-or-recompute emulation, against Inductor's own.

Inductor stores a pointwise expression (instead of inlining it into its readers) when its
op count passes ``realize_opcount_threshold`` (30 on a GPU, 50 on the CPU) or its loads
pass ``realize_acc_reads_threshold``: the count decides which buffers exist. Counted
wrongly, the emulation realized the cross-entropy backward's 26-op expression on CUDA (it
counted 32): a second logits-sized buffer, and the planner's Inductor prediction 26% high
for the stock partition and 41% high for the smallest plan on a 4-layer GPT at full width
(H200, ``benchmarks.planner_truth``). This test reads Inductor's count of every pointwise
node it lowers (``inner_fn_opcount`` on the real lowering, CPU) and holds the emulation's
count of the same nodes to it: every node within 2 ops and with Inductor's number of
distinct loads, no node on the other side of either device's threshold, and the loss
head's expression exact. The counter CSEs by value: a node's ops count once per index it
is evaluated at (a slice and its neighbour, an unrolled reduction's elements, an indirect
read), a constant once per expression whoever makes it (``constant(0)`` is not
``constant(0.0)``), a load once per (buffer, index); ``clone`` and a cast to the same dtype
add nothing (``dsgraph.analysis.inductor_index``, ``inductor_ops``).
"""

import pytest
import torch
import torch._inductor.graph as inductor_graph
import torch._inductor.ir as ir

import dsgraph.analysis.inductor_model as inductor_model
from dsgraph.analysis.inductor_ops import Rules
from dsgraph.analysis.step_model import StepModel
from dsgraph.models import GPT, GPTConfig
from dsgraph.recompute import truth
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.planner import external_bytes

pytestmark = pytest.mark.e2e


def _inductor_counts(monkeypatch, model, inputs) -> dict[str, tuple[int, int]]:
    """(ops, distinct loads) of every pointwise node as Inductor lowers it, by node name."""
    counts = {}
    run_node = inductor_graph.GraphLowering.run_node

    def recording(self, n):
        result = run_node(self, n)
        box = result.data if isinstance(result, ir.TensorBox) else None
        if isinstance(box, ir.StorageBox) and isinstance(box.data, ir.Pointwise):
            c = box.data.inner_fn_opcount()
            counts[n.name] = (c.num_ops, len(c.read_buffers))
        return result

    monkeypatch.setattr(inductor_graph.GraphLowering, "run_node", recording)

    def stock(gm, joint_inputs, kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)

    truth.compiled_peaks(model, inputs, stock, inductor=True, autocast=torch.bfloat16)
    return counts


def _emulated_counts(monkeypatch, j) -> dict[str, tuple[int, int]]:
    """(ops, loads) of the expression the emulation forms at each node (the stock partition)."""
    static = j.kwargs.get("static_lifetime_input_indices") or []
    joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], static)
    # the CPU's rules, as the Inductor it is compared with lowers on the CPU (what is stored
    # upstream decides what an expression holds); the counts are then held against both
    # devices' thresholds
    sm = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static, external=external_bytes(joint))
    names = {i: n.name for i, n in enumerate(sm.nodes)}
    counts = {}
    init = inductor_model._Expr.__init__

    def recording(self, loads, terms, consts, ops, heavy, nontrivial, nloads):
        init(self, loads, terms, consts, ops, heavy, nontrivial, nloads)
        counts[names[max(n for n, _ in terms)]] = (ops, self.nloads)  # the node being lowered is the newest

    monkeypatch.setattr(inductor_model._Expr, "__init__", recording)
    by_name = {n.name: n for n in j.gm.graph.nodes}
    sm.evaluate([sm.index[by_name[n]] for n in j.stock_saved], "inductor")
    return counts


def _compare(monkeypatch, model, inputs) -> tuple[dict, dict, list]:
    j = truth.capture_joint(model, inputs, autocast=torch.bfloat16)
    mine = _emulated_counts(monkeypatch, j)
    real = _inductor_counts(monkeypatch, model, inputs)
    both = sorted(set(mine) & set(real))
    far = {n: (real[n], mine[n]) for n in both if abs(real[n][0] - mine[n][0]) > 2 or real[n][1] != mine[n][1]}
    assert not far, far
    for rules in (Rules.for_device("cuda"), Rules.for_device("cpu")):
        crossed = {n: (real[n], mine[n]) for n in both if (real[n][0] > rules.opcount) != (mine[n][0] > rules.opcount)}
        assert not crossed, (rules, crossed)
    return real, mine, both


def test_emulated_op_counts_are_inductors(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=211, seq=64, layers=2, heads=2, dim=32)
    model = GPT(cfg)
    ids = torch.randint(0, cfg.vocab, (8, cfg.seq))
    real, mine, both = _compare(monkeypatch, model, (ids, ids.clone()))
    assert len(both) > 150, len(both)  # the comparison covers the step, not a handful of nodes
    # the loss head's backward: softmax minus the one-hot target, the largest expression
    head = max(both, key=lambda n: real[n][0])
    assert real[head][0] > 20 and mine[head] == real[head], (head, real[head], mine[head])


@pytest.mark.parametrize("name", ["gated", "masked", "cnn", "llama"])
def test_op_counts_on_the_zoo(name, monkeypatch, tmp_path):
    """Models of other shapes than the GPT the counts were fixed on: a gated residual
    network, a masked MLP, the CNN with BatchNorm (Welford variance, a constant of 0 shared
    with the correction) and transformers' Llama (rotary slices, the causal mask from
    index comparisons, unrolled two-element reductions of grouped attention's gradients).

    Llama was a strict xfail from session 7 to 28: 25 of 478 nodes off, 12 across a
    threshold. Its rotary backward's two slice_scatters read one expression at j - 8 and
    j + 8. Inductor's counter CSEs an op by its arguments: the sine chain, whose leaves
    (the position's index_expr, the inv_freq load at j mod 8) agree at both shifts,
    counts once (``inductor_model``'s term keys), and so do two loads of the attention
    gradient that land on one address through its strides (``IndexMaps.address``). A
    coordinate outside its dimension stays in it through a reshape
    (``inductor_index.reshape``); ``index`` adds no op of its own, and ``pow(x, 2)`` is a
    multiplication (``inductor_ops``)."""
    from tests import zoo

    if not zoo.available(name):
        pytest.importorskip("transformers")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model, inputs = zoo.build(name)
    real, mine, both = _compare(monkeypatch, model, inputs)
    assert len(both) > 20, len(both)
