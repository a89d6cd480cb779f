"""Inductor: its compile entry points, config, partitioner base class and scheduler access.

Checked on torch 2.11 (GPU) and 2.13 (CPU) unless a docstring says otherwise.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

def compile_fx(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx as _compile_fx

    return _compile_fx(*args, **kwargs)


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    from torch._inductor.compile_fx import compile_fx_inner as _inner

    return _inner(*args, **kwargs)


def custom_partitioner_base() -> type:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


def inductor_mode_options(mode: str | None) -> dict[str, Any]:
    """Inductor config patches that ``torch.compile(mode=...)`` means for backend='inductor'."""
    if mode is None or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def arena_inductor_patches() -> dict[str, Any]:
    """Inductor config for ``arena=True``: Inductor's own memory planning (one pool of
    intermediates per graph). torch 2.13 applies it to inference graphs only: its wrapper
    codegen skips planning for training graphs (a comment there says it raises peaks)."""
    return {"memory_planning": True}


def inductor_size_hint(expr: Any, fallback: int = 8192) -> int:
    """A concrete int for an Inductor size expression (inside a graph handler).

    torch 2.13 calls it ``SizeVarAllocator.optimization_hint``; older releases ``size_hint``.
    """
    from torch._inductor.virtualized import V

    sizevars = V.graph.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return int(hint(expr, fallback=fallback))




def hash_for_files(files: tuple[str, ...]) -> str:
    """Inductor's content hash of source files (its custom-pass cache identity)."""
    from torch._inductor.custom_graph_pass import get_hash_for_files

    return get_hash_for_files(files).hex()


@contextlib.contextmanager
def post_fusion_hook(hook) -> Iterator[None]:
    """Call ``hook(graph_lowering)`` for every graph Inductor schedules inside the context
    (through ``_post_fusion_custom_pass``, which sees ``V.graph``), with Inductor's FX graph
    cache off: a cache hit would skip the scheduler."""
    import torch._inductor.config as iconfig

    previous = iconfig._post_fusion_custom_pass

    def chained(nodes):
        from torch._inductor.virtualized import V

        hook(V.graph)
        return previous(nodes) if previous is not None else nodes

    with iconfig.patch(_post_fusion_custom_pass=chained, fx_graph_cache=False):
        yield


@contextlib.contextmanager
def graph_handler(graph: Any) -> Iterator[None]:
    """Make ``graph`` (a GraphLowering) Inductor's current graph, as during its compile."""
    from torch._inductor.virtualized import V

    with V.set_graph_handler(graph):
        yield


@contextlib.contextmanager
def fallback_random(enabled: bool = True) -> Iterator[None]:
    """Inductor's random ops drawn like eager's (compared against eager in tests)."""
    import torch._inductor.config as iconfig

    with iconfig.patch(fallback_random=enabled):
        yield
