"""lifetimes: annotate every node with the bytes it produces and the bytes live at it.

Changes nothing in the graph. Before/after::

    mm = torch.ops.aten.mm.default(x, w)        ->  same code; node.meta["dsgraph_bytes"] = 640,
                                                     node.meta["dsgraph_live_bytes"] = 1344

Stats: the graph's peak live bytes as FX would execute it and the node where it peaks; on
the forward graph also the bytes it saves for backward (``saved_bytes``: storages the
forward allocates and returns to the backward, not parameters or inputs).
"""

from __future__ import annotations

from dsgraph.analysis.lifetimes import TensorLifetimes
from dsgraph.pass_api import PassContext, PassResult, PassSpec

SPEC = PassSpec(
    name="lifetimes",
    handles_mutation=True,  # storage-aware: views and in-place ops are understood
    rewrites=False,
    stages=("forward", "backward", "inference"),
    reads=("TensorLifetimes",),
    preserves=("TensorLifetimes",),
    doc="annotates bytes per node and the graph's predicted peak",
)


def run(gm, ctx: PassContext) -> PassResult:
    lifetimes: TensorLifetimes = ctx.analysis(TensorLifetimes)
    for i, node in enumerate(lifetimes.nodes):
        node.meta["dsgraph_bytes"] = lifetimes.node_bytes(node)
        node.meta["dsgraph_live_bytes"] = lifetimes.live[i]
    peak, peak_node = lifetimes.peak()
    stats = {"nodes": len(lifetimes.nodes), "peak_bytes": peak, "peak_node": peak_node.name if peak_node else "-"}
    saved = ctx.state.saved_names
    if ctx.stage == "forward" and saved is not None:
        stats["saved_bytes"] = lifetimes.saved_bytes(saved)
    return PassResult(gm, changed=False, stats=stats)
