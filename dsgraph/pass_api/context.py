"""What a pass sees besides its graph: configuration, cached analyses, compile state, hooks.

``CompileConfig`` is everything decided before compiling (options, pipeline, the test
failure hook). ``CompileState`` holds the facts one stage leaves for a later one of the
same compile (typed fields, no string keys). One ``PassContext`` is made per graph;
passes read ``ctx.config``, ``ctx.args``, ``ctx.state`` and never the environment.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..analysis.base import Analysis
from .hooks import GraphVariant, Partitioner, PostCompileCheck, RuntimeWrapper
from .options import Options
from .pipeline import Pipeline


@dataclass(frozen=True)
class CompileConfig:
    options: Options
    pipeline: Pipeline
    dump_dir: str | None = None
    debug: bool = False
    test_fail_pass: str | None = None  # DSGRAPH_TEST_FAIL_PASS: that pass raises (tests only)

    @property
    def executor(self) -> str:
        return "inductor" if self.options.inductor else "fx"


@dataclass
class PassResult:
    gm: torch.fx.GraphModule
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompileState:
    """One compile of one Dynamo graph, shared by its stages (joint, forward, backward)."""

    # weak references behind ``graph_params``: this state lives as long as the compiled
    # graph (Inductor's backward compiler closes over the session's inner_compile, its config
    # patch over the partitioner), and Dynamo can keep a compiled graph after its model is
    # gone: on torch 2.13 one with a graph break stays installed in the module's globals even
    # through torch._dynamo.reset(). Strong references kept the parameters, and with them the
    # gradient pool's buffer, alive for good (stock backends keep no parameter there)
    param_refs: list = field(default_factory=list, repr=False)
    attempt: int = 1  # compiles of this graph so far (a post-compile check can ask again)
    carry: dict[str, Any] = field(default_factory=dict)  # pass name -> what its Recompile carried
    # pass name -> what it found for later passes of this compile (chunk_loss: the loss sites
    # it left unchunked for the checkpoint planner to price, see passes/loss_choice.py)
    findings: dict[str, Any] = field(default_factory=dict)
    partition_kwargs: dict[str, Any] | None = None  # Inductor's keyword arguments to the partitioner
    saved_names: list[str] | None = None  # what the backward receives from the forward
    partitioner: tuple[str, Partitioner] | None = None  # (pass name, partition function)
    # forward inputs (by position) passes asked the backward to receive, and after the
    # partition the backward placeholder that carries each
    backward_receives: set[int] = field(default_factory=set)
    backward_input_names: dict[int, str] = field(default_factory=dict)
    post_compile_checks: list[tuple[str, PostCompileCheck]] = field(default_factory=list)

    @property
    def graph_params(self) -> list:
        """For each input of the Dynamo graph, the nn.Parameter it is (requiring grad) or
        None; the backward's outputs follow these inputs (FACTS.md). During a compile Dynamo
        holds the parameters (they are the graph's example inputs), so none reads as None."""
        return [None if r is None else r() for r in self.param_refs]

    @graph_params.setter
    def graph_params(self, params: list) -> None:
        self.param_refs = [None if p is None else weakref.ref(p) for p in params]


class PassContext:
    def __init__(
        self,
        config: CompileConfig,
        stage: str,
        graph_name: str,
        example_inputs: Sequence[Any] = (),
        state: CompileState | None = None,
    ):
        self.config = config
        self.stage = stage
        self.graph_name = graph_name  # "c000_forward"
        self.example_inputs = list(example_inputs)
        self.state = state if state is not None else CompileState()
        self.args: dict[str, Any] = {}  # parsed pipeline arguments of the running pass
        self.runtime_wrappers: list[tuple[str, RuntimeWrapper]] = []
        self.variants: list[GraphVariant] = []
        self.dump_files: dict[str, str] = {}  # file name -> text, written into this graph's dump
        self.figures: dict[str, Any] = {}  # figures for this graph's report
        self._analyses: dict[type, Analysis] = {}
        self._current_pass: str | None = None
        self._pass_index = 0

    # -- analyses ---------------------------------------------------------------------------

    def analysis(self, cls: type) -> Any:
        cached = self._analyses.get(cls)
        if cached is None:
            cached = cls.compute(self.gm, self)
            self._analyses[cls] = cached
        return cached

    def invalidate(self, preserves: Sequence[str] = ()) -> None:
        self._analyses = {c: a for c, a in self._analyses.items() if c.name in preserves}

    # -- hooks (see hooks.py) ---------------------------------------------------------------

    @property
    def pass_name(self) -> str:
        if self._current_pass is None:
            raise RuntimeError("hooks are registered by a running pass")
        return self._current_pass

    @property
    def carry(self) -> Any:
        """What this pass's post-compile check carried into this compile (None at first)."""
        return self.state.carry.get(self.pass_name)

    def register_runtime_wrapper(self, wrapper: RuntimeWrapper) -> None:
        """Wrap the compiled graph at run time (a persistent pool, a variant switch)."""
        self.runtime_wrappers.append((self.pass_name, wrapper))

    def set_partitioner(self, fn: Partitioner) -> None:
        """Joint stage: partition forward from backward with ``fn`` instead of Inductor's min-cut."""
        if self.stage != "joint":
            raise RuntimeError(f"set_partitioner is a joint-stage hook; pass '{self.pass_name}' ran on {self.stage}")
        if self.state.partitioner is not None and self.state.partitioner[0] != self.pass_name:
            raise RuntimeError(f"passes '{self.state.partitioner[0]}' and '{self.pass_name}' both set the partitioner")
        self.state.partitioner = (self.pass_name, fn)

    def pass_to_backward(self, indices) -> None:
        """Joint stage: the backward receives these forward inputs (positions among the
        graph's inputs), whatever the partition; after partitioning,
        ``ctx.state.backward_input_names`` names the placeholder carrying each."""
        if self.stage != "joint":
            raise RuntimeError(f"pass_to_backward is a joint-stage hook; pass '{self.pass_name}' ran on {self.stage}")
        self.state.backward_receives.update(int(i) for i in indices)

    def add_post_compile_check(self, check: PostCompileCheck) -> None:
        """Run ``check`` on the compiled forward and backward (see ``CompiledStep``)."""
        self.state.post_compile_checks.append((self.pass_name, check))

    def add_variant(self, name: str, gm: torch.fx.GraphModule, use_when) -> None:
        """Compile ``gm`` too and run it instead of the main graph when ``use_when()`` is true."""
        if any(v.name == name for v in self.variants):
            raise RuntimeError(f"graph variant '{name}' registered twice on {self.graph_name}")
        self.variants.append(GraphVariant(name, gm, use_when, self._pass_index))

    def dump_text(self, name: str, text: str) -> None:
        """A file in this graph's dump folder (a plan, kernel sources); ignored without dumps."""
        self.dump_files[name] = text

    def report(self, **figures: Any) -> None:
        """Figures for this graph's report (``dsgraph.reports()``), beside the pass stats."""
        self.figures.update(figures)

    # set by the manager before each pass
    gm: torch.fx.GraphModule
