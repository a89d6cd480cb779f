"""Every pass name of the design, where its code lives, and a pipeline's passes per stage.

A pass module in ``dsgraph/passes/`` defines ``SPEC`` (a ``PassSpec``) and
``run(gm, ctx) -> PassResult``. Names of passes that are designed but not built yet are
registered too, so naming one gives a clear "not implemented yet" instead of "unknown".
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import NotBuiltError, did_you_mean
from ..pass_api import STAGES, PassInvocation, PassSpec, Pipeline

# name -> module path (built) or a one-line description (not built yet).
_BUILT = {
    "lifetimes": "dsgraph.passes.lifetimes",
    "reorder_for_memory": "dsgraph.passes.reorder_for_memory",
    "grad_pool": "dsgraph.passes.grad_pool",
    "checkpoint": "dsgraph.passes.checkpoint",
    "lower_triton": "dsgraph.passes.lower_triton",
    "arena": "dsgraph.passes.arena",
    "chunk_loss": "dsgraph.passes.chunk_loss",
    "allreduce": "dsgraph.passes.allreduce",
}
_NOT_BUILT: dict[str, str] = {}  # every pass of the design is built today
# The order in which passes must run when a default pipeline is built from options.
# chunk_loss (stage pre_grad) comes first: it runs before AOTAutograd, so before checkpoint.
CANONICAL_ORDER = ("chunk_loss", "lifetimes", "reorder_for_memory", "checkpoint", "grad_pool", "allreduce", "lower_triton", "arena")


_EXTRA: dict[str, ModuleType] = {}  # passes registered at run time (plugins, tests)


def register_pass(module: ModuleType) -> None:
    """Make a pass module (with ``SPEC`` and ``run``) usable by name in pipelines."""
    name = module.SPEC.name
    if name in _BUILT or name in _NOT_BUILT:
        raise ValueError(f"dsgraph pass name '{name}' is taken by a built-in pass")
    _EXTRA[name] = module


def unregister_pass(name: str) -> None:
    _EXTRA.pop(name, None)


def known_passes() -> tuple[str, ...]:
    return CANONICAL_ORDER + tuple(_EXTRA)


def _check_known(name: str) -> None:
    if name not in _BUILT and name not in _NOT_BUILT and name not in _EXTRA:
        hint = did_you_mean(name, known_passes())
        raise ValueError(f"unknown dsgraph pass '{name}'{hint}; known passes: {', '.join(known_passes())}")


def load(name: str) -> ModuleType:
    """The module of a built pass; ValueError for unknown names, NotBuiltError for planned ones."""
    _check_known(name)
    if name in _NOT_BUILT:
        raise NotBuiltError(f"dsgraph pass '{name}' is not implemented yet ({_NOT_BUILT[name]})")
    module = _EXTRA[name] if name in _EXTRA else importlib.import_module(_BUILT[name])
    spec = module.SPEC
    assert spec.name == name and all(s in STAGES for s in spec.stages), spec
    return module


def spec(name: str) -> PassSpec:
    return load(name).SPEC


def stage_passes(pipeline: Pipeline, stage: str) -> list[PassInvocation]:
    """The passes of ``pipeline`` that run on graphs of ``stage``, in order."""
    return [p for p in pipeline if stage in spec(p.name).stages]


def parsed_args(inv: PassInvocation) -> dict[str, object]:
    """The pass's arguments, each read by the parser its spec declares."""
    parsers = spec(inv.name).args
    return {k: parsers[k](v) for k, v in inv.args}
