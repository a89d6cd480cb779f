"""allreduce: average the gradients over the data-parallel group inside the backward graph.

Runs on the backward after ``grad_pool``, whose slots hold the gradients in one flat buffer
per (device, dtype), in the order this backward produces them. A bucket is a contiguous run
of slots: one view of the buffer, a new graph input ``dsgraph_bucket_k`` (no concatenation,
no split copies). It is issued right after the node that writes its last slot and waited
at the end of the backward, so the all-reduce of early gradients overlaps the computation
of later ones. Before/after (two buckets; ``control_deps`` is Inductor's ordering op)::

    mm_into_(dsgraph_grad_0, t_3, x)         mm_into_(dsgraph_grad_0, t_3, x)
                                             mul_(dsgraph_grad_0, 0.5)                 # 1/world size
    copy_(dsgraph_grad_1, add_1)       ->    copy_(dsgraph_grad_1, add_1)
                                             mul_(dsgraph_grad_1, 0.5)
                                             issued_0 = control_deps((dsgraph_grad_0, dsgraph_grad_1),
                                                                     issue_0, dsgraph_bucket_0)  # all_reduce_
    mm_into_(dsgraph_grad_2, t_1, h)         mm_into_(dsgraph_grad_2, t_1, h)
                                             mul_(dsgraph_grad_2, 0.5)
                                             issued_1 = control_deps((dsgraph_grad_2,), issue_1, dsgraph_bucket_1)
                                             wait_tensor(issued_0); wait_tensor(issued_1)
    return (None, None, None)                return (None, None, None)

Why this is exact although the slots and the bucket are separate graph inputs (one input
per slot is on purpose, see grad_pool) that Inductor treats as distinct buffers:

- all writes of a bucket's slots, then its collective: the ``all_reduce_`` sits in a
  ``control_deps`` whose dependencies are the bucket's slot inputs. Inductor gives the
  kernels lowered from its subgraph a weak dependency on the latest writer of each slot
  (dependencies on an input are renamed through its in-place writes: here the scales, the
  last writes). The subgraph holds only the collective, an extern kernel Inductor never
  fuses, so nothing can run it early. (A pointwise kernel in the subgraph would not be
  safe: Inductor 2.13 fuses it with a slot's writer, reading the weak dependency as a
  read-then-mutate of one buffer.) FX execution runs nodes in graph order, the same order;
- the collective, then the wait, then readers: Inductor models ``all_reduce_`` and
  ``wait_tensor`` as two mutations of the bucket. Nothing in the graph touches a slot after
  its bucket is issued: each slot is written once per backward and read by nothing else
  (the plan puts the wait before any later node that uses a slot of the bucket; in
  gradient graphs there is none, so it goes before the output). The runtime reads ``.grad``
  after the graph returns;
- Inductor's own reordering: its communication passes are off for data-parallel compiles
  and ``compat.pin_collectives`` runs last in its scheduler, placing each collective (with
  the kernels that produce what it sends) right after its last dependency and every wait
  at the end. ``tests/dist`` checks the generated code's order with FileCheck.

Averaging follows DDP's arithmetic: each rank multiplies its (accumulated) gradient by
``1/world_size`` in the gradient's dtype, then the ranks sum. For two ranks the sum of two
numbers does not depend on the order, so the result is bitwise DDP's; with more ranks the
summation order is the collective library's, which depends on where an element sits in the
buffer (ring chunks), and DDP's buckets differ from these: equal up to float reassociation
(one rounding per rank added, as in any reordering of the sum). The scale is one kernel pass
over the gradients that Inductor fuses into the kernel writing a slot, except for matmul
slots (``mm_into_``), which get a pointwise kernel each.

``compress="bf16"``: the wire buffer of a bucket is built from its slots,
``cat(bf16(slot * 1/world) in memory order, zeros for alignment padding)``, which Inductor
computes straight into one buffer (no copy beyond the cast); it is all-reduced (a sum in
bf16) and, after the wait, copied into the bucket (back to fp32). The wire buffers are in
flight from their issue to the end of the backward: ``BucketPlan.inflight_bytes``, which
the checkpoint planner counts (``inflight_bytes``, an upper bound made before the backward
exists). Uncompressed buckets are reduced in place and add no bytes.

**Per-bucket epilogue** (when ``lower_triton`` follows in the pipeline and will take tagged
regions, ``lowers_pool_epilogues``): the scale and the cast are one pass over the bucket
view instead of one per slot, and their nodes carry ``node.meta["dsgraph_pool_epilogue"]``,
so ``lower_triton{select=tagged}`` makes each bucket's epilogue one generated kernel::

    bucket_ready_(dsgraph_bucket_0, [dsgraph_grad_0, dsgraph_grad_1])   # ordering only
    mul = mul(dsgraph_bucket_0, 0.5)                                    # tagged
    copy_(dsgraph_bucket_0, mul)                                        # tagged (uncompressed)
    issued_0 = control_deps((dsgraph_grad_0, dsgraph_grad_1, dsgraph_bucket_0), issue_0, dsgraph_bucket_0)
  or, compressed:
    wire = convert_element_type(mul, bfloat16)                          # tagged
    issued_0 = all_reduce_(wire, "sum", group)

The region is {mul, copy_} (in place, 8 bytes per fp32 element) or {mul, convert} (4 read,
2 written): the collective is outside it (lowering never spans a side effect), so the
write back after a compressed bucket's wait (``bucket.copy_(wait)``, a cast-copy Inductor
makes one kernel) stays apart. ``bucket_ready_`` (``dsgraph.runtime.ops``) reads the slots
and declares a write of the bucket, because the bucket and the slots are inputs that
Inductor does not know to alias: without it nothing would order the epilogue after the
slots' writers (``compat.pin_collectives`` would even hoist it, with the collective it
feeds, to the start). The accumulation ``slot += g`` stays with the kernel producing ``g``:
a bucket's gradients come from different kernels at different times, and one kernel for
all of them would keep them alive until the last one. The arithmetic is the per-slot form's
(``x * (1/world)`` in the gradient's dtype, then the cast), element for element, so the
gradients are bitwise the same; alignment padding inside the bucket is scaled and sent too
(uninitialised memory that nothing reads, as in ``DataParallelBackward.reduce_now``) where
the per-slot form sends zeros. Without lowering the per-slot form stays: there Inductor
fuses each slot's scale into its writer, where a bucket-wide pass would read and write the
non-matmul slots once more.

The variant without collectives (``no_sync``, and steps where hooks must see local
gradients) is the graph before the scales and collectives were added;
``DataParallelBackward`` (``dsgraph.runtime.replicate``) picks one per call. Every rank
builds the plan from its graph and the options only (never timings or memory readings),
and the plan is compared across ranks when the graph is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.analysis.ops import written_args
from dsgraph.errors import UsageError
from dsgraph.pass_api import PassContext, PassResult, PassSpec
from dsgraph.passes.allreduce_graph import add_bucket_inputs, apply_buckets
from dsgraph.runtime.pool import ALIGN, PooledBackward, Slot
from dsgraph.runtime.replicate import BucketSpec, DataParallelBackward, check_same_on_all_ranks, replica_of
from dsgraph.units import format_bytes

DEFAULT_BUCKET_MB = 25.0  # as DDP's bucket_cap_mb; MB here are MiB, as in DDP
FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket: small, so communication starts early
COMPRESS = ("none", "bf16")
EPILOGUES = ("slots", "bucket")  # the scale (and cast) fused into each slot's writer, or one pass per bucket


def _bucket_mb(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(f"bucket_mb must be > 0, got {raw}")
    return value


def _compress(raw: str) -> str:
    if raw not in COMPRESS:
        raise ValueError(f"compress must be one of {list(COMPRESS)}, got {raw!r}")
    return raw


SPEC = PassSpec(
    name="allreduce",
    stages=("backward",),
    mutates=True,
    handles_mutation=True,
    required=True,
    after=("grad_pool",),
    args={"bucket_mb": _bucket_mb, "compress": _compress},
    doc="data-parallel gradient all-reduce, bucketed on the gradient pool and overlapped with the backward",
)


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    index: int
    key: tuple  # (device, dtype) of the pool buffer it is a slice of
    start: int  # elements of that buffer; alignment padding between slots included
    stop: int
    slots: tuple[str, ...]  # the slot inputs it covers, in production order
    offsets: tuple[int, ...]  # where each slot starts in the buffer
    shapes: tuple[tuple[int, ...], ...]
    written_by: tuple[str, ...]  # the node that writes each slot last
    wire_dtype: torch.dtype  # what the all-reduce sends
    issue_after: str  # the node that writes its last slot
    wait_before: str  # the first node after the issue that touches its slots, or "output"

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.numel * self.key[1].itemsize

    @property
    def wire_bytes(self) -> int:
        return self.numel * self.wire_dtype.itemsize

    @property
    def compressed(self) -> bool:
        return self.wire_dtype != self.key[1]

    def line(self) -> str:
        """Rank-independent description (device type only: ranks use different devices)."""
        shapes = " ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        return (f"bucket {self.index}: {self.key[0].type} {self.key[1]} elements [{self.start}, {self.stop}) "
                f"{len(self.slots)} slots ({shapes}) sent as {self.wire_dtype}, "
                f"issued after {self.issue_after}, waited before {self.wait_before}")


@dataclass
class BucketPlan:
    buckets: list[Bucket] = field(default_factory=list)
    bucket_bytes: int = 0
    first_bucket_bytes: int = 0
    compress: str = "none"
    world_size: int = 1
    epilogue: str = "slots"  # EPILOGUES

    @property
    def inflight_bytes(self) -> int:
        """Bytes the collectives allocate beyond the pool (the compressed copies, all alive
        at the end of the backward, where the buckets are waited)."""
        return sum(b.wire_bytes for b in self.buckets if b.compressed)

    @property
    def sent_bytes(self) -> int:
        return sum(b.wire_bytes for b in self.buckets)

    def lines(self) -> list[str]:
        head = (f"BucketPlan: {len(self.buckets)} buckets, world size {self.world_size}, average = scale by "
                f"1/{self.world_size} then sum, compress {self.compress}, bucket cap {self.bucket_bytes} B, "
                f"first bucket cap {self.first_bucket_bytes} B, epilogue per {'bucket' if self.epilogue == 'bucket' else 'slot'}")
        return [head] + [b.line() for b in self.buckets]

    def __str__(self) -> str:
        rows = [f"  {b.index}: {format_bytes(b.nbytes)} ({b.wire_dtype} on the wire: {format_bytes(b.wire_bytes)}), "
                f"{len(b.slots)} slots {b.slots[0]}..{b.slots[-1]}, issued after {b.issue_after}, "
                f"waited before {b.wait_before}" for b in self.buckets]
        return "\n".join([self.lines()[0], *rows, f"in flight beyond the pool: {format_bytes(self.inflight_bytes)}"])


def inflight_bytes(gradients: Sequence[Node], compress: str) -> int:
    """An upper bound, before the backward exists, of ``BucketPlan.inflight_bytes`` for these
    gradient nodes (each slot may bring its alignment padding into a bucket)."""
    if compress != "bf16":
        return 0
    total = 0
    for node in gradients:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype.is_floating_point and val.dtype.itemsize > 2:
            total += (compat.size_hint(val.numel()) + ALIGN) * torch.bfloat16.itemsize
    return int(total)


def _writers(gm: GraphModule, names: set[str]) -> dict[str, list[int]]:
    """For each slot input in ``names``, the positions of the nodes that write it."""
    out: dict[str, list[int]] = {n: [] for n in names}
    for i, node in enumerate(gm.graph.nodes):
        for arg in written_args(node):
            if arg.name in out:
                out[arg.name].append(i)
    return out


def plan_buckets(gm: GraphModule, slots: Sequence[tuple[str, Slot]], bucket_bytes: int,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES, compress: str = "none",
                 world_size: int = 1, epilogue: str = "slots") -> BucketPlan:
    """Buckets for the slot inputs ``slots`` ((placeholder name, pool slot) pairs) of ``gm``.

    Slots are taken in the order the graph writes them (the position of each slot's last
    write); a bucket grows by the next slot while that slot lies right after it in the same
    buffer (up to the alignment padding) and the bucket holds less than its cap
    (``first_bucket_bytes`` for the first bucket, ``bucket_bytes`` after), so a bucket can
    pass its cap by one slot, as DDP's do. Only the graph and these arguments decide.
    ``epilogue``: "slots" (each slot scaled after its write) or "bucket" (one pass over each
    bucket, tagged for lower_triton)."""
    if compress not in COMPRESS:
        raise ValueError(f"compress must be one of {list(COMPRESS)}, got {compress!r}")
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {list(EPILOGUES)}, got {epilogue!r}")
    first_bucket_bytes = min(first_bucket_bytes, bucket_bytes)
    nodes = list(gm.graph.nodes)
    writers = _writers(gm, {name for name, _ in slots})
    for name, positions in writers.items():
        if not positions:
            raise ValueError(f"slot input {name} is never written by the graph")
    ordered = sorted(slots, key=lambda item: (max(writers[item[0]]), item[1].offset))
    groups: list[list[tuple[str, Slot]]] = []
    for name, slot in ordered:
        current = groups[-1] if groups else None
        if current is not None:
            last = current[-1][1]
            cap = first_bucket_bytes if len(groups) == 1 else bucket_bytes
            size = (last.offset + last.numel - current[0][1].offset) * slot.key[1].itemsize
            adjacent = slot.key == last.key and 0 <= slot.offset - (last.offset + last.numel) < ALIGN
            if adjacent and size < cap:
                current.append((name, slot))
                continue
        groups.append([(name, slot)])
    plan = BucketPlan(bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                      compress=compress, world_size=world_size, epilogue=epilogue)
    for index, group in enumerate(groups):
        names = [name for name, _ in group]
        issue = max(max(writers[n]) for n in names)
        touched = set(names)
        # a slot is scaled right after its last write (so Inductor fuses the scale into the
        # writer): a node reading it between that write and the issue would see it scaled
        for name in names:
            last = max(writers[name])
            early = [n.name for n in nodes[last + 1:issue + 1] if any(a.name == name for a in n.all_input_nodes)]
            if early:
                raise ValueError(f"slot input {name} is read by {early[0]} after its last write and before its "
                                 "bucket is issued; a pooled backward only writes its slots")
        wait = next((n.name for n in nodes[issue + 1:]
                     if n.op != "output" and any(a.name in touched for a in n.all_input_nodes)), "output")
        key = group[0][1].key
        wire = torch.bfloat16 if compress == "bf16" and key[1].itemsize > 2 and key[1].is_floating_point else key[1]
        plan.buckets.append(Bucket(
            index=index, key=key, start=group[0][1].offset, stop=group[-1][1].offset + group[-1][1].numel,
            slots=tuple(names), offsets=tuple(s.offset for _, s in group),
            shapes=tuple(tuple(s.shape) for _, s in group),
            written_by=tuple(nodes[max(writers[n])].name for n in names), wire_dtype=wire,
            issue_after=nodes[issue].name, wait_before=wait))
    return plan


# -- the pass ------------------------------------------------------------------------------------


def _pool_wrapper(ctx: PassContext) -> PooledBackward | None:
    found = [w for _, w in ctx.runtime_wrappers if isinstance(w, PooledBackward)]
    return found[-1] if found else None


def _group(ctx: PassContext, replica):
    option = ctx.config.options.data_parallel
    if option is True or option is False:
        return replica.group
    if replica.explicit_group and option is not replica.group:
        raise UsageError("dsgraph: options['data_parallel'] names a process group other than the one given to "
                         "dsgraph.replicate(model, process_group); give the same group (or only one of them)")
    return option


def lowers_pool_epilogues(ctx: PassContext, gm: GraphModule) -> bool:
    """Will ``lower_triton`` run after this pass and take the tagged bucket epilogues
    (selections ``tagged``, the default, and ``all``; not refused for this graph: CPU
    tensors without Triton's interpreter, CPU Inductor without ``opaque=1``)? Only then is
    the per-bucket form worth it (see the module docstring). The same on every rank: the
    pipeline, the options and the graph's device type decide."""
    from dsgraph.passes.lower_triton import refusal

    pipeline = ctx.config.pipeline
    lower = pipeline.get("lower_triton")
    mine = pipeline.get("allreduce")
    if lower is None or mine is None or pipeline.passes.index(lower) < pipeline.passes.index(mine):
        return False
    if (lower.arg("select") or "tagged") not in ("tagged", "all"):
        return False
    return refusal(gm, ctx.config.options.inductor, lower.arg("opaque") == "1") is None


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    import torch.distributed as dist

    pool = _pool_wrapper(ctx)
    if pool is None:
        if ctx.config.pipeline.get("grad_pool") is None:
            raise UsageError("the allreduce pass reduces slices of the gradient pool: the pipeline needs "
                             "'grad_pool' before 'allreduce' (options={'data_parallel': True} adds both)")
        return PassResult(gm, changed=False, stats={"buckets": 0})  # no parameter gradients here
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    slot_inputs = placeholders[len(placeholders) - len(pool.slots):]
    if not all(n.name.startswith("dsgraph_grad_") for n in slot_inputs):
        raise ValueError("the gradient pool's slot inputs are not the graph's last inputs")
    params = [s.param() for s in pool.slots]
    replica = replica_of(params)
    group = _group(ctx, replica)
    world = dist.get_world_size(group)
    bucket_mb = ctx.args.get("bucket_mb", DEFAULT_BUCKET_MB)
    plan = plan_buckets(gm, [(n.name, s) for n, s in zip(slot_inputs, pool.slots)], int(bucket_mb * (1 << 20)),
                        FIRST_BUCKET_BYTES, ctx.args.get("compress", "none"), world,
                        "bucket" if lowers_pool_epilogues(ctx, gm) else "slots")
    # a rank that planned differently would hang in, or corrupt, the collectives below
    check_same_on_all_ranks(group, f"all-reduce plan of the backward graph {ctx.graph_name}", plan.lines())

    fake_mode = compat.detect_fake_mode(ctx.example_inputs) or compat.fake_mode_of(gm)
    _, fakes = add_bucket_inputs(gm, plan, fake_mode)
    first_slot_input = len(ctx.example_inputs) - len(pool.slots)
    ctx.example_inputs[first_slot_input:first_slot_input] = fakes
    gm.recompile()
    local = compat.copy_graph_module(gm)  # the variant without collectives
    gm = apply_buckets(gm, plan, compat.group_name(group), fake_mode)

    specs = [BucketSpec(b.key, b.start, b.stop, b.wire_dtype) for b in plan.buckets]
    wrapper = DataParallelBackward(replica, group, specs, list(pool.slots), world, ctx.config.debug, pool)
    ctx.register_runtime_wrapper(wrapper)
    ctx.add_variant("no_sync", local, wrapper.use_local)
    ctx.dump_text("allreduce.md", f"# all-reduce plan\n\n```\n{plan}\n```\n")
    ctx.report(allreduce_buckets=len(plan.buckets), allreduce_sent_bytes=plan.sent_bytes,
               allreduce_inflight_bytes=plan.inflight_bytes)
    stats = {"buckets": len(plan.buckets), "sent_bytes": plan.sent_bytes, "inflight_bytes": plan.inflight_bytes,
             "first_bucket_bytes": plan.buckets[0].nbytes if plan.buckets else 0,
             "epilogue": plan.epilogue}
    return PassResult(gm, changed=True, stats=stats)
