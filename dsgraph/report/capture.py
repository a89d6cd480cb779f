"""Capturing what dsgraph compiled, for memory predictions.

``capture()`` is a context manager: every dsgraph compile inside it records its forward
and backward graphs as they were handed to the backend compiler (and before dsgraph's
passes), Inductor's final schedule of each (``GraphPlan``), which forward outputs the
backward receives, and the Dynamo graph's inputs with their symbolic sizes. (Reading
Inductor's schedule needs a real compile: ``GraphCapture`` turns the FX graph cache off
around each captured ``compile_fx_inner``.) ``dsgraph.memory_profile`` and the benchmarks build on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import sympy
import torch

from .. import compat
from ..analysis.lifetimes import storage_bytes_expr
from ..analysis.step import StageGraphs

_current: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar("dsgraph_capture", default=None)


@dataclass
class CapturedCompile:
    compile_id: str
    inductor: bool
    stages: dict[str, StageGraphs] = field(default_factory=dict)
    saved_names: list[str] = field(default_factory=list)
    # Dynamo graph inputs: (a weak reference to the real tensor, its bytes as a sympy
    # expression over the graph's size symbols); None when Dynamo did not keep the tensor.
    # Weak: the session holding this capture lives as long as Dynamo's cache keeps the
    # compiled graph, and strong references kept the model and its inputs alive with it
    dynamo_inputs: list[tuple[weakref.ref | None, Callable[[], sympy.Expr]]] = field(default_factory=list)
    fallback: str | None = None


class Capture:
    def __init__(self) -> None:
        self.compiles: list[CapturedCompile] = []


def current() -> Capture | None:
    return _current.get()


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    cap = Capture()
    token = _current.set(cap)
    try:
        yield cap
    finally:
        _current.reset(token)


def dynamo_inputs(gm: torch.fx.GraphModule) -> list[tuple[weakref.ref | None, Callable[[], sympy.Expr]]]:
    """(weak reference to the real tensor, bytes expression) for each tensor input of a
    Dynamo graph."""
    out = []
    for node, example in compat.dynamo_graph_inputs(gm):
        val = node.meta.get("example_value")
        if isinstance(val, torch.Tensor):
            out.append((None if example is None else weakref.ref(example), (lambda v=val: storage_bytes_expr(v))))
    return out
