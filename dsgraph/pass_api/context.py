"""What a pass sees besides its graph: configuration, cached analyses, runtime hooks.

``CompileConfig`` is everything decided before compiling (options, pipeline, the test
failure hook). One ``PassContext`` is made per graph; passes read ``ctx.config`` and
``ctx.args`` and never the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .analysis.base import Analysis
from .options import Options
from .pipeline import Pipeline


@dataclass(frozen=True)
class CompileConfig:
    options: Options
    pipeline: Pipeline
    dump_dir: str | None = None
    debug: bool = False
    test_fail_pass: str | None = None  # DSGRAPH_TEST_FAIL_PASS: that pass raises (tests only)


@dataclass
class PassResult:
    gm: torch.fx.GraphModule
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)


# A runtime wrapper takes the compiled callable (boxed: called with one list of inputs)
# and returns the callable to use instead.
RuntimeWrapper = Callable[[Callable[[list], Any]], Callable[[list], Any]]


class PassContext:
    def __init__(
        self,
        config: CompileConfig,
        stage: str,
        graph_name: str,
        example_inputs: Sequence[Any] = (),
        shared: dict[str, Any] | None = None,
    ):
        self.config = config
        self.stage = stage
        self.graph_name = graph_name  # "c000_forward"
        self.example_inputs = list(example_inputs)
        # Facts one stage leaves for a later one of the same compile (the joint stage's
        # partition plan for the forward, the forward's outputs for the backward).
        self.shared = shared if shared is not None else {}
        self.args: dict[str, Any] = {}  # parsed pipeline arguments of the running pass
        self.runtime_wrappers: list[tuple[str, RuntimeWrapper]] = []
        self._analyses: dict[type, Analysis] = {}
        self._current_pass: str | None = None

    def analysis(self, cls: type) -> Any:
        cached = self._analyses.get(cls)
        if cached is None:
            cached = cls.compute(self.gm, self)
            self._analyses[cls] = cached
        return cached

    def invalidate(self, preserves: Sequence[str] = ()) -> None:
        self._analyses = {c: a for c, a in self._analyses.items() if c.name in preserves}

    def register_runtime_wrapper(self, wrapper: RuntimeWrapper) -> None:
        """Wrap the compiled graph at run time (a persistent pool, a variant switch)."""
        self.runtime_wrappers.append((self._current_pass or "?", wrapper))

    # set by the manager before each pass
    gm: torch.fx.GraphModule
