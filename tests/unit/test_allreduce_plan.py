"""The allreduce pass without processes: bucket plans on small hand-made and captured
backward graphs, the rewrite's order, its options, and the safety rules around it
(numerics and collectives: tests/dist)."""

import copy
import importlib
import weakref

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import FileCheck

import dsgraph
from dsgraph.compile.pipeline import resolve
from dsgraph.report.capture import capture as capture_compiles
from dsgraph.runtime.ops import MM_INTO
from dsgraph.runtime.pool import ALIGN, MANAGER, Slot

from models import MLP

allreduce = importlib.import_module("dsgraph.passes.allreduce")

F32 = (torch.device("cpu"), torch.float32)
BF16 = (torch.device("cpu"), torch.bfloat16)
_keep = []  # parameters the hand-made slots point at


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def make_slots(shapes, key=F32, start=0, gaps=()):
    """Slots laid out as the pool lays them out (aligned, adjacent), with extra ``gaps``
    (slot index -> elements skipped before it)."""
    slots, offset = [], start
    for i, shape in enumerate(shapes):
        offset = aligned(offset) + dict(gaps).get(i, 0)
        p = torch.zeros(shape, dtype=key[1])
        _keep.append(p)
        numel = p.numel()
        slots.append(Slot(weakref.ref(p), key, offset, numel, tuple(shape), tuple(p.stride())))
        offset += numel
    return slots


def backward_like(slots, write_order, reader_after=None):
    """A graph with one input per slot (``dsgraph_grad_i``) that writes the slots in
    ``write_order``, matrices through ``mm_into_`` and vectors through ``copy_``, like the
    pooled backward; ``reader_after``: a slot that a later node reads."""
    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    with mode:
        x.meta["val"] = torch.empty(5, 7)
    inputs = []
    for i, s in enumerate(slots):
        node = graph.placeholder(f"dsgraph_grad_{i}")
        with mode:
            node.meta["val"] = torch.empty_strided(s.shape, s.stride, dtype=s.key[1])
        inputs.append(node)
    for i in write_order:
        s, slot = slots[i], inputs[i]
        if len(s.shape) == 2:
            a = graph.call_function(torch.ops.aten.randn.default, ([s.shape[0], 5],))
            b = graph.call_function(torch.ops.aten.randn.default, ([5, s.shape[1]],))
            with mode:
                a.meta["val"], b.meta["val"] = torch.empty(s.shape[0], 5), torch.empty(5, s.shape[1])
            graph.call_function(MM_INTO, (slot, a, b))
        else:
            g = graph.call_function(torch.ops.aten.randn.default, (list(s.shape),))
            with mode:
                g.meta["val"] = torch.empty(s.shape, dtype=s.key[1])
            total = graph.call_function(torch.ops.aten.add.Tensor, (slot, g))
            total.meta["val"] = slot.meta["val"]
            w = graph.call_function(torch.ops.aten.copy_.default, (slot, total))
            w.meta["val"] = slot.meta["val"]
    if reader_after is not None:
        r = graph.call_function(torch.ops.aten.sum.default, (inputs[reader_after],))
        with mode:
            r.meta["val"] = torch.empty(())
        graph.output((r,))
    else:
        graph.output((None,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return gm, [(n.name, s) for n, s in zip(inputs, slots)], mode


def test_buckets_follow_production_order_and_caps():
    # 4x100 fp32 = 1600 B each; caps: first 1000 B, then 3000 B (a bucket closes once it holds >= cap)
    slots = make_slots([(4, 100), (4, 100), (4, 100), (4, 100), (7,)])
    gm, named, _ = backward_like(slots, write_order=[0, 1, 2, 3, 4])
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=3000, first_bucket_bytes=1000)
    assert [b.slots for b in plan.buckets] == [
        ("dsgraph_grad_0",), ("dsgraph_grad_1", "dsgraph_grad_2"), ("dsgraph_grad_3", "dsgraph_grad_4")]
    for b in plan.buckets:
        first = slots[int(b.slots[0].rsplit("_", 1)[1])]
        last = slots[int(b.slots[-1].rsplit("_", 1)[1])]
        assert (b.start, b.stop) == (first.offset, last.offset + last.numel)  # one view, padding inside
        assert b.nbytes == (b.stop - b.start) * 4 and b.wire_dtype == torch.float32 and b.wait_before == "output"
    assert plan.inflight_bytes == 0 and plan.first_bucket_bytes == 1000
    assert "3 buckets" in str(plan) and "issued after" in str(plan)


def test_slots_are_taken_in_the_order_the_graph_writes_them():
    """Production order decides, not the order of the inputs; a bucket only grows by a slot
    that lies right after it in the buffer."""
    slots = make_slots([(3,), (5,), (6,)])
    gm, named, _ = backward_like(slots, write_order=[2, 0, 1])
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=1 << 20, first_bucket_bytes=1 << 20)
    # slot 2 comes first but is not adjacent to what follows it in production order
    assert [b.slots for b in plan.buckets] == [("dsgraph_grad_2",), ("dsgraph_grad_0", "dsgraph_grad_1")]
    writes = [n.name for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert plan.buckets[0].issue_after == writes[0] and plan.buckets[1].issue_after == writes[2]
    assert plan.buckets[1].written_by == (writes[1], writes[2])


def test_gaps_and_dtypes_split_buckets():
    f32 = make_slots([(8,), (8,), (8,)], gaps={2: 3 * ALIGN})
    bf16 = make_slots([(9,)], key=BF16)
    slots = f32 + bf16
    gm, named, _ = backward_like(slots, write_order=[0, 1, 2, 3])
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=1 << 20, first_bucket_bytes=1 << 20, compress="bf16")
    assert [b.slots for b in plan.buckets] == [("dsgraph_grad_0", "dsgraph_grad_1"), ("dsgraph_grad_2",),
                                               ("dsgraph_grad_3",)]
    assert [b.wire_dtype for b in plan.buckets] == [torch.bfloat16, torch.bfloat16, torch.bfloat16]
    assert [b.compressed for b in plan.buckets] == [True, True, False]  # bf16 gradients travel as they are
    assert plan.inflight_bytes == sum(b.numel * 2 for b in plan.buckets[:2])
    assert plan.sent_bytes == sum(b.numel * 2 for b in plan.buckets)


def test_wait_goes_before_a_later_reader():
    slots = make_slots([(4,), (6,)])
    gm, named, _ = backward_like(slots, write_order=[0, 1], reader_after=0)
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=8, first_bucket_bytes=8)
    assert plan.buckets[0].wait_before.startswith("sum") and plan.buckets[1].wait_before == "output"


def test_a_slot_read_before_its_bucket_is_issued_is_refused():
    """The scale follows each slot's last write; a reader before the issue would see it scaled."""
    slots = make_slots([(4,), (6,)])
    gm, named, _ = backward_like(slots, write_order=[0], reader_after=0)
    graph = gm.graph
    out = graph.output_node()
    (reader,) = out.args[0]
    slot1 = next(n for n in graph.nodes if n.name == "dsgraph_grad_1")
    with graph.inserting_before(out):  # slot 1 is written after the read of slot 0
        g = graph.call_function(torch.ops.aten.randn.default, ([6],))
        total = graph.call_function(torch.ops.aten.add.Tensor, (slot1, g))
        graph.call_function(torch.ops.aten.copy_.default, (slot1, total))
    with pytest.raises(ValueError, match="read by sum"):
        allreduce.plan_buckets(gm, named, bucket_bytes=1 << 20, first_bucket_bytes=1 << 20)


def test_plan_text_is_rank_independent():
    """Ranks use different devices (cuda:0, cuda:1): the compared text names the type only."""
    a = make_slots([(4, 3), (5,)], key=(torch.device("cuda", 0), torch.float32))
    b = make_slots([(4, 3), (5,)], key=(torch.device("cuda", 1), torch.float32))
    ga, na, _ = backward_like(a, [0, 1])
    gb, nb, _ = backward_like(b, [0, 1])
    pa = allreduce.plan_buckets(ga, na, 1 << 20, world_size=2)
    pb = allreduce.plan_buckets(gb, nb, 1 << 20, world_size=2)
    assert pa.lines() == pb.lines() and "cuda" in pa.lines()[1] and "cuda:" not in "\n".join(pa.lines())


def test_unwritten_slot_and_bad_compress_are_refused():
    slots = make_slots([(4,), (6,)])
    gm, named, _ = backward_like(slots, write_order=[0])
    with pytest.raises(ValueError, match="never written"):
        allreduce.plan_buckets(gm, named, 1 << 20)
    gm, named, _ = backward_like(slots, write_order=[0, 1])
    with pytest.raises(ValueError, match="compress"):
        allreduce.plan_buckets(gm, named, 1 << 20, compress="fp8")


def test_rewrite_orders_writes_scale_issue_wait():
    slots = make_slots([(4, 100), (7,), (4, 100)])
    gm, named, mode = backward_like(slots, write_order=[0, 1, 2])
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=1000, first_bucket_bytes=1000, world_size=4)
    assert [b.slots for b in plan.buckets] == [("dsgraph_grad_0",), ("dsgraph_grad_1", "dsgraph_grad_2")]
    inputs, fakes = allreduce.add_bucket_inputs(gm, plan, mode)
    assert [n.name for n in inputs] == ["dsgraph_bucket_0", "dsgraph_bucket_1"]
    assert [tuple(f.shape) for f in fakes] == [(b.numel,) for b in plan.buckets]
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert placeholders.index("dsgraph_bucket_1") < placeholders.index("dsgraph_grad_0")  # before the slots
    gm = allreduce.apply_buckets(gm, plan, "7", mode)
    gm.recompile()
    (FileCheck()
     .check("mm_into_.default(dsgraph_grad_0").check("mul_.Scalar(dsgraph_grad_0, 0.25)")
     .check("control_deps((dsgraph_grad_0,), dsgraph_issue_0, dsgraph_bucket_0)")
     .check("copy_.default(dsgraph_grad_1").check("mul_.Scalar(dsgraph_grad_1, 0.25)")
     .check_not("control_deps")
     .check("mm_into_.default(dsgraph_grad_2").check("mul_.Scalar(dsgraph_grad_2, 0.25)")
     .check("control_deps((dsgraph_grad_1, dsgraph_grad_2), dsgraph_issue_1, dsgraph_bucket_1)")
     .check("wait_tensor.default(dsgraph_issued_0)").check("wait_tensor.default(dsgraph_issued_1)")
     .check("return")
     .run(gm.code))
    sub = gm.dsgraph_issue_1.code
    assert "all_reduce_.default(bucket, 'sum', '7')" in sub and "mul" not in sub  # the collective alone
    assert "cat" not in gm.code and "split" not in gm.code


def test_compressed_rewrite_builds_the_wire_buffer_from_the_slots():
    slots = make_slots([(3, 5), (7,)])
    gm, named, mode = backward_like(slots, write_order=[0, 1])
    plan = allreduce.plan_buckets(gm, named, 1 << 20, compress="bf16", world_size=2)
    allreduce.add_bucket_inputs(gm, plan, mode)
    gm = allreduce.apply_buckets(gm, plan, "0", mode)
    gm.recompile()
    pad = slots[1].offset - slots[0].numel
    (FileCheck()
     .check("copy_.default(dsgraph_grad_1")
     .check("mul.Tensor(dsgraph_grad_0, 0.5)").check("convert_element_type").check("view.default")
     .check(f"full.default([{pad}], 0.0, dtype = torch.bfloat16")
     .check("mul.Tensor(dsgraph_grad_1, 0.5)").check("cat.default")
     .check("all_reduce_.default(cat_default, 'sum', '0')")
     .check("wait_tensor").check("copy_.default(dsgraph_bucket_0, wait_tensor")
     .run(gm.code))
    assert plan.inflight_bytes == plan.buckets[0].numel * 2


def test_inflight_bound_covers_the_plan():
    """The planner's bound (made before the backward exists) is at least what the plan keeps
    in flight, on a real pooled backward."""
    torch.manual_seed(0)
    model = MLP()
    with capture_compiles() as cap:
        torch.compile(model, backend="dsgraph", options={"inductor": False, "grad_pool": True})(
            torch.randn(5, 13)).sum().backward()
    bw = cap.compiles[0].stages["backward"].after
    inputs = [n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("dsgraph_grad_")]
    # the pool's inputs follow production order, and a first compile assigns slots in that order
    slots = sorted((MANAGER.slot_of(p) for p in model.parameters()), key=lambda s: s.offset)
    assert [tuple(n.meta["val"].shape) for n in inputs] == [s.shape for s in slots]
    named = [(n.name, s) for n, s in zip(inputs, slots)]
    plan = allreduce.plan_buckets(bw, named, 1 << 20, compress="bf16", world_size=2)
    covered = sorted((s.offset, s.offset + s.numel) for b in plan.buckets for s in [dict(named)[n] for n in b.slots])
    assert covered == sorted((s.offset, s.offset + s.numel) for s in slots)  # every slot, once
    assert [b.slots for b in plan.buckets] == [tuple(n for n, _ in named)]  # 1 MiB: one bucket
    assert allreduce.inflight_bytes(inputs, "bf16") >= plan.inflight_bytes > 0
    assert allreduce.inflight_bytes(inputs, "none") == 0


# -- the per-bucket epilogue (lower_triton) ------------------------------------------------------


TAG = "dsgraph_pool_epilogue"


def bucket_form(compress="none", world_size=4):
    """The three-slot backward of test_rewrite_orders_writes_scale_issue_wait rewritten with
    one epilogue per bucket."""
    slots = make_slots([(4, 100), (7,), (4, 100)])
    gm, named, mode = backward_like(slots, write_order=[0, 1, 2])
    plan = allreduce.plan_buckets(gm, named, bucket_bytes=1000, first_bucket_bytes=1000, compress=compress,
                                  world_size=world_size, epilogue="bucket")
    allreduce.add_bucket_inputs(gm, plan, mode)
    gm = allreduce.apply_buckets(gm, plan, "7", mode)
    gm.recompile()
    return gm, plan


def test_bucket_epilogue_is_one_tagged_pass_over_each_bucket():
    gm, plan = bucket_form()
    assert [b.slots for b in plan.buckets] == [("dsgraph_grad_0",), ("dsgraph_grad_1", "dsgraph_grad_2")]
    assert plan.lines()[0].endswith("epilogue per bucket")
    (FileCheck()
     .check("mm_into_.default(dsgraph_grad_0")
     .check("bucket_ready_.default(dsgraph_bucket_0, [dsgraph_grad_0])")
     .check("mul.Tensor(dsgraph_bucket_0, 0.25)").check("copy_.default(dsgraph_bucket_0, mul_tensor)")
     .check("control_deps((dsgraph_grad_0, dsgraph_bucket_0), dsgraph_issue_0, dsgraph_bucket_0)")
     .check("copy_.default(dsgraph_grad_1").check_not("control_deps")
     .check("mm_into_.default(dsgraph_grad_2")
     .check("bucket_ready_.default(dsgraph_bucket_1, [dsgraph_grad_1, dsgraph_grad_2])")
     .check("mul.Tensor(dsgraph_bucket_1, 0.25)").check("copy_.default(dsgraph_bucket_1")
     .check("control_deps((dsgraph_grad_1, dsgraph_grad_2, dsgraph_bucket_1), dsgraph_issue_1, dsgraph_bucket_1)")
     .check("wait_tensor.default(dsgraph_issued_0)").check("wait_tensor.default(dsgraph_issued_1)")
     .run(gm.code))
    assert "mul_.Scalar" not in gm.code  # no per-slot scales
    tagged = [n.name for n in gm.graph.nodes if n.meta.get(TAG)]
    assert tagged == ["mul_tensor", "copy__default_1", "mul_tensor_1", "copy__default_2"]
    assert "mul" not in gm.dsgraph_issue_1.code  # the collective alone in its subgraph


def test_compressed_bucket_epilogue_casts_the_bucket_view():
    gm, plan = bucket_form(compress="bf16", world_size=2)
    (FileCheck()
     .check("bucket_ready_.default(dsgraph_bucket_0, [dsgraph_grad_0])")
     .check("mul.Tensor(dsgraph_bucket_0, 0.5)").check("convert_element_type.default(mul_tensor, torch.bfloat16)")
     .check("all_reduce_.default(convert_element_type_default, 'sum', '7')")
     .check("bucket_ready_.default(dsgraph_bucket_1, [dsgraph_grad_1, dsgraph_grad_2])")
     .check("all_reduce_.default(convert_element_type_default_1, 'sum', '7')")
     .check("wait_tensor").check("copy_.default(dsgraph_bucket_0, wait_tensor")
     .run(gm.code))
    assert "cat" not in gm.code and "full" not in gm.code  # no wire buffer assembled from the slots
    assert [n.target for n in gm.graph.nodes if n.meta.get(TAG)] == [
        torch.ops.aten.mul.Tensor, torch.ops.prims.convert_element_type.default] * 2
    assert plan.inflight_bytes == sum(b.numel * 2 for b in plan.buckets)


@pytest.mark.parametrize("compress", ["none", "bf16"])
def test_tagged_lowering_takes_one_region_per_bucket(compress):
    """The epilogue's nodes are one region each (the collective, the ordering op and the slot
    writes are outside it); tagged selection takes exactly those."""
    from dsgraph.lowering.regions import find_regions
    from dsgraph.passes.lower_triton import plan_lowering

    gm, plan = bucket_form(compress=compress)
    tagged = [n for n in gm.graph.nodes if n.meta.get(TAG)]
    lowering = plan_lowering(gm, "tagged")
    assert [p.region.nodes for p in lowering.regions] == [tagged[:2], tagged[2:]]
    for p, b in zip(lowering.regions, plan.buckets):
        assert p.region.kind == "pointwise" and [n.name for n in p.binding.params] == [f"dsgraph_bucket_{b.index}"]
        if compress == "none":
            assert p.region.outputs == [] and [w.args[0].name for w in p.region.writes] == [f"dsgraph_bucket_{b.index}"]
            assert p.bytes_moved == 2 * b.nbytes  # read and written once, in place
        else:
            assert [o.meta["val"].dtype for o in p.region.outputs] == [torch.bfloat16] and not p.region.writes
            assert p.bytes_moved == b.nbytes + b.wire_bytes
    # the slots' own accumulations (add + copy_) are regions too, left to Inductor
    assert len(find_regions(gm)) == len(lowering.regions) + 1


@pytest.fixture
def triton_interpreter():
    import triton

    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    yield
    triton.knobs.runtime.interpret = old


@pytest.mark.parametrize("compress", ["none", "bf16"])
def test_bucket_epilogue_kernel_is_bitwise_the_aten_ops(compress, triton_interpreter):
    """The generated kernel against the ops it replaces, bitwise, for a scale that is not a
    power of two (world size 3), values around bf16 rounding ties, subnormal, huge and
    non-finite values."""
    from dsgraph.lowering import kernels
    from dsgraph.passes.lower_triton import plan_lowering

    gm, plan = bucket_form(compress=compress, world_size=3)
    g = torch.Generator().manual_seed(14)
    for planned, b in zip(plan_lowering(gm, "tagged").regions, plan.buckets):
        x = torch.randn(b.numel, generator=g) * torch.logspace(-40, 38, b.numel).float()
        x[:7] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0, 2 ** -130, float("inf"), float("nan")])
        want = x * (1.0 / 3)
        want = want.to(torch.bfloat16) if compress == "bf16" else want
        op = kernels.compile_kernel(planned.ir).op
        if compress == "bf16":
            got = op(x)
        else:
            got = x.clone()
            op(got)
        bits = torch.int16 if compress == "bf16" else torch.int32
        nan = want.isnan()
        assert got.dtype == want.dtype and torch.equal(got.isnan(), nan) and nan.any()
        # every bit of every number; a NaN stays a NaN (the payload of the kernel's bf16 NaN is
        # the canonical one, torch's conversion keeps others)
        assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))


def test_the_pass_picks_the_bucket_form_only_where_lower_triton_takes_it(triton_interpreter):
    from types import SimpleNamespace

    from dsgraph.compile.pipeline import parse

    gm, _ = bucket_form()

    def lowers(pipeline: str, inductor: bool = False) -> bool:
        ctx = SimpleNamespace(config=SimpleNamespace(pipeline=parse(pipeline),
                                                     options=SimpleNamespace(inductor=inductor)))
        return allreduce.lowers_pool_epilogues(ctx, gm)

    assert lowers("grad_pool,allreduce,lower_triton")
    assert lowers("grad_pool,allreduce,lower_triton{select=all}")
    assert not lowers("grad_pool,allreduce")
    assert not lowers("grad_pool,allreduce,lower_triton{select=recomputed}")  # takes no pool epilogue
    assert not lowers("grad_pool,lower_triton,allreduce")  # lowering ran before the tags exist
    assert not lowers("grad_pool,allreduce,lower_triton", inductor=True)  # refused: CPU Inductor
    assert lowers("grad_pool,allreduce,lower_triton{opaque=1}", inductor=True)


# -- options, pipeline, safety -------------------------------------------------------------------


def test_data_parallel_options_build_the_pipeline():
    opts = dsgraph.validate_options({"data_parallel": True, "bucket_mb": 4, "compress": "bf16"})
    assert str(resolve(opts, {})) == "lifetimes,grad_pool,allreduce{bucket_mb=4.0,compress=bf16}"
    assert str(resolve(dsgraph.validate_options({"data_parallel": True}), {})) == "lifetimes,grad_pool,allreduce"
    with pytest.raises(ValueError, match="set 'data_parallel' too"):
        resolve(dsgraph.validate_options({"bucket_mb": 4}), {})
    with pytest.raises(ValueError, match="contradicts"):
        resolve(dsgraph.validate_options({"data_parallel": True, "bucket_mb": 4,
                                          "pipeline": "grad_pool,allreduce{bucket_mb=8}"}), {})
    explicit = dsgraph.validate_options({"compress": "bf16", "pipeline": "grad_pool,allreduce"})
    assert str(resolve(explicit, {})) == "grad_pool,allreduce{compress=bf16}"


def test_a_required_pass_never_falls_back_to_stock(monkeypatch):
    """A pipeline holding allreduce raises a pass failure instead of compiling without the
    all-reduce (training would go on, silently unsynchronized); without it the fallback
    applies as before."""
    from torch._dynamo.exc import BackendCompilerFailed

    monkeypatch.setenv("DSGRAPH_TEST_FAIL_PASS", "grad_pool")
    model = nn.Sequential(nn.Linear(5, 3))
    with pytest.raises(BackendCompilerFailed, match="'grad_pool' failed"):
        torch.compile(model, backend="dsgraph", options={"inductor": False, "pipeline": "grad_pool,allreduce"})(
            torch.randn(2, 5))
    torch._dynamo.reset()
    with pytest.warns(dsgraph.DsgraphFallbackWarning):
        torch.compile(model, backend="dsgraph", options={"inductor": False, "pipeline": "grad_pool"})(
            torch.randn(2, 5))


def test_pool_serves_a_graph_compiled_for_another_model():
    """Dynamo reuses a model's graphs for another instance of its class: the pooled backward
    writes the second model's gradients into the second model's slots (the backward receives
    the parameters), and leaves the first model's alone."""
    opts = {"inductor": False, "grad_pool": True}
    torch.manual_seed(0)
    first, second = MLP(), MLP()
    x, y = torch.randn(4, 13), torch.randn(4, 13)
    reference = copy.deepcopy(second)
    torch.compile(reference, backend="dsgraph", options={"inductor": False, "pipeline": ""})(y).sum().backward()
    torch._dynamo.reset()
    torch.compile(first, backend="dsgraph", options=opts)(x).sum().backward()
    first_grads = [p.grad.clone() for p in first.parameters()]
    torch.compile(second, backend="dsgraph", options=opts)(y).sum().backward()
    assert len([r for r in dsgraph.reports() if r.kind == "backward" and "grad_pool" in r.pipeline]) == 1  # reused
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(second.parameters(), reference.parameters()))
    assert all(torch.equal(p.grad, g) for p, g in zip(first.parameters(), first_grads))


def test_data_parallel_needs_torch_distributed():
    with pytest.raises(dsgraph.errors.UsageError, match="init_process_group"):
        dsgraph.replicate(MLP())
    with pytest.raises(dsgraph.errors.UsageError, match="not replicated"):
        with dsgraph.no_sync(MLP()):
            pass
