"""Data parallelism at run time: replicas, ``no_sync``, the agreement check, the backward wrapper.

``dsgraph.replicate(model)`` broadcasts the model's parameters and buffers from rank 0 of
the group and records which group the parameters belong to. A backward compiled with
``data_parallel`` averages the gradients in the graph itself (``dsgraph.passes.allreduce``:
bucketed ``all_reduce_`` on slices of the gradient pool, issued as the buckets fill, waited
at the end). ``DataParallelBackward`` wraps that backward and chooses per call between it
and its variant without collectives:

- inside ``dsgraph.no_sync(model)``: the variant; gradients accumulate locally in the pool
  and the next synced backward reduces the sum (as DDP's ``no_sync``);
- parameters with hooks (``register_hook``, ``register_post_accumulate_grad_hook``) or a
  ``.grad`` the user put there (not the pool's view): the variant, then the same buckets are
  reduced after the backward, with the same arithmetic. Hooks therefore see local
  gradients, as with DDP, at the price of no overlap in that step;
- otherwise the graph with collectives.

Every rank issues the same buckets in the same order whichever way it goes, so ranks that
choose differently still match collective for collective.

Safety: the plan of every compiled data-parallel graph is compared across ranks before the
graph runs (``check_same_on_all_ranks``); a difference raises ``ReplicaMismatchError``
naming it on every rank instead of hanging in mismatched collectives. Collectives use the
group's own timeout, so a rank that dies surfaces torch's error.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import compat
from ..errors import UsageError
from .pool import MANAGER, Key, Slot


class ReplicaMismatchError(UsageError):
    """Ranks of a data-parallel group disagree (model shapes, or the collectives a compiled
    graph will issue): raised on every rank before any mismatched collective runs."""


@dataclass(eq=False)
class Replica:
    group: Any  # the torch.distributed ProcessGroup
    explicit_group: bool  # replicate() was given a process group
    no_sync_depth: int = 0

    @property
    def syncing(self) -> bool:
        return self.no_sync_depth == 0


_REPLICA_OF: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> Replica


def _dist():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("dsgraph data parallelism needs torch.distributed: call "
                         "torch.distributed.init_process_group(...) first (torchrun sets the environment)")
    return dist


def _unique(tensors) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def check_same_on_all_ranks(group: Any, what: str, lines: list[str]) -> None:
    """All-gather a digest and the text of ``lines`` (rank-independent facts); raise
    ``ReplicaMismatchError`` on every rank, naming the first line where a rank differs from
    rank 0, when they are not all equal. One collective, with the group's timeout."""
    dist = _dist()
    text = "\n".join(lines)
    digest = hashlib.sha256(text.encode()).hexdigest()
    gathered: list = [None] * dist.get_world_size(group)
    with compat.real_tensors():  # called while a compile traces with fake tensors
        dist.all_gather_object(gathered, (digest, text), group=group)
    if all(d == gathered[0][0] for d, _ in gathered):
        return
    reference = gathered[0][1].split("\n")
    for rank, (d, other) in enumerate(gathered):
        if d == gathered[0][0]:
            continue
        mine = other.split("\n")
        line = next((i for i, (a, b) in enumerate(zip(reference, mine)) if a != b), min(len(reference), len(mine)))
        a = reference[line] if line < len(reference) else "(nothing)"
        b = mine[line] if line < len(mine) else "(nothing)"
        raise ReplicaMismatchError(
            f"dsgraph data parallel: the {what} differs between ranks, which would hang or corrupt "
            f"the all-reduce. First difference, line {line + 1}: rank 0 has {a!r}, rank {rank} has {b!r}. "
            "Every rank must run the same model with the same options.")


def replicate(model: torch.nn.Module, process_group: Any = None) -> torch.nn.Module:
    """Make ``model`` a data-parallel replica: its parameters and buffers are broadcast from
    rank 0 of ``process_group`` (default: the whole world), and a backward compiled with
    ``options={"data_parallel": True}`` averages its gradients over that group. Returns
    ``model`` itself. Call it on every rank, before compiling, after moving the model to
    its device."""
    dist = _dist()
    group = process_group if process_group is not None else dist.group.WORLD
    params = _unique(model.parameters())
    tensors = _unique(list(params) + list(model.buffers()))
    names = [f"{name}: {tuple(t.shape)} {t.dtype}" for name, t in
             list(model.named_parameters()) + list(model.named_buffers())]
    check_same_on_all_ranks(group, "model (parameter and buffer shapes)", names)
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        pending = []
        for t in tensors:
            target = t.detach()
            sent = target if target.is_contiguous() else target.contiguous()
            pending.append((dist.broadcast(sent, src=src, group=group, async_op=True), target, sent))
        for work, target, sent in pending:
            work.wait()
            if sent is not target:
                target.copy_(sent)
    replica = Replica(group, process_group is not None)
    for p in params:
        _REPLICA_OF[p] = replica
    return model


def replica_of(params: list[torch.Tensor]) -> Replica:
    """The one replica these parameters belong to (UsageError otherwise)."""
    found = {id(r): r for p in params if (r := _REPLICA_OF.get(p)) is not None}
    missing = [p for p in params if _REPLICA_OF.get(p) is None]
    if missing:
        raise UsageError(
            f"dsgraph data_parallel: {len(missing)} of the {len(params)} parameters this backward computes "
            "gradients for belong to no replica; call model = dsgraph.replicate(model) on every rank "
            "before compiling (it broadcasts rank 0's parameters, so every rank starts equal)")
    if len(found) != 1:
        raise UsageError("dsgraph data_parallel: one compiled graph computes gradients of parameters of "
                         f"{len(found)} different dsgraph.replicate() calls; replicate the model once")
    return next(iter(found.values()))


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Backwards run inside this context do not all-reduce: gradients accumulate locally, and
    the next backward outside it reduces the accumulated sum (DDP's ``no_sync``). The choice
    is made when the backward runs, between two graphs compiled once."""
    replicas = {id(r): r for p in model.parameters() if (r := _REPLICA_OF.get(p)) is not None}
    if not replicas:
        raise UsageError("dsgraph.no_sync(model): the model was not replicated (dsgraph.replicate(model))")
    for r in replicas.values():
        r.no_sync_depth += 1
    try:
        yield
    finally:
        for r in replicas.values():
            r.no_sync_depth -= 1


# -- the backward at run time -----------------------------------------------------------------


@dataclass(frozen=True)
class BucketSpec:
    """A bucket as the runtime needs it: a slice of the pool buffer of ``key`` and the dtype
    it travels in."""

    key: Key
    start: int
    stop: int
    wire_dtype: torch.dtype


class DataParallelBackward:
    """Runtime wrapper (outside the pool's) of a backward with in-graph all-reduces.

    Adds the bucket views of the pool (the graph's ``dsgraph_bucket_*`` inputs, which come
    before the pool's slot inputs) and decides per call whether the graph with collectives
    runs, or its variant without them (``local``, read by the variant switch inside)."""

    def __init__(self, replica: Replica, group: Any, buckets: list[BucketSpec], slots: list[Slot],
                 world_size: int, debug: bool = False, pool: Any = None):
        self.pool = pool  # the pool's wrapper of the same graph: which parameters a call brings
        self.replica = replica
        self.group = group
        self.buckets = buckets
        self.slots = slots
        self.scale = 1.0 / world_size
        self.debug = debug
        self.local = False
        self._views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (buffers, views)

    def use_local(self) -> bool:
        """The variant without collectives runs (asked by the variant switch)."""
        return self.local

    def __call__(self, compiled: Callable[[list], Any]) -> Callable[[list], Any]:
        def run(args: list) -> Any:
            if self.pool is not None and any(a is not b for a, b in zip(self.pool._slots_of(args), self.slots)):
                # the buckets are slices of the pool at the compile-time parameters' slots
                raise RuntimeError(
                    "dsgraph data_parallel: Dynamo ran this compiled backward for other parameters than it was "
                    "compiled for (it shares one graph between modules of the same structure, e.g. the blocks "
                    "after a graph break inside a loop over blocks); its all-reduce buckets are bound to the "
                    "first ones, so it cannot reduce these. Remove the graph break, or train without "
                    "data_parallel (the gradient pool alone handles this case)")
            syncing = self.replica.syncing
            after = syncing and self._needs_local_hooks()
            self.local = not syncing or after
            args.extend(self._bucket_views())
            try:
                out = compiled(args)
            finally:
                self.local = False
            if after:
                self.reduce_now()
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _bucket_views(self) -> list[torch.Tensor]:
        """Views of the pool buffers, rebuilt when a buffer grew (a later compile added slots)."""
        buffers = [MANAGER.buffer(b.key, self.debug) for b in self.buckets]
        if self._views is None or any(a is not b for a, b in zip(self._views[0], buffers)):
            self._views = (buffers, [buf[b.start:b.stop] for buf, b in zip(buffers, self.buckets)])
        return list(self._views[1])

    def _needs_local_hooks(self) -> bool:
        """Hooks must see local gradients, and a ``.grad`` that is not the pool's view must be
        reduced as a whole (DDP reduces what ``.grad`` holds)."""
        for s in self.slots:
            p = s.param()
            if p is None:
                continue
            if compat.tensor_hooks(p) or compat.post_accumulate_hooks(p):
                return True
            if p.grad is not None and not MANAGER.owns(p):
                return True
        return False

    def reduce_now(self) -> None:
        """The buckets reduced outside the graph, in plan order, with the graph's arithmetic
        (scale by 1/world size, send in the wire dtype, sum). ``.grad`` tensors that are not
        the pool's views are copied into their slots first and the result back."""
        import torch.distributed as dist

        with torch.no_grad():
            foreign = []
            for s in self.slots:
                p = s.param()
                if p is not None and p.grad is not None and not MANAGER.owns(p):
                    MANAGER.view(s).copy_(p.grad)
                    foreign.append((s, p))
            for bucket, view in zip(self.buckets, self._bucket_views()):
                if bucket.wire_dtype == view.dtype:
                    view.mul_(self.scale)
                    dist.all_reduce(view, group=self.group)
                else:
                    wire = view.mul(self.scale).to(bucket.wire_dtype)
                    dist.all_reduce(wire, group=self.group)
                    view.copy_(wire)
            for s, p in foreign:
                p.grad.copy_(MANAGER.view(s))
