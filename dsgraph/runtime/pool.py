"""The gradient pool at run time: flat buffers, slots, and who owns ``.grad``.

One flat buffer per (device, dtype) holds every pooled parameter's gradient; ``param.grad``
is a view of its slot with the parameter's shape and strides. Slots are assigned when a
backward graph is compiled, in the order that backward produces them, and never move; a
later compile that brings new parameters appends slots and the buffer grows (old contents
and the ``.grad`` views are carried over).

The compiled backward returns None for pooled parameters (autograd then leaves ``.grad``
alone, FACTS.md) and accumulates each gradient into its slot, which it receives as an extra
input: ``slot += grad`` (fused into the kernel that produces the gradient), or for a plain
weight matmul ``dsgraph::mm_into_``. So nothing is ever written into a slice that ``.grad``
views and then handed to autograd to add again (the double counting FACTS.md warns about),
and no second buffer is needed. Before the graph runs, this wrapper makes every slot hold
what autograd would add to:

- ``.grad`` is the pool's view: nothing to do, the graph accumulates into it;
- ``.grad`` is None: the slot is zeroed (one kernel per contiguous run of such slots), or
  for ``mm_into_`` slots marked empty so the matmul overwrites it;
- ``.grad`` is a tensor the user put there, or the parameter has ``register_hook`` hooks:
  the slot is zeroed so the graph leaves the step's gradient alone in it; afterwards the
  hooks run on it and the result is added to ``.grad`` as autograd would.

``register_post_accumulate_grad_hook`` hooks fire after that, in slot order. Autograd still
calls a parameter's hooks for the None the backward returned; the wrapper empties the hook
dicts until the backward ends so they fire once, with the real gradient.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import compat

ALIGN = 16  # elements: slots start on 64-byte boundaries for fp32 (vector loads, cuBLAS)

Key = tuple  # (torch.device, torch.dtype)


def key_of(t: torch.Tensor) -> Key:
    return (t.device, t.dtype)


def _grad_strides(p: torch.Tensor) -> tuple[int, ...]:
    """Eager's layout rule for gradients: the parameter's strides when it is dense and
    non-overlapping, contiguous strides otherwise."""
    if p.is_contiguous() or compat.non_overlapping_and_dense(p):
        return tuple(p.stride())
    return tuple(torch.empty(p.shape, device="meta").stride())


@dataclass(eq=False)
class Slot:
    param: weakref.ref
    key: Key
    offset: int
    numel: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class _Pool:
    key: Key
    size: int = 0  # elements registered
    grads: torch.Tensor | None = None
    slots: list[Slot] = field(default_factory=list)


class PoolManager:
    """Process-wide: one pool per (device, dtype); a parameter keeps its slot for life."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pools: dict[Key, _Pool] = {}
        # keyed by tensor identity (a WeakKeyDictionary would compare tensors with ==)
        self._slot_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._views: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._empty: set[int] = set()  # data_ptrs of mm_into_ slots that start this step empty

    # -- compile time ---------------------------------------------------------------------

    def slot(self, param: torch.Tensor) -> Slot:
        with self._lock:
            existing = self._slot_of.get(param)
            if existing is not None:
                return existing
            key = key_of(param)
            pool = self.pools.get(key)
            if pool is None or all(s.param() is None for s in pool.slots):
                # nothing alive uses this pool any more (an earlier model was freed): start
                # over rather than keep its slots, so memory does not grow model after model
                pool = self.pools[key] = _Pool(key)
            offset = -(-pool.size // ALIGN) * ALIGN
            s = Slot(weakref.ref(param), key, offset, param.numel(), tuple(param.shape), _grad_strides(param))
            pool.size = offset + param.numel()
            pool.slots.append(s)
            self._slot_of[param] = s
            return s

    def slot_of(self, param: torch.Tensor) -> Slot | None:
        return self._slot_of.get(param)

    # -- run time -------------------------------------------------------------------------

    def buffer(self, key: Key, debug: bool = False) -> torch.Tensor:
        """The gradient buffer, allocated or grown to the registered size (in debug mode the
        new memory is NaN until written)."""
        pool = self.pools[key]
        current = pool.grads
        if current is not None and current.numel() >= pool.size:
            return current
        device, dtype = key
        fresh = torch.empty(pool.size, device=device, dtype=dtype)
        if debug:
            fresh.fill_(float("nan"))  # slots nobody wrote read as NaN, not as stale numbers
        if current is not None:
            fresh[: current.numel()].copy_(current)
        pool.grads = fresh
        if current is not None:
            for s in pool.slots:
                param = s.param()
                if param is not None and param in self._views:
                    was_ours = self.owns(param)
                    self._views[param] = self._as_view(fresh, s)
                    if was_ours:
                        param.grad = self._views[param]
        return fresh

    @staticmethod
    def _as_view(buf: torch.Tensor, s: Slot) -> torch.Tensor:
        return buf.as_strided(s.shape, s.stride, s.offset)

    def view(self, s: Slot, debug: bool = False) -> torch.Tensor:
        """``.grad`` for a slot: a view of the gradient buffer, the same object every step."""
        param = s.param()
        buf = self.buffer(s.key, debug)
        view = self._views.get(param)
        if view is None or compat.storage_ref(view) != compat.storage_ref(buf):
            view = self._views[param] = self._as_view(buf, s)
        return view

    def handed_out(self, param: torch.Tensor) -> bool:
        """Has a backward given this parameter its pool view yet?"""
        return self._views.get(param) is not None

    def owns(self, param: torch.Tensor) -> bool:
        """Is ``param.grad`` the pool's own view?"""
        view = self._views.get(param)
        return view is not None and param.grad is view

    def starts_empty(self, out: torch.Tensor) -> bool:
        return out.data_ptr() in self._empty


MANAGER = PoolManager()


def _runs(slots: list[Slot]) -> list[tuple[Key, int, int]]:
    """Slots as (key, start, stop) runs of adjacent slots (alignment padding included)."""
    runs: list[list] = []
    for s in sorted(slots, key=lambda s: (str(s.key), s.offset)):
        last = runs[-1] if runs else None
        if last and last[0] == s.key and s.offset - last[2] < ALIGN:
            last[2] = s.offset + s.numel
        else:
            runs.append([s.key, s.offset, s.offset + s.numel])
    return [tuple(r) for r in runs]


class PooledBackward:
    """Runtime wrapper of one compiled backward that accumulates into the pool.

    ``slots``: the slots the graph writes, in the order of its extra inputs (one per slot);
    ``matmul``: for each, whether the graph writes it with ``mm_into_``.
    """

    def __init__(self, manager: PoolManager, slots: list[Slot], matmul: list[bool], debug: bool = False):
        self.manager = manager
        self.slots = slots
        self.matmul = matmul
        self.debug = debug

    def __call__(self, compiled: Callable[[list], Any]) -> Callable[[list], Any]:
        def run(args: list) -> Any:
            views, pending = self._prepare()
            args.extend(views)
            try:
                out = compiled(args)
            finally:
                self.manager._empty.clear()
            self._finish(pending)
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _prepare(self) -> tuple[list[torch.Tensor], list[tuple[Slot, torch.Tensor, torch.Tensor | None, bool]]]:
        """Make each slot hold what the graph should add to; returns the slot views (the
        graph's extra inputs) and the slots whose gradient must be handed over after the
        graph: (slot, param, what .grad held before (a copy when it is the pool's view),
        is .grad the pool's view)."""
        manager = self.manager
        params = [s.param() for s in self.slots]
        if any(p is None for p in params):
            raise RuntimeError("a parameter this compiled backward writes into the gradient pool was deleted")
        views = [manager.view(s, self.debug) for s in self.slots]  # allocates the pool on the first run
        to_zero, pending = [], []
        with torch.no_grad():
            for s, p, matmul, view in zip(self.slots, params, self.matmul, views):
                if manager.owns(p) and not compat.tensor_hooks(p):
                    continue  # the graph accumulates straight into .grad
                ours = manager.owns(p)
                earlier = None if p.grad is None else (p.grad.clone() if ours else p.grad)
                if matmul and earlier is None and not compat.tensor_hooks(p):
                    manager._empty.add(view.data_ptr())  # the matmul overwrites it
                    if self.debug:
                        view.fill_(float("nan"))  # were it read before written, NaN shows it
                else:
                    to_zero.append(s)
                pending.append((s, p, earlier, ours))
            for key, start, stop in _runs(to_zero):
                manager.buffer(key)[start:stop].zero_()
        return views, pending

    def _finish(self, pending: list[tuple[Slot, torch.Tensor, torch.Tensor | None, bool]]) -> None:
        """Hand each step gradient to ``.grad`` as autograd would, in backward production
        order: its hooks, the accumulation, its post-accumulate hooks."""
        manager = self.manager
        waiting = {id(s): (p, earlier, ours) for s, p, earlier, ours in pending}
        with torch.no_grad():
            for s in self.slots:
                p = s.param()
                if id(s) in waiting:
                    p, earlier, ours = waiting[id(s)]
                    view = manager.view(s)
                    step = view
                    hooks = compat.tensor_hooks(p)
                    if hooks:
                        step = view.clone()  # a hook may keep it
                        for hook in hooks:
                            result = hook(step)
                            if result is not None:
                                step = result
                    if earlier is None:
                        if step is not view:
                            view.copy_(step)
                        p.grad = view
                    elif ours:
                        view.copy_(earlier.add_(step))  # the pool's gradients, hooks applied
                    else:
                        earlier.add_(step)  # a tensor the user put in .grad: it stays there
                for hook in compat.post_accumulate_hooks(p):
                    hook(p)
        self._silence_autograd_hooks()

    def _silence_autograd_hooks(self) -> None:
        """The backward returned None for pooled parameters, and autograd still calls their
        hooks, with None (seen on torch 2.13): the hooks ran above with the real gradient,
        so empty their dicts (which autograd reads when it calls them) until this backward
        ends, then put them back."""
        silenced = []
        for s in self.slots:
            for hooks in compat.hook_dicts(s.param()):
                silenced.append((hooks, dict(hooks)))
                hooks.clear()
        if not silenced:
            return

        def restore() -> None:
            for hooks, items in silenced:
                hooks.update(items)

        compat.at_backward_end(restore)


class SameParameters:
    """Runtime wrapper of the forward whose backward writes into the pool: the call must pass
    the parameters the graphs were compiled for.

    Dynamo lifts parameters to graph inputs and does not guard on their identity, so it
    reuses a model's compiled code for another instance of the same module class. The
    pooled backward would then write that model's gradients into the first model's slots and
    leave its ``.grad`` alone: refused here instead (seen on torch 2.13)."""

    def __init__(self, params: list):
        self.expected = [(i, weakref.ref(p)) for i, p in enumerate(params) if p is not None]

    def __call__(self, compiled: Callable[[list], Any]) -> Callable[[list], Any]:
        def run(args: list) -> Any:
            for i, ref in self.expected:
                if args[i] is not ref():
                    raise RuntimeError(
                        "dsgraph gradient pool: this compiled graph was made for another model's parameters "
                        "(torch.compile reuses compiled code across instances of one module class) and would "
                        "write this model's gradients into that model's pool; call torch._dynamo.reset() "
                        "before compiling this model")
            return compiled(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


@dataclass
class GradPool:
    """``dsgraph.grad_pool(model)``: the model's pooled gradients.

    ``buffers``: {(device, dtype): flat gradient buffer}; ``slots``: {parameter name as
    ``named_parameters()`` gives it (tied parameters once): ((device, dtype), offset, numel)}
    in backward production order.
    """

    buffers: dict[Key, torch.Tensor]
    slots: dict[str, tuple[Key, int, int]]


def grad_pool(model: torch.nn.Module) -> GradPool | None:
    """The pool holding ``model``'s gradients; None before its first pooled backward.

    There is one pool per (device, dtype) in a process, shared by every compiled graph (of
    this model or others alive at the same time); ``slots`` lists this model's parameters.
    """
    named = [(name, MANAGER.slot_of(p)) for name, p in model.named_parameters() if MANAGER.handed_out(p)]
    if not named:
        return None
    named.sort(key=lambda item: (str(item[1].key), item[1].offset))  # backward production order
    return GradPool(
        buffers={s.key: MANAGER.pools[s.key].grads for _, s in named},
        slots={name: (s.key, s.offset, s.numel) for name, s in named},
    )


def pool_tensors(params) -> list[tuple[str, torch.Tensor]]:
    """The gradient buffers that hold any of these parameters' gradients (for predictions)."""
    keys = {s.key for p in params if (s := MANAGER.slot_of(p)) is not None}
    return [(f"grad pool {k[0]} {k[1]}", MANAGER.pools[k].grads) for k in keys if MANAGER.pools[k].grads is not None]
