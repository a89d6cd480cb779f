"""AOTAutograd (torch._functorch): partitioning, boxed calls, its config.

Checked on torch 2.11 (GPU) and 2.13 (CPU).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

def default_partition(gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
    """What Inductor's partition_fn does when no custom partitioner is set.

    Called with keyword arguments only (FACTS.md: torch passes ``num_fwd_outputs`` and
    ``static_lifetime_input_indices`` as keywords on 2.11 and 2.13).
    """
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)


def make_boxed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A callable AOTAutograd calls with one list argument that it may clear."""
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


@contextlib.contextmanager
def dsgraph_compile_config(extra_functorch: dict[str, Any] | None = None):
    """Config for a dsgraph compile.

    force_non_lazy_backward_lowering: the backward compiles inside the first compile, so a
    failure in either graph reverts both. enable_autograd_cache off: a cache hit would load
    compiled graphs without calling dsgraph's partitioner or inner compiler, skipping its
    passes, runtime wrappers and reports. Inductor's FX graph cache stays on: it keys on the
    graph after dsgraph's passes, so a hit is always for the graph dsgraph produced.
    """
    import torch._functorch.config as fconfig

    patches = {"force_non_lazy_backward_lowering": True, "enable_autograd_cache": False}
    patches.update(extra_functorch or {})
    with fconfig.patch(**patches):
        yield


def extract_partition(joint: torch.fx.GraphModule, saved: list, num_fwd_outputs: int, static_input_indices):
    """Forward and backward modules passing exactly ``saved`` (forward nodes) between them,
    built the way Inductor's min-cut partitioner finishes (torch 2.11 to 2.13): torch's
    extraction, backward reordered like the autograd engine, getitems raised."""
    import inspect

    from torch._functorch import partitioners as P

    node_info = P.classify_nodes(joint, list(static_input_indices or []), num_fwd_outputs)
    sym = [n for n in saved if P.is_sym_node(n)]
    tensors = [n for n in saved if not P.is_sym_node(n)]
    kwargs = dict(num_fwd_outputs=num_fwd_outputs, static_lifetime_input_nodes=node_info.static_lifetime_input_nodes)
    if "saved_opaque_nodes" in inspect.signature(P._extract_fwd_bwd_modules).parameters:
        kwargs["saved_opaque_nodes"] = []
    fw, bw = P._extract_fwd_bwd_modules(joint, tensors, saved_sym_nodes=sym, **kwargs)
    bw = P.reordering_to_mimic_autograd_engine(bw)
    fw, bw = P.raise_getitems(fw), P.raise_getitems(bw)
    if hasattr(P, "thread_graphsafe_rng_from_hops"):
        fw = P.thread_graphsafe_rng_from_hops(fw, is_backward=False)
        bw = P.thread_graphsafe_rng_from_hops(bw, is_backward=True)
    return fw, bw


def fx_graph_cse(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    """The common-subexpression elimination Inductor's partitioner runs first."""
    from torch._functorch.compile_utils import fx_graph_cse as _cse

    return _cse(gm.graph)


class _MinCutChoice(Exception):
    def __init__(self, names: list[str]):
        self.names = names


def min_cut_saved_names(gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any) -> list[str]:
    """Names of the values Inductor's min-cut partitioner would save, without building its
    forward and backward modules (most of its time on a large graph): the partitioner runs
    on a copy and stops when it hands its choice to ``_extract_fwd_bwd_modules``. Values the
    backward turns out not to read are dropped by the extraction; callers drop them too."""
    return min_cut_partition_if(gm, joint_inputs, lambda names: False, **kwargs)[0]


def min_cut_partition_if(gm: torch.fx.GraphModule, joint_inputs: Sequence[object], keep: Callable[[list[str]], bool],
                         **kwargs: Any):
    """Inductor's min-cut partition of a copy of ``gm``, run once: when it has chosen what
    to save, ``keep(names)`` (the names ``min_cut_saved_names`` returns) decides whether
    it goes on to build its forward and backward modules. Returns ``(names, (fw, bw))``
    when ``keep`` said yes (exactly what ``default_partition`` on a copy returns), else
    ``(names, None)`` without building them. Checked on torch 2.13
    (``torch._functorch.partitioners``)."""
    from torch._functorch import partitioners as P

    original = P._extract_fwd_bwd_modules
    chosen: list[list[str]] = []

    def decide(joint_module, saved_values, *args, **kw):
        sym = kw.get("saved_sym_nodes", args[0] if args else ())
        names = [n.name for n in list(saved_values) + list(sym or [])]
        chosen.append(names)
        if not keep(names):
            raise _MinCutChoice(names)
        P._extract_fwd_bwd_modules = original
        return original(joint_module, saved_values, *args, **kw)

    P._extract_fwd_bwd_modules = decide
    try:
        from .fx import copy_graph_module

        modules = default_partition(copy_graph_module(gm), joint_inputs, **kwargs)
    except _MinCutChoice as choice:
        return choice.names, None
    finally:
        P._extract_fwd_bwd_modules = original
    if not chosen:
        raise RuntimeError("the min-cut partitioner returned without choosing what to save")
    return chosen[0], modules
