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
calls a parameter's hooks for the None the backward returned; the wrapper mutes them for
that backward so they fire once, with the real gradient. An exception (in a hook, in the
graph) leaves ``.grad`` as eager's engine would: gradients handed over stay, the others
keep what they held before the step, and no hook stays muted.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import compat
from . import handles

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
    moved: bool = False  # the parameter changed device, dtype or layout since: a new slot holds it

    def live(self) -> bool:
        return not self.moved and self.param() is not None

    def fits(self, param: torch.Tensor) -> bool:
        """Is this still the layout of ``param``'s gradient?"""
        return (self.key, self.shape, self.stride) == (key_of(param), tuple(param.shape), _grad_strides(param))


@dataclass
class _Pool:
    key: Key
    size: int = 0  # elements registered
    grads: torch.Tensor | None = None
    slots: list[Slot] = field(default_factory=list)


class PoolManager:
    """Process-wide: one pool per (device, dtype); a parameter keeps its slot for life, or
    until it moves to another device or dtype (``module.to(...)``), when it gets a new one."""

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
                if existing.fits(param):
                    return existing
                existing.moved = True  # module.to(dtype/device) changed the parameter in place
                self._views.pop(param, None)
            key = key_of(param)
            pool = self.pools.get(key)
            if pool is None or not any(s.live() for s in pool.slots):
                # nothing alive uses this pool any more (an earlier model was freed): start
                # over rather than keep its slots, so memory does not grow model after model
                pool = self.pools[key] = _Pool(key)
            offset = -(-pool.size // ALIGN) * ALIGN
            s = Slot(weakref.ref(param, _release_when_unused(pool)), key, offset, param.numel(),
                     tuple(param.shape), _grad_strides(param))
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
                if s.live() and param in self._views:
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


def _release_when_unused(pool: _Pool) -> Callable[[weakref.ref], None]:
    """The callback of a slot's weak reference to its parameter: when the last parameter
    with a live slot in ``pool`` is freed, the gradient buffer goes too. Without it the
    buffer (every pooled gradient's bytes) stayed allocated after the model was deleted,
    until some later compile registered a slot. It holds the pool weakly (the pool holds
    the slots that hold this callback) and takes no lock: it can run inside ``slot``, whose
    allocations may start the cycle collector."""
    pool_ref = weakref.ref(pool)

    def released(_: weakref.ref) -> None:
        pool = pool_ref()
        if pool is not None and pool.grads is not None and not any(s.live() for s in pool.slots):
            pool.grads = None

    return released


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

    ``slots``: the slots the graph writes, in the order of its extra inputs (one per slot),
    as assigned to the parameters the graph was compiled for; ``matmul``: for each, whether
    the graph writes it with ``mm_into_``; ``positions``: for each, where the backward's
    inputs carry the parameter itself. Dynamo can run one compiled graph for other
    parameters of the same layout (modules of the same structure after a graph break), so
    each call writes the slots of the parameters it was given (registered on first sight).
    """

    def __init__(self, manager: PoolManager, slots: list[Slot], matmul: list[bool], debug: bool = False,
                 positions: list[int] | None = None):
        self.manager = manager
        self.slots = slots
        self.matmul = matmul
        self.debug = debug
        self.positions = positions

    def __call__(self, compiled: Callable[[list], Any]) -> Callable[[list], Any]:
        def run(args: list) -> Any:
            slots = self._slots_of(args)
            views, pending = self._prepare(slots)
            args.extend(views)
            try:
                out = compiled(args)
            except BaseException:
                self._undo(pending, handed=set())
                raise
            finally:
                self.manager._empty.clear()
            self._finish(slots, pending)
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _slots_of(self, args: list) -> list[Slot]:
        """The slots of the parameters this call's backward received (the compile-time
        slots when they are the same parameters, the common case). The backward receives
        a view of each parameter (``runtime.handles``)."""
        if self.positions is None:
            return self.slots
        out = []
        for compiled_for, position in zip(self.slots, self.positions):
            handle = args[position]
            param = compiled_for.param()
            if param is None or not handles.views(handle, param):
                param = handles.resolve(handle)
                if param is None:
                    raise RuntimeError(
                        "dsgraph gradient pool: a compiled backward ran for a parameter its forward did not see "
                        f"(shape {tuple(handle.shape)[1:]}, {handle.dtype}, {handle.device})")
            if param is compiled_for.param() and not compiled_for.moved:
                out.append(compiled_for)
                continue
            slot = self.manager.slot(param)
            if (slot.key, slot.shape, slot.stride) != (compiled_for.key, compiled_for.shape, compiled_for.stride):
                raise RuntimeError(
                    f"dsgraph gradient pool: a compiled backward ran for a parameter of layout {slot.shape} "
                    f"{slot.stride} {slot.key} where it was compiled for {compiled_for.shape} "
                    f"{compiled_for.stride} {compiled_for.key}")
            out.append(slot)
        return out

    def _prepare(self, slots: list[Slot]) -> tuple[list[torch.Tensor], list[tuple[Slot, torch.Tensor, torch.Tensor | None, bool]]]:
        """Make each slot hold what the graph should add to; returns the slot views (the
        graph's extra inputs) and the slots whose gradient must be handed over after the
        graph: (slot, param, what .grad held before (a copy when it is the pool's view),
        is .grad the pool's view)."""
        manager = self.manager
        params = [s.param() for s in slots]
        if any(p is None for p in params):
            raise RuntimeError("a parameter this compiled backward writes into the gradient pool was deleted")
        views = [manager.view(s, self.debug) for s in slots]  # allocates (or grows) the pool
        to_zero, pending = [], []
        with torch.no_grad():
            for s, p, matmul, view in zip(slots, params, self.matmul, views):
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

    def _finish(self, slots: list[Slot], pending: list[tuple[Slot, torch.Tensor, torch.Tensor | None, bool]]) -> None:
        """Hand each step gradient to ``.grad`` as autograd would, in backward production
        order: its hooks, the accumulation, its post-accumulate hooks. A hook that raises
        stops the hand-over as it stops eager's backward: the gradients handed over stay,
        the others keep what ``.grad`` held before the step (``_undo``), and the exception
        goes to the user."""
        manager = self.manager
        waiting = {id(s): (p, earlier, ours) for s, p, earlier, ours in pending}
        handed: set[int] = set()
        try:
            with torch.no_grad():
                for s in slots:
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
                            view.copy_(earlier + step)  # the pool's gradients, hooks applied
                        else:
                            earlier.add_(step)  # a tensor the user put in .grad: it stays there
                        handed.add(id(s))
                    for hook in compat.post_accumulate_hooks(p):
                        hook(p)
        except BaseException:
            self._undo(pending, handed)
            raise
        self._silence_autograd_hooks(slots)

    def _undo(self, pending: list[tuple[Slot, torch.Tensor, torch.Tensor | None, bool]], handed: set[int]) -> None:
        """After an exception in the graph or in a hook: each gradient not handed over gets
        back what ``.grad`` held before the step. ``_prepare`` zeroed the slots of parameters
        with hooks or a gradient of their own so the graph would leave the step's gradient
        alone in them; for the pool's own ``.grad`` (which views that slot) this puts back
        the gradients accumulated so far. A ``.grad`` that is None or the user's own tensor
        was not touched: the slot's contents are scratch, zeroed again by the next step."""
        with torch.no_grad():
            for s, p, earlier, ours in pending:
                if id(s) not in handed and ours and earlier is not None:
                    self.manager.view(s).copy_(earlier)
    def _silence_autograd_hooks(self, slots: list[Slot]) -> None:
        """The backward returned None for pooled parameters, and autograd still calls their
        hooks, with None (seen on torch 2.13): the hooks ran above with the real gradient,
        so each becomes a ``_Muted`` stand-in that does nothing in this backward. They are
        put back when it ends, or, when it ends with an exception (the engine then runs no
        end-of-backward callback), by the stand-in itself the next time any backward calls
        it: a hook is never lost."""
        task = compat.graph_task_id()
        muted = []
        for s in slots:
            for hooks in compat.hook_dicts(s.param()):
                for key, fn in list(hooks.items()):
                    if isinstance(fn, _Muted):
                        fn = fn.fn
                    hooks[key] = stand_in = _Muted(fn, hooks, key, task)
                    muted.append(stand_in)
        if not muted:
            return

        def restore() -> None:
            for stand_in in muted:
                stand_in.restore()

        compat.at_backward_end(restore)


class _Muted:
    """A user's hook standing muted in a parameter's hook dict during the backward (autograd
    graph task) that already ran it with the real gradient. ``restore`` puts the hook back
    unless the user removed it meanwhile (its handle deletes the key)."""

    __slots__ = ("fn", "hooks", "key", "task")

    def __init__(self, fn: Callable, hooks: dict, key: Any, task: int | None):
        self.fn, self.hooks, self.key, self.task = fn, hooks, key, task

    def restore(self) -> None:
        if self.hooks.get(self.key) is self:
            self.hooks[self.key] = self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if compat.graph_task_id() == self.task:
            return None  # the call for the None this backward returned
        self.restore()  # a later backward: the one that muted it ended early
        return self.fn(*args, **kwargs)


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
