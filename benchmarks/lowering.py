"""Lowered regions on one GPU: dsgraph's generated kernel against Inductor's kernel for the
same region and against eager's unfused ops, with bytes moved and achieved bandwidth.

    python -m benchmarks.lowering --json $OUT/lowering.json            # H200: every case
    python -m benchmarks.lowering --cases gelu_bwd,bucket_epilogue      # some of them
    python -m benchmarks.lowering --cases layer_norm,rms_norm --sweep    # and every one-tile config alone
    python -m benchmarks.lowering --asm --json asm.json                  # any machine: sm_90 code

Each case is a function of aten ops that forms exactly one region (checked), at sizes where
the region moves at least 256 MB (bytes read + written, each tensor once). Per case:

- ``dsgraph_us``: the region's kernel called as its op (``dsgraph_triton::...``), after
  Triton's autotuner picked a config for these sizes;
- ``dsgraph_inductor_us``: ``torch.compile(fn, backend="dsgraph", options={"pipeline":
  "lower_triton{select=all}"})`` under ``no_grad``: the kernel handed to Inductor as a
  user-defined Triton kernel (the path training graphs take);
- ``inductor_us``: ``torch.compile(fn)`` (Inductor's own fused kernel for the same ops);
- ``eager_us``: ``fn`` run eagerly (one kernel per op).

Times are the median of ``--repeats`` ``triton.testing.do_bench`` medians. Bandwidth is
bytes moved / time, also as a fraction of the copy bandwidth measured in the same run
(``dst.copy_(src)`` of 512 MiB, counting read + write). Before timing, every variant's
outputs are compared with eager (fp32: relative norm error <= 1e-5; bf16 outputs: the bf16
rule against fp64).

Each of the direct op, the dsgraph-through-Inductor call and stock Inductor is also run
``PROFILED_CALLS`` (20) times under ``torch.profiler`` (CPU and CUDA activities), back to back
and without L2 flushes (as the ``--sweep`` CUDA graphs run): ``<path>_kernel_us`` is the device
time of every kernel (memcpy, memset) a call launches, ``<path>_kernels_per_call`` and
``<path>_kernel_names`` say what ran (an extra copy or cast kernel shows), ``<path>_cpu_us``
is a call's CPU time under the profiler, ``<path>_launch_us`` the same calls' wall clock
without it (not waiting for the GPU), ``<path>_kernel_of_copy`` the bandwidth by kernel time
over the copy's own kernel time (``copy_kernel_GBps``). do_bench's per-call figures include
whatever the CPU side of a call adds past the flush kernel before it; these do not.

Without CUDA, ``--dry-run`` (automatic) builds every case at a tiny size on the CPU with
Triton's interpreter, checks the kernels against eager and writes no timings.

``--asm`` (no GPU needed) compiles each case's kernel at full size for sm_90 with every
config the GPU autotuner tries (``dsgraph.lowering.asm``) and reports, per config, the
entry point, vector and scalar global loads and stores in the PTX, integer divisions, SASS
instructions per element and registers: what the code looks like, not how fast it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

WORLD = 8  # the bucket epilogue's 1 / world size


def _gelu_fwd(x):
    xf = x.float()
    return (xf * 0.5 * (1 + torch.erf(xf * 0.7071067811865476))).to(torch.bfloat16)


def _gelu_bwd(x, grad):
    """The recomputed GELU and its derivative times the incoming gradient, as the backward
    graph has it after Inductor's decompositions (bf16 activations, fp32 math)."""
    xf, gf = x.float(), grad.float()
    cdf = (torch.erf(xf * 0.7071067811865476) + 1) * 0.5
    pdf = torch.exp(xf * xf * -0.5) * 0.3989422804014327
    return (gf * (cdf + xf * pdf)).to(torch.bfloat16)


def _layer_norm(x, w, b):
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return ((xf - mean) * rstd * w + b).to(torch.bfloat16), mean, rstd


def _rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(torch.bfloat16)


def _softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _bucket_epilogue(pool, g):
    """Accumulate a bucket's gradients into the pool, then scale by 1/world and cast to
    bf16 for a compressed all-reduce."""
    total = pool + g
    pool.copy_(total)
    return (total * (1.0 / WORLD)).to(torch.bfloat16)


def _bucket_epilogue_eager(pool, g):
    pool.add_(g)
    return (pool * (1.0 / WORLD)).to(torch.bfloat16)


def _bucket_scale_bf16(bucket):
    """The compressed bucket epilogue as the allreduce pass emits it for lower_triton: the
    bucket view scaled by 1/world and cast to bf16 for the wire (the accumulation stays with
    each gradient's producer)."""
    return (bucket * (1.0 / WORLD)).to(torch.bfloat16)


@dataclass
class Case:
    name: str
    fn: Callable
    shapes: list  # per input: (shape, dtype); the full-size shapes
    tiny: list  # the same at a CPU test size
    eager: Callable | None = None  # the unfused eager sequence, when it differs from fn
    mutates: tuple[int, ...] = ()  # inputs fn writes

    def inputs(self, device: str, tiny: bool = False, seed: int = 0) -> list[torch.Tensor]:
        g = torch.Generator(device="cpu").manual_seed(seed)
        out = []
        for shape, dtype in (self.tiny if tiny else self.shapes):
            out.append(torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype))
        return out


BF16, F32 = torch.bfloat16, torch.float32
CASES = [
    # GPT-2-small's MLP activation is 16 x 1024 x 3072: its recomputed GELU backward (gelu_bwd)
    # moves 302 MB; the forward alone would move 201 MB, so it runs at twice the batch
    Case("gelu_fwd", _gelu_fwd, [((32, 1024, 3072), BF16)], [((2, 3, 37), BF16)]),
    Case("gelu_bwd", _gelu_bwd, [((16, 1024, 3072), BF16)] * 2, [((2, 3, 37), BF16)] * 2),
    Case("layer_norm", _layer_norm, [((16, 1024, 4096), BF16), ((4096,), F32), ((4096,), F32)],
         [((2, 3, 37), BF16), ((37,), F32), ((37,), F32)]),
    Case("rms_norm", _rms_norm, [((16, 1024, 4096), BF16), ((4096,), F32)], [((2, 3, 37), BF16), ((37,), F32)]),
    Case("softmax", _softmax, [((16384, 4096), F32)], [((5, 37), F32)]),
    Case("bucket_epilogue", _bucket_epilogue, [((64 * 2**20,), F32)] * 2, [((1001,), F32)] * 2,
         eager=_bucket_epilogue_eager, mutates=(0,)),
    Case("bucket_scale_bf16", _bucket_scale_bf16, [((64 * 2**20,), F32)], [((1001,), F32)]),
]


@dataclass
class Built:
    case: Case
    plan: object
    compiled: object
    binding_index: list  # for each op argument, which input of fn it is
    result: dict = field(default_factory=dict)

    def call(self, inputs):
        return self.compiled.op(*[inputs[i] for i in self.binding_index])


def build(case: Case, device: str, tiny: bool = False) -> Built:
    """Trace the case, check it is one region, compile its kernel."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dsgraph.lowering import kernels
    from dsgraph.passes.lower_triton import plan_lowering

    inputs = case.inputs(device, tiny)
    gm = make_fx(case.fn, tracing_mode="fake")(*inputs)
    plan = plan_lowering(gm, "all")
    if len(plan.regions) != 1 or plan.not_selected:
        raise AssertionError(f"{case.name}: expected one region, got {plan}")
    planned = plan.regions[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = [placeholders.index(n) for n in planned.binding.params]
    if planned.binding.scalars:
        raise AssertionError(f"{case.name}: unexpected scalar arguments")
    return Built(case, plan, kernels.compile_kernel(planned.ir), index)


def full_size_bytes(case: Case) -> int:
    """Bytes the case's region moves at full size (traced on the meta device: no memory)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dsgraph.passes.lower_triton import plan_lowering

    inputs = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in case.shapes]
    gm = make_fx(case.fn, tracing_mode="fake")(*inputs)
    (planned,) = plan_lowering(gm, "all").regions
    return planned.bytes_moved


def _as_list(x):
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _fn_outputs(case: Case, fn, inputs):
    """What fn returns, plus the inputs it writes (in that order)."""
    return _as_list(fn(*inputs)) + [inputs[i] for i in case.mutates]


def _kernel_outputs(built: Built, inputs):
    """The kernel's fresh outputs in fn's return order, plus the inputs it writes."""
    got = _as_list(built.call(inputs)) if built.compiled.op is not None else []
    region = built.plan.regions[0].region
    # the op returns the region's outputs in graph order; fn returns them in its own order
    gm_outputs = region.nodes[0].graph.output_node().args[0]
    gm_outputs = list(gm_outputs) if isinstance(gm_outputs, (tuple, list)) else [gm_outputs]
    by_node = dict(zip(region.outputs, got))
    return [by_node[n] for n in gm_outputs if n in by_node] + [inputs[i] for i in built.case.mutates]


def error(case: Case, got: list, inputs_before: list) -> float:
    """Worst error of ``got`` against eager: fp32 outputs of fp32 math, relative norm error;
    everything else, RMSE over (2 * eager's RMSE + 1e-3) against fp64 (<= 1 passes)."""
    want = _fn_outputs(case, case.eager or case.fn, [t.clone() for t in inputs_before])
    low = any(t.dtype in (torch.bfloat16, torch.float16) for t in inputs_before + want)
    ref = None
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if not low:
            err = ((g.double() - w.double()).norm() / w.double().norm()).item() / 1e-5
        else:
            if ref is None:
                ref = _fn_outputs(case, case.fn, [t.clone().double() for t in inputs_before])
            r = ref[i].double()
            rmse = lambda a: (a.double() - r).pow(2).mean().sqrt().item()  # noqa: E731
            err = rmse(g) / (2 * rmse(w) + 1e-3)
        worst = max(worst, err)
    return worst


def check(built: Built, device: str, tiny: bool) -> float:
    """The kernel against eager on fresh inputs: the largest error in units of the allowed
    error (<= 1 passes)."""
    inputs = built.case.inputs(device, tiny, seed=1)
    before = [t.clone() for t in inputs]
    got = _kernel_outputs(built, inputs)
    return error(built.case, got, before)


def _bench(fn, repeats: int) -> float:
    from triton.testing import do_bench

    return statistics.median(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(repeats)) * 1e3


# ---- device time from the profiler ----------------------------------------------------------
# do_bench times each call between two CUDA events with L2 flushed before it: a call whose CPU
# side (Dynamo's guards, the AOT wrapper, a Python launcher) outlasts the flush kernel shows
# its CPU time, and a path that launches more than its kernel shows the sum. The profiler
# separates them: the device time of each kernel (CUPTI), how many kernels a call launches,
# which ones, and the CPU time of a call.

CALL_MARKER = "dsgraph_bench_call"  # record_function around each profiled call
PROFILED_CALLS = 20


def _is_device_event(evt) -> bool:
    """A kernel, memcpy or memset on the GPU (not a CPU op, not the GPU side of a
    record_function annotation)."""
    from torch.autograd import DeviceType

    device_type = getattr(evt, "device_type", DeviceType.CPU)
    if device_type == DeviceType.CPU:
        return False
    return not getattr(evt, "is_user_annotation", False) and evt.name != CALL_MARKER


def event_device_us(evt) -> float:
    """A device event's own device time in us. torch >= 2.4 calls it ``self_device_time_total``
    (``self_cuda_time_total`` before, deprecated since); both are the event's time range for a
    device-side event, which is the fallback (also where the property gives 0: it does when
    the profile was made without a ``use_device``)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, name, None)
        if value:
            return float(value)
    return float(evt.time_range.elapsed_us())


def kernel_profile(events, calls: int, marker: str = CALL_MARKER) -> dict:
    """What ``calls`` profiled calls ran, per call, from the profiler's events
    (``prof.events()``): ``kernel_us`` the summed device time of every kernel (and memcpy /
    memset) over calls, ``kernels_per_call``, ``kernel_names`` (each kernel as often as a
    call launches it, in order of first launch, the longest first among ties), and
    ``cpu_us`` the median CPU time of one call (its ``marker`` span: profiler overhead
    included)."""
    from torch.autograd import DeviceType

    device = [e for e in events if _is_device_event(e)]
    spans = [e.time_range.elapsed_us() for e in events
             if e.name == marker and getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    count: dict[str, int] = {}
    first: dict[str, float] = {}
    time_of: dict[str, float] = {}
    for e in device:
        count[e.name] = count.get(e.name, 0) + 1
        first[e.name] = min(first.get(e.name, float("inf")), e.time_range.start)
        time_of[e.name] = time_of.get(e.name, 0.0) + event_device_us(e)
    names = []
    for name in sorted(count, key=lambda k: (first[k], -time_of[k])):
        names += [name] * max(1, round(count[name] / calls))
    total = sum(time_of.values())
    return {"kernel_us": round(total / calls, 2), "kernels_per_call": round(len(device) / calls, 2),
            "kernel_names": names, "kernel_us_by_name": {k: round(v / calls, 2) for k, v in time_of.items()},
            "cpu_us": round(statistics.median(spans), 1) if spans else None, "calls": calls,
            "profiled_calls": len(spans)}


def profile_calls(fn, calls: int = PROFILED_CALLS, device: str = "cuda") -> dict:
    """``kernel_profile`` of ``calls`` calls of ``fn`` under ``torch.profiler`` (CPU and
    CUDA activities), after one warm-up call; plus ``launch_us``: the wall clock of the same
    number of calls without the profiler, not waiting for the GPU (the CPU cost of a call
    while the GPU keeps up; a call bound by its CPU side shows it here). ``device="cpu"``:
    CPU activity only (the unit test of the profiler API on a machine without CUDA)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    launch_us = (time.perf_counter() - start) / calls * 1e6
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            with record_function(CALL_MARKER):
                fn()
        sync()
    return {**kernel_profile(prof.events(), calls), "launch_us": round(launch_us, 1)}


def copy_bandwidth(repeats: int) -> tuple[float, float]:
    """Bytes per second of ``dst.copy_(src)`` over 512 MiB, counting read plus write: timed
    by ``do_bench`` (what the ``*_of_copy`` figures divide by) and by its kernel's device time
    in the profiler (``*_kernel_of_copy``)."""
    src = torch.randn(128 * 2**20, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    us = _bench(lambda: dst.copy_(src), repeats)
    kernel_us = profile_calls(lambda: dst.copy_(src))["kernel_us"]
    return nbytes / (us * 1e-6), nbytes / (kernel_us * 1e-6)


def lowering_stats() -> dict:
    """The lower_triton pass's stats of the latest compiled graph (lowered regions, user
    kernels handed to Inductor, a refusal)."""
    import dsgraph

    stats = [p.stats for r in dsgraph.reports() for p in r.passes if p.name == "lower_triton"]
    keep = ("lowered", "fallbacks", "user_kernels", "refused")
    return {k: v for k, v in stats[-1].items() if k in keep} if stats else {}


def chosen(built: Built, inputs: list) -> tuple[str, object]:
    """The entry point the launcher picks for these inputs and its autotuned kernel."""
    from dsgraph.lowering import launch_layout

    ir = built.compiled.ir
    tensors = [torch.empty_strided(inputs[i].shape, inputs[i].stride(), dtype=inputs[i].dtype, device="meta")
               for i in built.binding_index]  # the same layouts, no memory
    full, outs = launch_layout.allocate_outputs(ir, tensors)
    plan = launch_layout.launch_plan(ir, tensors, outs, full, [])
    return plan.form, built.compiled.tuner(plan.form, plan.block_n)


PROFILED = ("dsgraph", "dsgraph_inductor", "inductor")  # the paths profiled for device time


def measure(built: Built, repeats: int, copy_bw: float, copy_kernel_bw: float | None = None) -> dict:
    case = built.case
    planned = built.plan.regions[0]
    inputs = case.inputs("cuda")
    out = {"case": case.name, "kernel": built.compiled.name,
           "shapes": [[list(s), str(d).replace("torch.", "")] for s, d in case.shapes],
           "bytes_moved": planned.bytes_moved, "bytes_read": planned.bytes_read,
           "bytes_written": planned.bytes_written}
    # correctness of every variant on fresh inputs before timing
    out["dsgraph_error"] = check(built, "cuda", tiny=False)
    inductor = torch.compile(case.fn)
    dsgraph_inductor = torch.compile(case.fn, backend="dsgraph",
                                     options={"pipeline": "lower_triton{select=all}"})
    for key, fn in (("inductor_error", inductor), ("dsgraph_inductor_error", dsgraph_inductor)):
        fresh = case.inputs("cuda", seed=2)
        before = [t.clone() for t in fresh]
        with torch.no_grad():
            out[key] = error(case, _fn_outputs(case, fn, fresh), before)
    out["dsgraph_inductor_lowering"] = lowering_stats()  # did the kernel reach Inductor as a user kernel?
    variants = {
        "dsgraph_us": lambda: built.call(inputs),
        "dsgraph_inductor_us": lambda: dsgraph_inductor(*inputs),
        "inductor_us": lambda: inductor(*inputs),
        "eager_us": lambda: (case.eager or case.fn)(*inputs),
    }
    with torch.no_grad():
        for key, fn in variants.items():
            out[key] = _bench(fn, repeats)
        for path in PROFILED:
            prof = profile_calls(variants[f"{path}_us"])
            for k, v in prof.items():
                if k != "calls":
                    out[f"{path}_{k}"] = v
    out["form"], tuner = chosen(built, inputs)
    best = getattr(tuner, "best_config", None)
    out["config"] = None if best is None else {**best.kwargs, "num_warps": best.num_warps}
    for key in ("dsgraph_us", "dsgraph_inductor_us", "inductor_us", "eager_us"):
        gbps = planned.bytes_moved / (out[key] * 1e-6) / 1e9
        out[key.replace("_us", "_GBps")] = round(gbps, 1)
        out[key.replace("_us", "_of_copy")] = round(gbps * 1e9 / copy_bw, 3)
    out["dsgraph_inductor_config"] = inductor_chosen_config(built.compiled.jit(out["form"]).__name__)
    copy_kernel_bw = copy_kernel_bw or copy_bw
    for path in PROFILED:
        us = out[f"{path}_kernel_us"]
        gbps = planned.bytes_moved / (us * 1e-6) / 1e9 if us else None  # 0: the profiler saw no kernel
        out[f"{path}_kernel_GBps"] = None if gbps is None else round(gbps, 1)
        out[f"{path}_kernel_of_copy"] = None if gbps is None else round(gbps * 1e9 / copy_kernel_bw, 3)
    out["dsgraph_vs_inductor"] = round(out["inductor_us"] / out["dsgraph_us"], 3)
    out["dsgraph_vs_eager"] = round(out["eager_us"] / out["dsgraph_us"], 3)
    if out["dsgraph_inductor_kernel_us"]:
        out["dsgraph_inductor_vs_inductor_kernel"] = round(out["inductor_kernel_us"]
                                                          / out["dsgraph_inductor_kernel_us"], 3)
    return out


def inductor_chosen_config(kernel_name: str) -> dict | None:
    """The config Inductor's autotuner kept for the user-defined kernel ``kernel_name`` (the
    dsgraph-through-Inductor path autotunes the kernel's ``triton.autotune`` configs itself, not
    through the direct op's tuner, so its pick can differ from ``config``). Best effort: the
    ``CachingAutotuner`` objects alive in the process whose function has that name and which
    are down to one launcher; None when there is none or more than one distinct pick."""
    import gc

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return None
    picks = []
    for obj in gc.get_objects():
        if not issubclass(type(obj), CachingAutotuner):  # type(): isinstance reads __class__, which some warn on
            continue
        fn = getattr(obj, "fn", None)
        name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", None)
        launchers = getattr(obj, "launchers", None) or []
        if name == kernel_name and len(launchers) == 1:
            config = getattr(launchers[0], "config", None)
            if config is not None:
                pick = {**config.kwargs, "num_warps": config.num_warps}
                if pick not in picks:
                    picks.append(pick)
    return picks[0] if len(picks) == 1 else None


# do_bench_cudagraph's rep: a graph of rep / (kernel time) launches (~300 for a 66 us kernel),
# replayed 10 times, the median of those. 100 ms made each config take over 1 s (10 replays of
# 100 ms, plus capture) per repeat: by that estimate ~23 s of layer_norm's 47.5 s on the H200
# (7 configs, 3 repeats; not measured apart); 20 ms is do_bench_cudagraph's own default.
SWEEP_REP_MS = 20


def tile_sweep(built: Built, repeats: int, copy_bw: float, device: str = "cuda", tiny: bool = False,
               bench=None) -> list[dict]:
    """A one-tile reduction at full size: every GPU config of its tile width timed on its own
    (the kernel launched directly and replayed in a CUDA graph: no launcher cost), with its
    outputs checked against eager. What the autotuner chose between, config by config.
    (``device``, ``tiny``, ``bench``: the CPU test runs it on the interpreter, untimed.)"""
    import triton

    from dsgraph.lowering import kernels, launch_layout

    if bench is None:
        from triton.testing import do_bench_cudagraph as bench
    case, compiled = built.case, built.compiled
    ir = compiled.ir
    planned = built.plan.regions[0]
    inputs = case.inputs(device, tiny, seed=3)
    before = [t.clone() for t in inputs]
    tensors = [inputs[i] for i in built.binding_index]
    full, outs = launch_layout.allocate_outputs(ir, tensors)
    plan = launch_layout.launch_plan(ir, tensors, outs, full, [])
    if plan.form != "tile" or any(s.param is not None for s in ir.stores):
        return []
    region = planned.region
    gm_outputs = region.nodes[0].graph.output_node().args[0]
    gm_outputs = list(gm_outputs) if isinstance(gm_outputs, (tuple, list)) else [gm_outputs]
    by_node = dict(zip(region.outputs, outs))
    fn = compiled.jit("tile")
    rows = []
    for block_m, tiles, warps in kernels.tile_configs(plan.block_n):
        grid = (triton.cdiv(plan.m, block_m * tiles),)

        def run():
            fn[grid](*plan.args, BLOCK_M=block_m, ROWS=tiles, BLOCK_N=plan.block_n, num_warps=warps)

        run()
        if device == "cuda":
            torch.cuda.synchronize()
        err = error(case, [by_node[n] for n in gm_outputs if n in by_node], before)
        us = statistics.median(bench(run, rep=SWEEP_REP_MS, return_mode="median") for _ in range(repeats)) * 1e3
        gbps = planned.bytes_moved / (us * 1e-6) / 1e9
        rows.append({"config": [block_m, tiles, warps], "us": round(us, 1), "GBps": round(gbps, 1),
                     "of_copy": round(gbps * 1e9 / copy_bw, 3), "error": err})
        print(f"  {case.name} tile (BLOCK_M, ROWS, warps) = {(block_m, tiles, warps)}: {us:.1f} us, "
              f"{gbps * 1e9 / copy_bw:.2f} of copy, error {err:.3f} of allowed", flush=True)
    return rows


def _as_tile(config: dict | None) -> list | None:
    if not config or "ROWS" not in config:
        return None
    return [config["BLOCK_M"], config["ROWS"], config["num_warps"]]


def sweep_best(row: dict) -> dict:
    """The sweep's fastest config, and whether the direct op's autotuner (``config``) and
    Inductor's autotuner on the through-Inductor path (``dsgraph_inductor_config``, when it
    could be read) picked it."""
    rows = row.get("tile_sweep") or []
    if not rows:
        return {}
    best = min(rows, key=lambda r: r["us"])
    out = {"sweep_best_config": best["config"], "sweep_best_us": best["us"],
           "config_is_sweep_best": _as_tile(row.get("config")) == best["config"]}
    chosen_by_inductor = _as_tile(row.get("dsgraph_inductor_config"))
    out["dsgraph_inductor_config_is_sweep_best"] = (None if chosen_by_inductor is None
                                                    else chosen_by_inductor == best["config"])
    return out


def table(rows: list[dict]) -> str:
    """do_bench per call, then per profiled path: kernel device time / kernels per call /
    CPU us per call (profiled) / fraction of copy by kernel time."""
    head = ("case", "MB", "dsgraph us", "via Inductor us", "Inductor us", "eager us", "dsgraph/copy", "vs Inductor",
            "dsgraph kernel", "via Inductor kernel", "Inductor kernel")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]

    def kernel(r, path):
        if f"{path}_kernel_us" not in r:
            return "-"
        return (f"{r[f'{path}_kernel_us']:.1f} us x{r[f'{path}_kernels_per_call']:g}, cpu {r[f'{path}_cpu_us']} us, "
                f"{r[f'{path}_kernel_of_copy']:.2f}")

    for r in rows:
        lines.append(" | ".join([r["case"], f"{r['bytes_moved'] / 1e6:.0f}", f"{r['dsgraph_us']:.1f}",
                                 f"{r['dsgraph_inductor_us']:.1f}", f"{r['inductor_us']:.1f}",
                                 f"{r['eager_us']:.1f}", f"{r['dsgraph_of_copy']:.2f}",
                                 f"{r['dsgraph_vs_inductor']:.2f}x"] + [kernel(r, p) for p in PROFILED]))
    return "\n".join(lines)


def asm_rows(cases: list[Case]) -> list[dict]:
    """Per case and GPU config: the sm_90 code of the kernel the launcher picks at full size."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dsgraph.lowering import asm, kernels, launch_layout
    from dsgraph.passes.lower_triton import plan_lowering

    rows = []
    for case in cases:
        inputs = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in case.shapes]
        gm = make_fx(case.fn, tracing_mode="fake")(*inputs)
        (planned,) = plan_lowering(gm, "all").regions
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        tensors = [inputs[placeholders.index(n)] for n in planned.binding.params]
        full, outs = launch_layout.allocate_outputs(planned.ir, tensors)
        plan = launch_layout.launch_plan(planned.ir, tensors, outs, full, [])
        if plan.form == "tile":
            configs = kernels.tile_configs(plan.block_n)  # (BLOCK_M, ROWS, num_warps)
        else:
            configs = kernels.GPU_CONFIGS["flat" if plan.form == "flat" else planned.ir.kind]
        for config in configs:
            k = asm.compile_for_cuda(planned.ir, tensors, config=config)
            rows.append({"case": case.name, "kernel": k.name, **k.summary()})
            print(json.dumps(rows[-1]))
    return rows


def asm_table(rows: list[dict]) -> str:
    head = ("case", "form", "config", "loads vector/scalar (SASS LDG)", "stores vector/scalar", "int div",
            "SASS per element", "registers", "spills", "programs/SM", "KB in flight/SM")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        kb = "-" if not r.get("in_flight_per_sm") else f"{r['in_flight_per_sm'] / 1024:.0f}"
        lines.append(" | ".join([r["case"], r["form"], str(tuple(r["config"])),
                                 f"{r['vector_loads']}/{r['scalar_loads']} ({r['sass_loads']})",
                                 f"{r['vector_stores']}/{r['scalar_stores']}",
                                 str(r["int_divisions"]), f"{r['per_element']:.1f}", str(r["registers"]),
                                 str(r["spills"]), str(r["programs_per_sm"]), kb]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--repeats", type=int, default=5, help="do_bench runs per variant (median of medians)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, Triton's interpreter, no timing")
    parser.add_argument("--asm", action="store_true", help="no GPU needed: the sm_90 code of each case's kernel")
    parser.add_argument("--sweep", action="store_true",
                        help="GPU: also time every one-tile config of the reductions on its own (CUDA graph)")
    args = parser.parse_args(argv)
    if args.asm:
        import triton

        wanted = [c for c in CASES if c.name in args.cases.split(",")]
        rows = asm_rows(wanted)
        print(asm_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"triton": triton.__version__, "arch": "sm_90", "rows": rows}, f, indent=1)
        return 0
    dry = args.dry_run or not torch.cuda.is_available()
    if dry:
        import triton

        triton.knobs.runtime.interpret = True  # before any kernel is made
    wanted = args.cases.split(",")
    unknown = sorted(set(wanted) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {[c.name for c in CASES]}")
    import triton

    result = {"torch": torch.__version__, "triton": triton.__version__, "dry_run": dry, "cases": []}
    if dry:
        for case in (c for c in CASES if c.name in wanted):
            built = build(case, "cpu", tiny=True)
            result["cases"].append({"case": case.name, "kernel": built.compiled.name,
                                    "bytes_moved_tiny": built.plan.regions[0].bytes_moved,
                                    "error_vs_allowed": check(built, "cpu", tiny=True)})
            print(f"{case.name}: {built.compiled.name}, error {result['cases'][-1]['error_vs_allowed']:.3f} of allowed")
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        result["device"] = torch.cuda.get_device_name()
        copy_bw, copy_kernel_bw = copy_bandwidth(args.repeats)
        result["copy_GBps"] = round(copy_bw / 1e9, 1)
        result["copy_kernel_GBps"] = round(copy_kernel_bw / 1e9, 1)
        print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write; {copy_kernel_bw / 1e9:.0f} by its kernel's "
              f"device time)")
        start = time.perf_counter()
        for case in (c for c in CASES if c.name in wanted):
            case_start = time.perf_counter()
            built = build(case, "cuda")
            row = measure(built, args.repeats, copy_bw, copy_kernel_bw)
            if args.sweep:
                row["tile_sweep"] = tile_sweep(built, args.repeats, copy_bw)
                row.update(sweep_best(row))
            row["seconds"] = round(time.perf_counter() - case_start, 1)  # compiles and autotuning included
            result["cases"].append(row)
            result["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)
            if args.json:  # after every case: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
        print(table(result["cases"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = [c["case"] for c in result["cases"]
           if max([c.get(k, 0) for k in ("error_vs_allowed", "dsgraph_error", "dsgraph_inductor_error")]
                  + [t["error"] for t in c.get("tile_sweep", [])]) > 1]
    if bad:
        print(f"outputs differ from eager beyond the rule: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
