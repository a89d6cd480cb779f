"""The backward compiled ahead: in a subprocess, while this process compiles the forward.

AOTAutograd compiles a training graph's forward, then its backward, in the compiling
process; with recomputation the backward is the larger of the two (GPT-2-small with a
budget on the H200: 10.6 s against the forward's 5 s, docs/BENCHMARKS.md session 16). Both
exist once the joint graph is partitioned, so when the forward's compile starts, the
backward is sent to dsgraph's compile worker (``ahead_worker``; Inductor's protocol in
``compat.inductor_ahead``) and compiled there at the same time. When AOTAutograd then compiles the backward here, Inductor's
codegen step is served the worker's ``CompiledFxGraph`` if, and only if, the graph, its
inputs, the compile arguments and Inductor's config are what the worker compiled
(``compat.inductor_ahead.fingerprint``); otherwise (a backward pass changed the graph, the
compiled forward returned other strides) it compiles here as it always did. The worker
runs the same Inductor code on the same pickled graph, so the result is what this process
would have produced; tests/e2e/test_compile_ahead.py holds the gradients bitwise equal.

When a post-compile check or a dump needs Inductor's buffer plan of the backward
(``analysis.inductor_plan``), the worker reads it from its own scheduler and returns it.

Off by default (``compile_ahead=True`` turns it on). Measured on the H200 (GPT-2-small at
2.94 GiB, docs/BENCHMARKS.md): in session 17, through Inductor's own worker pool (which
imports torch twice before its first job), the backward started about 8 s after it was
sent and the first step took 3-7 s longer. Session 18 runs it in dsgraph's worker
(``ahead_worker``, started at the backend's entry): the backward starts 0.3-1.8 s after it is
sent and the GPU bitwise test passes, but the forward's compile here and the backward's in
the worker slow each other down (7.6-7.8 and 12.4-13.2 s against 4.7-6.3 and 10.3-10.4 s
alone): over two calls the first step was 27.2-32.2 s with it and 26.3-38.8 s without, a
host's noise larger than any gain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import time
from typing import Any

import torch

from .. import compat
from ..analysis.inductor_plan import GraphCapture, inductor_plan
from ..analysis.plan import GraphPlan
from . import ahead_worker

log = logging.getLogger("dsgraph")


def warm_up() -> None:
    """Start the worker now (at the backend's entry), while this process plans and partitions."""
    ahead_worker.worker()


@dataclasses.dataclass
class BackwardAhead:
    future: Any
    fingerprint: tuple
    settings: tuple  # the process-wide torch settings the worker must compile under
    submitted_s: float  # seconds this process spent preparing and sending it
    sent_at: float  # time.time() when it was sent
    plan: GraphPlan | None = None
    child_s: float | None = None  # the worker's compile, seconds
    queued_s: float | None = None  # from the send to the worker's start on it (its own start-up)
    waited_s: float = 0.0  # how long this process waited for it
    error: str | None = None
    served: bool = False  # the backward's codegen took the worker's result

    def result(self, gm: torch.fx.GraphModule) -> Any:
        start = time.perf_counter()
        try:
            pickled, self.plan, self.child_s, seen, began_at = self.future.result()
            self.queued_s = began_at - self.sent_at
            if seen != self.settings:
                raise RuntimeError(f"the worker compiled under torch settings {seen}, not {self.settings}")
            code = compat.inductor_ahead.output_code(pickled, gm)
            self.served = True
            return code
        except Exception as e:  # noqa: BLE001  the graph compiles here instead
            self.error = f"{type(e).__name__}: {e}"
            log.warning("the backward compiled ahead failed (%s); compiling it in this process", self.error)
            return None
        finally:
            self.waited_s = time.perf_counter() - start

    def serving(self):
        return compat.inductor_ahead.serving(self.fingerprint, self.result)

    def figures(self) -> dict[str, Any]:
        return {"compile_ahead_served": self.served, "compile_ahead_submit_s": round(self.submitted_s, 3),
                "compile_ahead_queued_s": None if self.queued_s is None else round(self.queued_s, 3),
                "compile_ahead_child_s": None if self.child_s is None else round(self.child_s, 3),
                "compile_ahead_wait_s": round(self.waited_s, 3), "compile_ahead_error": self.error}


def _relaid_out(fw: torch.fx.GraphModule) -> bool:
    """Will Inductor lay the forward out channels last (its layout optimization of a graph
    with a convolution)? Then the saved activations reach the backward with other strides
    than the partition's (AOTAutograd restrides the backward's inputs to what the compiled
    forward returned): a backward compiled for the partition's strides would never be
    served (the CPU zoo's CNN, session 17)."""
    convolutions = [n for n in fw.graph.nodes if n.target is torch.ops.aten.convolution.default]
    return bool(convolutions) and compat.inductor_layout_opt_possible(convolutions[0].meta["val"].device.type)


def start(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, forward_kwargs: dict[str, Any],
          want_plan: bool) -> BackwardAhead | None:
    """Send the partitioned backward to the worker; None where it cannot go (dynamic sizes,
    a forward Inductor lays out anew, something Inductor's protocol does not carry)."""
    begin = time.perf_counter()
    if _relaid_out(fw):
        return None
    example_inputs = [n.meta.get("val") for n in bw.graph.nodes if n.op == "placeholder"]
    if not compat.inductor_ahead.static_inputs(example_inputs):
        return None
    kwargs = compat.inductor_ahead.backward_kwargs(bw, forward_kwargs)
    pickled = compat.inductor_ahead.serialize(bw, example_inputs, kwargs)
    if pickled is None:
        return None
    checked = compat.inductor_ahead.inputs_to_check(example_inputs, kwargs)
    fingerprint = compat.inductor_ahead.fingerprint(bw, example_inputs, checked, kwargs)
    settings = compat.inductor_ahead.global_settings()
    sent_at = time.time()
    future = ahead_worker.worker().submit(_child, pickled, compat.inductor_ahead.child_env(), want_plan, settings,
                                          compat.inductor_ahead.donated_inputs())
    return BackwardAhead(future, fingerprint, settings, time.perf_counter() - begin, sent_at)


def _child(pickled_input: Any, extra_env: dict[str, str], want_plan: bool, settings: tuple,
           donated: list[int] | None):
    """In the worker: Inductor's compile of the graph, and its buffer plan when asked."""
    began_at, begin = time.time(), time.perf_counter()
    compat.inductor_ahead.apply_global_settings(settings)
    for module in ("linear_cross_entropy", "ops"):  # dsgraph's ops exist before the graph is read
        importlib.import_module(f"dsgraph.runtime.{module}")
    capture = GraphCapture()
    output = compat.inductor_ahead.run_in_child(pickled_input, extra_env,
                                                capture.active if want_plan else contextlib.nullcontext, donated)
    plan = _portable(inductor_plan(capture.graphs[0])) if want_plan and capture.graphs else None
    return output, plan, time.perf_counter() - begin, compat.inductor_ahead.global_settings(), began_at


def _portable(plan: GraphPlan) -> GraphPlan:
    """The plan without its symbolic-size closures (the graph is static: each is its
    number of bytes), so it pickles back to the parent."""
    plan.blocks = [dataclasses.replace(b, expr=None) for b in plan.blocks]
    plan.input_expr = {}
    return plan
