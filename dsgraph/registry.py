"""Every pass name of the design, its spec, and where its code lives.

A pass file in ``passes/`` (installed as ``dsgraph.passes``) defines ``SPEC`` and
``run(gm, ctx) -> PassResult``. Names of passes that are designed but not built yet are
registered too, so naming one gives a clear "not implemented yet" instead of "unknown".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Mapping

from .errors import NotBuiltError

STAGES = ("joint", "forward", "backward", "inference")


@dataclass(frozen=True)
class PassSpec:
    name: str  # also the file name and the dump name
    stages: tuple[str, ...]  # of STAGES
    reads: tuple[str, ...] = ()  # analyses it needs, by class name
    preserves: tuple[str, ...] = ()  # analyses still valid after it changed the graph
    mutates: bool = False  # adds in-place ops / aliasing: runs after functional passes
    handles_mutation: bool = False  # may run after a pass that ``mutates``
    # Pipeline arguments it accepts: name -> parser of the raw string in "pass{key=value}".
    args: Mapping[str, Callable[[str], object]] = field(default_factory=dict)
    doc: str = ""


# name -> module path (built) or a one-line description (not built yet).
_BUILT = {
    "lifetimes": "dsgraph.passes.lifetimes",
    "reorder_for_memory": "dsgraph.passes.reorder_for_memory",
    "grad_pool": "dsgraph.passes.grad_pool",
    "checkpoint": "dsgraph.passes.checkpoint",
    "lower_triton": "dsgraph.passes.lower_triton",
}
_NOT_BUILT = {
    "allreduce": "bucketed gradient all-reduce overlapped with the backward",
}
# The order in which passes must run when a default pipeline is built from options.
CANONICAL_ORDER = ("lifetimes", "reorder_for_memory", "checkpoint", "grad_pool", "allreduce", "lower_triton")


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
        raise ValueError(f"unknown dsgraph pass '{name}'; known passes: {', '.join(known_passes())}")


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
