"""Dynamo: the real objects behind a graph's inputs, explanations of graph breaks, resets.
Checked on torch 2.11 (GPU) and 2.13 (CPU)."""

from __future__ import annotations

from typing import Any

import torch

def dynamo_graph_inputs(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, Any]]:
    """(placeholder, the real object Dynamo bound to it or None) for a Dynamo graph.

    Dynamo keeps the real tensor of each graph input in the placeholder's ``grapharg``
    (possibly through a weak reference that may be gone).
    """
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        try:
            example = grapharg.example if grapharg is not None else None
        except Exception:  # the weak reference died
            example = None
        out.append((node, example))
    return out




def explain(fn, *inputs) -> Any:
    """``torch._dynamo.explain``: graphs, graph breaks and their reasons."""
    return torch._dynamo.explain(fn)(*inputs)


def reset() -> None:
    """Forget every compiled graph (the next call compiles afresh)."""
    torch._dynamo.reset()
