"""One rank of a dist test scenario (started by launch.py): ``worker.py <scenario> <out.json>``.

Every scenario trains with per-rank different data (a different batch per rank and per
step) and compares dsgraph's data parallelism with torch's DistributedDataParallel on the
same gloo group, in this process. The findings go to ``out.json`` as a list of checks
(name, ok, detail); the pytest side asserts them.

References:
- ``ddp_local``: DDP around the same model compiled by dsgraph without data_parallel (and
  without the pool), run as FX code: the same local gradients bit for bit, DDP's reduction.
  dsgraph's result must equal it bitwise (two ranks: a sum of two numbers has one order).
- ``ddp_eager``: DDP around the eager model: equal within the fp32 rule (the local
  gradients of decomposed graphs differ from eager's in the last bits).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models.py

import dsgraph  # noqa: E402
from models import MLP  # noqa: E402
from dsgraph.runtime.pool import ALIGN  # noqa: E402

FX = {"inductor": False}
BUCKET_MB = 0.0008  # ~840 B: the MLP's 6 gradients fall into 3 buckets
CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def rank() -> int:
    return dist.get_rank()


def batch(step: int, n: int = 6, d: int = 13) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + 17 * rank() + 5)
    return torch.randn(n, d, generator=g)


def fresh_model(cls=MLP, **kw) -> nn.Module:
    torch.manual_seed(100 + rank())  # ranks start different: replicate/DDP broadcast rank 0's
    return cls(**kw)


def loss_of(fn, x):
    return fn(x).square().mean()


def train(fn, model, steps: int, micro: int = 1, no_sync=None, before_step=None):
    """``steps`` optimizer steps of ``micro`` micro-batches (all but the last inside
    ``no_sync()`` when given); returns the gradients seen before each step and the final
    parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(steps):
        if before_step:
            before_step(model, step)
        for m in range(micro):
            x = batch(step * micro + m)
            if m < micro - 1 and no_sync is not None:
                with no_sync():
                    loss_of(fn, x).backward()
                grads.append({f"{n}@micro{m}": p.grad.detach().clone() for n, p in model.named_parameters()})
            else:
                loss_of(fn, x).backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def compare(name: str, got, ref, bitwise: bool, rtol: float = 1e-5) -> None:
    """Per tensor: equal bitwise, or ||got - ref|| <= rtol ||ref|| (the fp32 rule)."""
    bad = []
    for key in ref:
        a, b = got[key], ref[key]
        if bitwise:
            if not torch.equal(a, b):
                bad.append(f"{key}: max diff {(a - b).abs().max().item():.3g}")
        elif (a - b).norm() > rtol * b.norm():
            bad.append(f"{key}: relative {((a - b).norm() / b.norm()).item():.3g}")
    check(name, not bad, "; ".join(bad))


def compare_steps(name: str, got: list, ref: list, bitwise: bool) -> None:
    for i, (g, r) in enumerate(zip(got, ref)):
        compare(f"{name} grads {i}", g, r, bitwise)
    check(f"{name} step count", len(got) == len(ref), f"{len(got)} vs {len(ref)}")


def ddp_local(model, hook=None):
    """DDP around the model compiled by dsgraph without data parallelism (FX code)."""
    m = copy.deepcopy(model)
    ddp = DDP(torch.compile(m, backend="dsgraph", options={**FX, "pipeline": "lifetimes"}))
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    return ddp, m


def bf16_cast_hook(group, bucket):
    """DDP's bf16_compress_hook written out (DDP accepts a hook of that name only with NCCL): cast the
    bucket to bf16, divide by the world size, all-reduce, cast back into the bucket."""
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        buf.copy_(fut.value()[0])
        return buf

    return fut.then(decompress)


def ddp_eager(model):
    m = copy.deepcopy(model)
    return DDP(m), m


def dsgraph_dp(model, **options):
    # Dynamo would reuse an earlier model's graphs for this one (a data-parallel backward refuses that)
    torch._dynamo.reset()
    return torch.compile(model, backend="dsgraph", options={**FX, "data_parallel": True, "bucket_mb": BUCKET_MB,
                                                            **options})


def buckets_in_reports() -> int:
    return max((r.passes[i].stats.get("buckets", 0) for r in dsgraph.reports()
                for i in range(len(r.passes)) if r.passes[i].name == "allreduce"), default=0)


# -- scenarios -------------------------------------------------------------------------------


def scenario_parity() -> None:
    # replicate broadcasts rank 0's parameters
    model = fresh_model()
    torch.manual_seed(100)
    rank0 = {n: p.detach().clone() for n, p in MLP().named_parameters()}
    dsgraph.replicate(model)
    compare("replicate broadcasts rank 0's parameters", dict(model.named_parameters()), rank0, bitwise=True)

    # synced steps
    ref_local, m_local = ddp_local(model)
    ref_eager, m_eager = ddp_eager(model)
    ours = copy.deepcopy(model)
    dsgraph.replicate(ours)
    g_ours, p_ours = train(dsgraph_dp(ours), ours, steps=3)
    g_local, p_local = train(ref_local, m_local, steps=3)
    g_eager, p_eager = train(ref_eager, m_eager, steps=3)
    check("three buckets", buckets_in_reports() == 3, f"{buckets_in_reports()} buckets")
    compare_steps("sync vs DDP(dsgraph local)", g_ours, g_local, bitwise=True)
    compare("sync params vs DDP(dsgraph local)", p_ours, p_local, bitwise=True)
    compare_steps("sync vs DDP eager", g_ours, g_eager, bitwise=False)
    compare("sync params vs DDP eager", p_ours, p_eager, bitwise=False)

    # no_sync: two local micro-batches, then one synced, three times
    ours = copy.deepcopy(model)
    dsgraph.replicate(ours)
    ref_local, m_local = ddp_local(model)
    ref_eager, m_eager = ddp_eager(model)
    g_ours, p_ours = train(dsgraph_dp(ours), ours, steps=3, micro=3, no_sync=lambda: dsgraph.no_sync(ours))
    g_local, p_local = train(ref_local, m_local, steps=3, micro=3, no_sync=ref_local.no_sync)
    g_eager, p_eager = train(ref_eager, m_eager, steps=3, micro=3, no_sync=ref_eager.no_sync)
    compare_steps("no_sync vs DDP(dsgraph local)", g_ours, g_local, bitwise=True)
    compare("no_sync params vs DDP(dsgraph local)", p_ours, p_local, bitwise=True)
    compare_steps("no_sync vs DDP eager", g_ours, g_eager, bitwise=False)
    compare("no_sync params vs DDP eager", p_ours, p_eager, bitwise=False)
    local = g_ours[0]["fc1.weight@micro0"]
    others = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(others, local)
    check("no_sync gradients stay local (they differ between ranks)", not torch.equal(others[0], others[1]))

    # bf16 compression
    ours = copy.deepcopy(model)
    dsgraph.replicate(ours)
    ref_local, m_local = ddp_local(model, hook=bf16_cast_hook)
    ref_eager, m_eager = ddp_eager(model)
    g_ours, p_ours = train(dsgraph_dp(ours, compress="bf16"), ours, steps=3)
    g_local, p_local = train(ref_local, m_local, steps=3)
    # DDP's hook divides after the cast (bf16(g) / 2), dsgraph casts g / 2: equal for two ranks
    compare_steps("bf16 vs DDP(dsgraph local)+bf16_compress_hook", g_ours, g_local, bitwise=True)
    compare("bf16 params vs DDP(dsgraph local)+bf16_compress_hook", p_ours, p_local, bitwise=True)
    # against fp32 DDP at the first step (same parameters): per element, the cast of each
    # rank's half and the bf16 sum each round once with unit roundoff u = 2^-8 (8 significant
    # bits), so |err| <= u (2 + u) (|a| + |b|) / 2, where a, b are the ranks' local gradients;
    # plus the fp32 rule for the local gradients
    _, m_first = ddp_eager(model)
    loss_of(m_first, batch(0)).backward()  # local gradients of this rank (no DDP: not reduced)
    ref_eager_g, _ = train(ref_eager, m_eager, steps=1)
    bad = []
    for n, p in m_first.named_parameters():
        halves = [torch.empty_like(p.grad) for _ in range(2)]
        dist.all_gather(halves, p.grad)
        u = 2.0 ** -8
        bound = u * (2 + u) * (halves[0].abs() + halves[1].abs()) / 2
        ref = ref_eager_g[0][n]
        err = (g_ours[0][n] - ref).abs()
        slack = 1e-5 * ref.norm() / ref.numel() ** 0.5
        if not bool((err <= bound + slack).all()):
            i = int((err - bound).argmax())
            bad.append(f"{n}: worst excess {(err - bound).max().item():.3g} at {i}: ours {g_ours[0][n].flatten()[i].item()!r} "
                       f"ref {ref.flatten()[i].item()!r} halves {halves[0].flatten()[i].item()!r} {halves[1].flatten()[i].item()!r}")
    check("bf16 first step within the bf16 rounding bound of fp32 DDP", not bad, "; ".join(bad))
    diff = max(((g_ours[0][n] - ref_eager_g[0][n]).abs().max().item() for n in ref_eager_g[0]))
    check("bf16 really compresses (differs from fp32)", diff > 0, f"max diff {diff:.3g}")

    # with a memory budget: the checkpoint planner counts the compressed buckets in flight
    # (an upper bound: the bf16 bytes of the fp32 gradients plus a slot's alignment padding
    # each), and nothing changes in the arithmetic
    ours = copy.deepcopy(model)
    dsgraph.replicate(ours)
    dsgraph.clear_reports()
    g_budget, p_budget = train(dsgraph_dp(ours, compress="bf16", memory_budget="1GiB"), ours, steps=3)
    stats = {p.name: p.stats for r in dsgraph.reports() for p in r.passes}
    sent = stats["allreduce"]["inflight_bytes"]
    counted = stats["checkpoint"]["inflight_bytes"]
    bound = sum((p.numel() + ALIGN) * 2 for p in model.parameters())
    check("budget: the planner counts the buckets in flight", sent <= counted == bound,
          f"planned in flight {sent}, counted {counted}, bound {bound}")
    compare_steps("budget bf16 vs bf16", g_budget, g_ours, bitwise=True)

    # hooks see local gradients (as with DDP): a clamping hook on one rank only, a
    # post-accumulate hook, and a .grad the user put there on some steps
    seen_ours, seen_ref = [], []

    def add_hooks(m, seen):
        # on rank 0 only: rank 1 reduces inside the graph at steps 0 and 2, rank 0 after it
        if rank() == 0:
            m.fc1.weight.register_hook(lambda g: g.clamp(-0.02, 0.02))
            m.norm.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.detach().clone()))

    def preset(m, step):
        if step == 1:
            g = torch.Generator().manual_seed(7 + rank())
            m.fc2.bias.grad = torch.randn(m.fc2.bias.shape, generator=g)

    ours = copy.deepcopy(model)
    dsgraph.replicate(ours)
    add_hooks(ours, seen_ours)
    ref_local, m_local = ddp_local(model)
    add_hooks(m_local, seen_ref)
    g_ours, p_ours = train(dsgraph_dp(ours), ours, steps=3, before_step=preset)
    g_local, p_local = train(ref_local, m_local, steps=3, before_step=preset)
    compare_steps("hooks vs DDP(dsgraph local)", g_ours, g_local, bitwise=True)
    compare("hooks params vs DDP(dsgraph local)", p_ours, p_local, bitwise=True)
    expected = 3 if rank() == 0 else 0
    check("post-accumulate hooks fired once per step", len(seen_ours) == expected == len(seen_ref),
          f"{len(seen_ours)} vs {len(seen_ref)}")
    compare("post-accumulate hooks saw local gradients", dict(enumerate(seen_ours)), dict(enumerate(seen_ref)),
            bitwise=True)


def scenario_mismatch() -> None:
    # the bucket plans differ (another bucket size on rank 1): a clear error on every rank
    model = fresh_model()
    dsgraph.replicate(model)
    mb = BUCKET_MB if rank() == 0 else 4 * BUCKET_MB
    fn = dsgraph_dp(model, bucket_mb=mb)
    try:
        loss_of(fn, batch(0)).backward()
        check("plan mismatch raises", False, "no error")
    except Exception as e:  # torch wraps what the backend raises
        cause = dsgraph.errors.find_cause(e, dsgraph.ReplicaMismatchError)
        check("plan mismatch raises ReplicaMismatchError", cause is not None, f"{type(e).__name__}: {e}"[:800])
        text = str(cause)
        check("the error names the first difference", "line 1" in text and "bucket cap" in text and "rank 1" in text,
              text[:800])
    # models of different shapes: replicate refuses before broadcasting
    torch._dynamo.reset()
    other = MLP(hidden=37 if rank() == 0 else 41)
    try:
        dsgraph.replicate(other)
        check("shape mismatch raises", False, "no error")
    except dsgraph.ReplicaMismatchError as e:
        check("shape mismatch names the parameter", "fc1.weight" in str(e), str(e)[:800])
    # data_parallel=<ProcessGroup>: the collectives run on that group
    torch._dynamo.reset()
    group = dist.new_group([0, 1])
    model = fresh_model()
    dsgraph.replicate(model, process_group=group)
    ref = copy.deepcopy(model)
    ref_ddp = DDP(torch.compile(ref, backend="dsgraph", options={**FX, "pipeline": "lifetimes"}), process_group=group)
    g_ours, _ = train(torch.compile(model, backend="dsgraph", options={**FX, "data_parallel": group}), model, steps=1)
    g_ref, _ = train(ref_ddp, ref, steps=1)
    compare_steps("process group option vs DDP on that group", g_ours, g_ref, bitwise=True)
    other = fresh_model()
    dsgraph.replicate(other, process_group=group)
    torch._dynamo.reset()
    try:
        loss_of(torch.compile(other, backend="dsgraph", options={**FX, "data_parallel": dist.new_group([0, 1])}),
                batch(0)).backward()
        check("process group: another group than replicate's is refused", False, "no error")
    except Exception as e:
        check("process group: another group than replicate's is refused", "other than the one given" in str(e),
              str(e)[:400])

    # a second instance of the model's class: Dynamo runs the first one's compiled backward
    # for it, whose buckets are bound to the first one's slots: a clear error, not a
    # silent reduction of the wrong gradients
    torch._dynamo.reset()
    first, second = fresh_model(), fresh_model()
    dsgraph.replicate(first)
    dsgraph.replicate(second)
    options = {**FX, "data_parallel": True, "bucket_mb": BUCKET_MB}
    loss_of(dsgraph_dp(first), batch(0)).backward()  # dsgraph_dp resets Dynamo first
    try:
        loss_of(torch.compile(second, backend="dsgraph", options=options), batch(1)).backward()
        check("reused data-parallel backward is refused", False, "no error")
    except Exception as e:
        check("reused data-parallel backward is refused", "other parameters than it was compiled for" in str(e),
              f"{type(e).__name__}: {e}"[:400])

    # a rank that dies: the other one gets torch's error from the collective, not a hang
    model = fresh_model()
    dsgraph.replicate(model)
    fn = dsgraph_dp(model)
    loss_of(fn, batch(0)).backward()  # compiles and syncs once on both ranks
    if rank() == 1:
        dump()
        os._exit(0)
    try:
        loss_of(fn, batch(1)).backward()
        check("dead rank surfaces an error", False, "the backward returned")
    except Exception as e:
        check("dead rank surfaces torch's error", "dsgraph" not in type(e).__module__, f"{type(e).__name__}: {e}"[:400])


def scenario_inductor() -> None:
    """Through CPU Inductor: the order of collectives, waits and compute in the generated
    code, no copies of the buckets, and the result against DDP within the fp32 rule."""
    from torch._inductor.utils import run_and_get_code
    from torch.testing import FileCheck

    torch.manual_seed(100 + rank())
    model = nn.Sequential(nn.Linear(13, 29), nn.Tanh(), nn.Linear(29, 11), nn.Tanh(), nn.Linear(11, 5))
    dsgraph.replicate(model)
    ref, m_ref = ddp_eager(model)
    # production order: w3 b3 w2 b2 w1 b1 (slots 0..5); a cap of 209 B makes the buckets
    # [w3] [b3 w2] [b2 w1] [b1] (a bucket closes once it holds at least the cap)
    # with a memory budget too: its post-compile check reads Inductor's plans of these graphs
    fn = torch.compile(model, backend="dsgraph", options={"data_parallel": True, "bucket_mb": 0.0002,
                                                          "memory_budget": "1GiB"})
    x = batch(0)
    _, codes = run_and_get_code(lambda: loss_of(fn, x).backward())
    code = next(c for c in codes if "all_reduce_" in c)
    code = code[code.index("def call(self, args)"):]
    code = code[:code.index("return (") + len("return (")]  # the backward's wrapper code, in run order
    check("four buckets", code.count("all_reduce_.default(") == 4, code)
    try:
        # each bucket issued right after the write of its last slot (no matmul between), before
        # the next layer's matmuls; no wait before the last issue; the waits in order at the end
        (FileCheck()
         .check("mm_into_.default(dsgraph_grad_0").check_not("extern_kernels.mm(").check_not("wait_tensor")
         .check("all_reduce_.default(dsgraph_bucket_0").check("extern_kernels.mm(")
         .check("mm_into_.default(dsgraph_grad_2").check_not("extern_kernels.mm(").check_not("wait_tensor")
         .check("all_reduce_.default(dsgraph_bucket_1").check("extern_kernels.mm(")
         .check("mm_into_.default(dsgraph_grad_4").check_not("extern_kernels.mm(").check_not("wait_tensor")
         .check("all_reduce_.default(dsgraph_bucket_2").check_not("wait_tensor")
         .check("all_reduce_.default(dsgraph_bucket_3")
         .check("wait_tensor.default(dsgraph_bucket_0").check("wait_tensor.default(dsgraph_bucket_1")
         .check("wait_tensor.default(dsgraph_bucket_2").check("wait_tensor.default(dsgraph_bucket_3")
         .check("return (")
         .run(code))
        check("order of collectives, compute and waits", True)
    except RuntimeError as e:
        check("order of collectives, compute and waits", False, f"{e}"[:1500] + "\n" + code)
    # the buckets go to the collectives as the inputs they are: no kernel, cat or copy reads them
    lines = [ln.strip() for ln in code.splitlines() if "dsgraph_bucket_" in ln]
    stray = [ln for ln in lines if not ln.startswith(("torch.ops._c10d_functional.all_reduce_.default(dsgraph_bucket_",
                                                      "torch.ops._c10d_functional.wait_tensor.default(dsgraph_bucket_",
                                                      "assert_size_stride(dsgraph_bucket_", "assert_alignment(dsgraph_bucket_",
                                                      "del dsgraph_bucket_"))
             and "= args" not in ln]
    check("buckets are used only by the collectives", not stray, "\n".join(stray))
    check("no concatenation or split", "aten.cat" not in code and "split" not in code)
    peaks = [r.memory.get("checkpoint_inductor_peak") for r in dsgraph.reports() if r.kind == "joint"]
    check("budget check ran on Inductor's plans", bool(peaks) and all(isinstance(p, int) and p > 0 for p in peaks),
          str(peaks))
    ours = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    loss_of(ref, x).backward()
    compare("inductor grads vs DDP eager", ours, {n: p.grad for n, p in m_ref.named_parameters()}, bitwise=False)


def scenario_lowered() -> None:
    """lower_triton (the default tagged selection) on the data-parallel backward, as FX code
    with Triton's interpreter (the launcher sets TRITON_INTERPRET=1): each bucket's epilogue
    is one generated kernel, and the gradients are bitwise those of the same pipeline
    without lowering and of DDP around the same local graphs (with DDP's bf16 hook for
    compress="bf16"), over synced steps and no_sync micro-batches."""
    from torch.testing import FileCheck

    from dsgraph.report.capture import capture

    model = fresh_model()
    dsgraph.replicate(model)
    for compress in ("none", "bf16"):
        name = f"lowered {compress}"
        plain = copy.deepcopy(model)
        dsgraph.replicate(plain)
        g_plain, p_plain = train(dsgraph_dp(plain, compress=compress), plain, steps=3, micro=2,
                                 no_sync=lambda: dsgraph.no_sync(plain))
        lowered = copy.deepcopy(model)
        dsgraph.replicate(lowered)
        dsgraph.clear_reports()
        with capture() as cap:
            g_low, p_low = train(dsgraph_dp(lowered, compress=compress, lower_triton=True), lowered, steps=3, micro=2,
                                 no_sync=lambda: dsgraph.no_sync(lowered))
        ref_local, m_local = ddp_local(model, hook=bf16_cast_hook if compress == "bf16" else None)
        g_ref, p_ref = train(ref_local, m_local, steps=3, micro=2, no_sync=ref_local.no_sync)
        compare_steps(f"{name} vs the same pipeline without lowering", g_low, g_plain, bitwise=True)
        compare(f"{name} params vs the same pipeline without lowering", p_low, p_plain, bitwise=True)
        compare_steps(f"{name} vs DDP(dsgraph local)" + ("+bf16_compress_hook" if compress == "bf16" else ""),
                      g_low, g_ref, bitwise=True)

        backward = [r for r in dsgraph.reports() if r.kind == "backward"]
        stats = {p.name: p.stats for r in backward for p in r.passes}
        buckets = stats.get("allreduce", {}).get("buckets")
        lowering = stats.get("lower_triton", {})
        check(f"{name}: the allreduce pass emitted the per-bucket epilogue",
              buckets == 3 and stats["allreduce"].get("epilogue") == "bucket", str(stats.get("allreduce")))
        check(f"{name}: one lowered kernel per bucket epilogue, none failed",
              lowering.get("pool_epilogues") == buckets and lowering.get("fallbacks") == 0, str(lowering))
        code = cap.compiles[0].stages["backward"].after.code
        kernel = "torch.ops.dsgraph_triton."
        try:
            checker = FileCheck()
            for k in range(3):
                checker.check(f"bucket_ready_.default(dsgraph_bucket_{k},")
                checker.check(kernel).check(f"(dsgraph_bucket_{k})")
                checker.check_not("aten.mul.Tensor(dsgraph_bucket_").check_not("convert_element_type")
                checker.check(f"dsgraph_issued_{k} = ")
                checker.check("control_deps(" if compress == "none" else "all_reduce_.default(dsg_pw_")
            checker.run(code)
            check(f"{name}: the graph issues each bucket right after its kernel", True)
        except RuntimeError as e:
            check(f"{name}: the graph issues each bucket right after its kernel", False, f"{e}"[:1500] + "\n" + code)
        check(f"{name}: three kernel calls in the backward", code.count(kernel) == 3,
              "\n".join(ln.strip() for ln in code.splitlines() if kernel in ln))


def scenario_lowered_inductor() -> None:
    """The per-bucket epilogues through CPU Inductor (``lower_triton{opaque=1}``: the kernels
    run as opaque calls of Triton's interpreter): in Inductor's code each bucket's kernel
    runs after ``bucket_ready_``, which runs after the bucket's slot writes, and the bucket
    is issued after its kernel; gradients bitwise those of the same compile without
    lowering."""
    from torch._inductor.utils import run_and_get_code
    from torch.testing import FileCheck

    torch.manual_seed(100 + rank())
    model = nn.Sequential(nn.Linear(13, 29), nn.Tanh(), nn.Linear(29, 11), nn.Tanh(), nn.Linear(11, 5))
    dsgraph.replicate(model)
    mb = 0.0002  # buckets [w3] [b3 w2] [b2 w1] [b1], as in scenario_inductor
    for compress in ("none", "bf16"):
        name = f"inductor lowered {compress}"
        plain, lowered = copy.deepcopy(model), copy.deepcopy(model)
        dsgraph.replicate(plain)
        dsgraph.replicate(lowered)
        g_plain, _ = train(torch.compile(plain, backend="dsgraph", options={"data_parallel": True, "bucket_mb": mb,
                                                                         "compress": compress}), plain, steps=2)
        torch._dynamo.reset()
        pipeline = f"lifetimes,grad_pool,allreduce{{bucket_mb={mb},compress={compress}}},lower_triton{{opaque=1}}"
        fn = torch.compile(lowered, backend="dsgraph", options={"data_parallel": True, "pipeline": pipeline})
        x = batch(0)
        _, codes = run_and_get_code(lambda: loss_of(fn, x).backward())
        lowered.zero_grad(set_to_none=True)
        g_low, _ = train(fn, lowered, steps=2)
        torch._dynamo.reset()
        compare_steps(f"{name} vs without lowering", g_low, g_plain, bitwise=True)
        code = next((c for c in codes if "all_reduce_" in c), "")
        code = code[code.index("def call(self, args)"):] if "def call(self, args)" in code else code
        kernel = "torch.ops.dsgraph_triton."
        calls = [ln.strip() for ln in code.splitlines() if kernel in ln and ".default(dsgraph_bucket_" in ln]
        check(f"{name}: one kernel per bucket", len(calls) == 4 and code.count("all_reduce_.default(") == 4,
              "\n".join(ln.strip() for ln in code.splitlines() if kernel in ln or "all_reduce_" in ln))
        writers = ["mm_into_.default(dsgraph_grad_0", "mm_into_.default(dsgraph_grad_2",
                   "mm_into_.default(dsgraph_grad_4", "dsgraph_grad_5"]
        try:
            checker = FileCheck()
            for k, writer in enumerate(writers):
                checker.check(writer).check(f"bucket_ready_.default(dsgraph_bucket_{k}")
                checker.check(kernel).check(f"(dsgraph_bucket_{k})").check("all_reduce_.default(")
            checker.check("wait_tensor").run(code)
            check(f"{name}: slot writes, bucket_ready_, kernel, issue in order", True)
        except RuntimeError as e:
            check(f"{name}: slot writes, bucket_ready_, kernel, issue in order", False, f"{e}"[:1500] + "\n" + code)


def dump() -> None:
    Path(sys.argv[2]).write_text(json.dumps(CHECKS))


def main() -> None:
    scenario = sys.argv[1]
    torch.use_deterministic_algorithms(False)
    # the collectives' timeout: what a test allows for the whole job (ranks compile at
    # different speeds, and a compile-time check waits for the slower one)
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("GROUP_TIMEOUT_S", "120"))))
    try:
        globals()[f"scenario_{scenario}"]()
    except Exception:
        check(f"scenario {scenario} ran to the end", False, traceback.format_exc()[-4000:])
    dump()
    os._exit(0)  # a peer that died leaves the group unusable: no destroy_process_group


if __name__ == "__main__":
    main()
