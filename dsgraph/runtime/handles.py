"""Which forward input a backward's handle stands for (``compile.partition_edit``).

The backward of a graph that received forward inputs (``PassContext.pass_to_backward``)
gets a view of each (a handle), not the tensor: Inductor may hand a saved input back as a
copy in another layout. A handle shares the input's storage. When the forward ran with the
tensors it was compiled for (the common case) the backward checks its handles against
those; when Dynamo runs the graph for other tensors (a graph reused by blocks of the same
structure after a graph break), the forward remembers them here, by address, so the
backward can find which tensor each handle views."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Sequence

import torch

_lock = threading.Lock()
# (device, data_ptr) -> weak reference to the forward input with that address
_seen: dict[tuple[torch.device, int], weakref.ref] = {}


def views(handle: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``handle`` is the partition's handle of ``t``: its address, one leading
    dimension of 1, then ``t``'s sizes and strides (a view of the whole of ``t``)."""
    return (handle.data_ptr() == t.data_ptr() and handle.dtype == t.dtype and handle.device == t.device
            and handle.shape[1:] == t.shape and handle.stride()[1:] == t.stride())


def remember_inputs(compiled: Callable[[list], Any], positions: Sequence[int],
                    compiled_for: Sequence[torch.Tensor | None]) -> Callable[[list], Any]:
    """Wrap a compiled forward: before each call, remember its inputs at ``positions``
    that are not the ones it was compiled for (an identity test per input otherwise)."""
    expected = [None if t is None else weakref.ref(t) for t in compiled_for]

    def run(args: list) -> Any:
        for position, ref in zip(positions, expected):
            t = args[position]
            if ref is None or ref() is not t:
                with _lock:
                    _seen[(t.device, t.data_ptr())] = weakref.ref(t)
        return compiled(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def resolve(handle: torch.Tensor) -> torch.Tensor | None:
    """The tensor a forward remembered that ``handle`` views, or None."""
    with _lock:
        ref = _seen.get((handle.device, handle.data_ptr()))
    t = ref() if ref is not None else None
    return t if t is not None and views(handle, t) else None
