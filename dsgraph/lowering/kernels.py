"""Region kernels as torch ops: compiled once per signature, launched through ``wrap_triton``.

``compile_kernel(ir)`` writes the kernel's source for this process's target (GPU or Triton's
interpreter) to a file (Triton reads kernels' source), imports it, and registers a
``torch.library.triton_op`` ``dsgraph_triton::<kernel name>`` whose implementation
launches it through ``wrap_triton``, with a fake implementation that gives the outputs'
shapes, dtypes and strides. FX execution calls the op; Inductor sees the Triton kernel.
Each launch picks one of the module's entry points (``launch_layout.launch_plan``: flat pointwise,
one-tile reduction, or the general kernel) and runs it through a small ``triton.autotune``
over block sizes and warps. The cache key is the kernel's signature (ops, constants,
dtypes, broadcast pattern, rank), never the sizes::

    kernel = compile_kernel(ir)           # the same object for every region with this signature
    out0, out1 = kernel.op(x, w, b)       # torch.ops.dsgraph_triton.dsg_red_1a2b3c4d5e6f
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import tempfile
import time
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .codegen import FORMS, kernel_name, render
from .kernel_ir import KernelIR
from .launch_layout import allocate_outputs, launch_plan

NAMESPACE = "dsgraph_triton"


class DsgraphLoweringWarning(UserWarning):
    """A region was left to Inductor: its kernel failed to compile or to match eager."""


class KernelCompileError(RuntimeError):
    """Triton could not compile (or run) a region's kernel."""


# Autotuning. On the GPU the autotuner times each config for every new (M, N); under
# TRITON_INTERPRET there is nothing to time, so two small tiles (which also make the CPU
# tests cross block edges and loop over columns) are tried with a wall clock.
# flat pointwise: (BLOCK, num_warps); 8 or 16 elements per thread (16-byte vectors for
# 2-byte types); Inductor's own pointwise configs for these sizes are XBLOCK 1024 with 4
# warps and 512 with 8.
# general pointwise and reductions: (BLOCK_M, BLOCK_N, num_warps).
GPU_CONFIGS = {
    "flat": [(1024, 4), (2048, 4), (4096, 8)],
    "pointwise": [(1, 1024, 4), (1, 4096, 8), (8, 128, 4), (32, 32, 4), (128, 8, 4)],
    "reduction": [(1, 1024, 4), (1, 4096, 8), (1, 4096, 16), (4, 256, 4), (16, 64, 4), (64, 16, 4)],
}
# one-tile reductions: BLOCK_N = next_power_of_2(N) (from the launcher), and per config
# (elements per tile, num_warps, tiles per program) -> BLOCK_M = max(1, elements // BLOCK_N)
# rows per tile and ROWS tiles per program, one after the other. What a config trades is how
# many bytes of rows an SM has in flight (a one-tile reduction waits for its whole tile
# before its first reduction): registers per SM over registers per row. A thread holds its
# columns of every input, a layer norm's fp32 w and b as well as the row: with one row per
# tile, about 4 registers per element of x (63 at 8 warps for N = 4096: 4 programs, 32 KB of
# bf16 x per SM); inputs the same for every row (``Load.cols_only``) are loaded once per
# program and shared by the tile's rows, so 2 or 4 rows per tile hold 48 or 64 KB
# (rms_norm's 48 KB per SM ran at 0.89 of the copy bandwidth on the H200, layer_norm's 32 KB
# at 0.71, softmax's 64 at 0.98). ROWS > 1 loads the next tile while the current one
# computes: fewer bytes per SM (its registers), but in flight all along. For N = 4096: one
# row per tile with 4, 8 or 16 warps (Inductor's reduction kernels for 4096 columns: one
# row, 16 warps), 2 or 4 rows with 8 warps, and with 8 warps 8 tiles of one row or 4 of two
# per program. sm_90 code of each: ``python -m benchmarks.lowering --asm``.
GPU_TILE_CONFIGS = [(1024, 4, 1), (2048, 8, 1), (4096, 8, 1), (4096, 16, 1), (8192, 8, 1), (16384, 8, 1),
                    (4096, 8, 8), (8192, 8, 4)]
# MAX_TILE_N (launch_layout): the widest row a one-tile reduction holds in registers
INTERPRETER_CONFIGS = {
    "flat": [(16, 1), (32, 1)],
    "pointwise": [(2, 16, 1), (4, 8, 1)],
    "reduction": [(2, 16, 1), (1, 8, 1)],
    "tile": [(2, 2, 1), (1, 3, 1)],  # (BLOCK_M, ROWS, num_warps)
}


def tile_configs(block_n: int) -> list[tuple[int, int, int]]:
    """The GPU configs of a one-tile reduction of this BLOCK_N: (BLOCK_M, ROWS, num_warps)."""
    table = []
    for elements, warps, rows in GPU_TILE_CONFIGS:
        config = (max(1, elements // block_n), rows, warps)
        if config not in table:
            table.append(config)
    return table


def interpreting() -> bool:
    """Does Triton run kernels on the CPU (TRITON_INTERPRET=1, read by Triton itself)?"""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "runtime"):
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # Triton releases without knobs


def kernel_dir() -> str:
    """Where kernel sources are written (Triton needs a file to read them back)."""
    path = os.path.join(tempfile.gettempdir(), f"dsgraph_triton_{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(path, exist_ok=True)
    return path


def _wall_clock_bench(fn: Callable[[], Any], quantiles=None, **_: Any):
    start = time.perf_counter()
    fn()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def target() -> str:
    """What generated kernels are compiled for in this process: "interpreter" or "gpu"
    (codegen's source differs between the two: see ``codegen.render``)."""
    return "interpreter" if interpreting() else "gpu"


@dataclass
class CompiledKernel:
    ir: KernelIR
    source: str
    target: str  # "gpu" or "interpreter": what the source was written for
    module: Any  # the imported source: one @triton.jit function per form
    op: Any  # torch.ops.dsgraph_triton.<name>.default
    tuners: dict = field(default_factory=dict)  # (form, tile BLOCK_N or None) -> autotuned kernel
    checked: dict = field(default_factory=dict)  # input layouts checked against eager -> error
    last: tuple | None = None  # (form, autotuned kernel) of the latest launch (benchmarks)

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def forms(self) -> list[str]:
        return list(FORMS[self.ir.kind])

    def jit(self, form: str = "general"):
        """The bare @triton.jit function of one entry point."""
        return getattr(self.module, kernel_name(self.ir, form))

    def configs(self, form: str = "general", block_n: int | None = None) -> list:
        """The autotuner's configs for a form (a one-tile reduction's depend on its BLOCK_N)."""
        import triton

        interp = self.target == "interpreter"
        if form == "tile":
            table = INTERPRETER_CONFIGS["tile"] if interp else tile_configs(block_n)
            configs = [triton.Config({"BLOCK_M": m, "ROWS": rows}, num_warps=w) for m, rows, w in table]
        elif form == "flat":
            table = (INTERPRETER_CONFIGS if interp else GPU_CONFIGS)["flat"]
            configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in table]
        else:
            table = (INTERPRETER_CONFIGS if interp else GPU_CONFIGS)[self.ir.kind]
            configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w) for m, n, w in table]
        if any(s.param is not None for s in self.ir.stores):
            # a kernel that reads and writes a tensor (slot += g) must not run twice for timing
            configs = configs[:1]
        return configs

    def tuner(self, form: str = "general", block_n: int | None = None):
        """The autotuned kernel of one form (one per tile width for one-tile reductions),
        keyed on (M, N): made at its first launch."""
        import triton

        key = (form, block_n)
        if key not in self.tuners:
            configs = self.configs(form, block_n)
            kwargs = {"do_bench": _wall_clock_bench} if self.target == "interpreter" and len(configs) > 1 else {}
            sizes = ["NUMEL"] if form == "flat" else ["M", "N"]
            self.tuners[key] = triton.autotune(configs=configs, key=sizes, **kwargs)(self.jit(form))
        return self.tuners[key]


# (target, signature) -> kernel: a process that runs both the interpreter and the GPU (the
# test suite on a GPU machine) keeps the two kernels apart
_CACHE: dict[tuple[str, str], CompiledKernel] = {}
_BY_OP: dict[object, CompiledKernel] = {}  # its op (OpOverload) -> kernel


def compiled_for_op(target) -> CompiledKernel | None:
    """The kernel behind a ``dsgraph_triton`` op of this process, or None for any other target."""
    return _BY_OP.get(target)


def cache_info() -> dict[str, str]:
    """Signature hash -> kernel name of every kernel compiled in this process."""
    return {hashlib.sha256(sig.encode()).hexdigest()[:12]: k.name for (_, sig), k in _CACHE.items()}


def source_path(name: str, target: str) -> str:
    """Where a kernel's source is written (one file per target: the sources differ)."""
    return os.path.join(kernel_dir(), f"{name}{'_interpreted' if target == 'interpreter' else ''}.py")


def _load_module(name: str, target: str, source: str):
    path = source_path(name, target)
    if not os.path.exists(path) or open(path).read() != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: another process may be writing the same kernel
    module_name = f"dsgraph_triton_kernels.{os.path.basename(path)[:-3]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def compile_kernel(ir: KernelIR, fail: bool = False) -> CompiledKernel:
    """The kernel and op for ``ir`` (cached by signature). ``fail``: raise as a Triton
    compile failure would (the failure-injection hook of the lowering pass's tests)."""
    if fail:
        raise KernelCompileError(f"{ir.name}: injected compile failure (fail_regions)")
    where = target()
    key = (where, ir.signature())
    if key in _CACHE:
        return _CACHE[key]
    source = render(ir, where)
    try:
        module = _load_module(ir.name, where, source)
        for form in FORMS[ir.kind]:
            getattr(module, kernel_name(ir, form))
    except Exception as e:  # a syntax error in generated source is a compile failure
        raise KernelCompileError(f"{ir.name}: {type(e).__name__}: {e}") from e
    compiled = CompiledKernel(ir, source, where, module, None)
    compiled.op = _register_op(compiled)
    _CACHE[key] = compiled
    _BY_OP[compiled.op] = compiled
    return compiled


# ---- launching (a call's arguments: launch_layout.launch_plan) ----------------------------

def tile_config(config: tuple) -> tuple:
    """A one-tile config as (BLOCK_M, ROWS, num_warps); (BLOCK_M, num_warps) is one tile per
    program."""
    return (config[0], 1, config[1]) if len(config) == 2 else tuple(config)


def check_configs(compiled: CompiledKernel, form: str) -> list[tuple]:
    """The configs ``check.check_region`` runs a form with, as ``launch`` takes them (block
    sizes, then num_warps). Not the autotuner: the check's sample (37 columns, leading dims
    of 3) has other sizes than the graph's, so its timings are never used, and the kernels
    the autotuner compiles for it (a one-tile reduction's BLOCK_N follows the row width, and
    Triton specializes on divisibility by 16) are never launched again; on the H200 that
    was most of the lowering pass's 47 to 61 s on GPT-2-small's backward (session 9). What
    the configs vary is the indexing, so each path is run once: the first of a form, except
    for general reductions the narrowest tile, so that the sample's rows run the loops, and
    for one-tile reductions two tiles of one row per program (the next tile's loads) and
    one tile of more rows than the sample has (the row mask)."""
    interp = compiled.target == "interpreter"
    if form == "tile":
        return list(INTERPRETER_CONFIGS["tile"]) if interp else [(1, 2, GPU_TILE_CONFIGS[0][1]),
                                                                 (4, 1, GPU_TILE_CONFIGS[0][1])]
    table = (INTERPRETER_CONFIGS if interp else GPU_CONFIGS)["flat" if form == "flat" else compiled.ir.kind]
    if compiled.ir.kind == "reduction" and form != "flat":
        return [min(table, key=lambda c: c[1])]
    return [table[0]]


def launch(compiled: CompiledKernel, tensors: list[torch.Tensor], scalars: list,
           config: tuple | None = None, form: str | None = None) -> list[torch.Tensor]:
    """Run the kernel; returns the fresh outputs (tensors written in place are not returned).
    ``form``: that entry point instead of the launcher's choice; ``config``: instead of the
    autotuner's choice (tests, benchmarks): flat (BLOCK, num_warps), tile (BLOCK_M, ROWS,
    num_warps) or (BLOCK_M, num_warps) for one tile per program, general (BLOCK_M, BLOCK_N,
    num_warps)."""
    import triton
    from torch.library import wrap_triton

    ir = compiled.ir
    full, outs = allocate_outputs(ir, tensors)
    plan = launch_plan(ir, tensors, outs, full, scalars, form)
    if not plan.empty:
        m, n = plan.m, plan.n
        if plan.form == "flat":
            def grid(meta):
                return (triton.cdiv(n, meta["BLOCK"]),)
        elif ir.kind == "pointwise":
            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        elif plan.form == "tile":
            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"] * meta["ROWS"]),)
        else:
            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]),)
        extra = {"BLOCK_N": plan.block_n} if plan.form == "tile" else {}
        if config is None:
            kernel = compiled.tuner(plan.form, plan.block_n)
            compiled.last = (plan.form, kernel)
            wrap_triton(kernel)[grid](*plan.args, **extra)
        else:
            *blocks, warps = tile_config(config) if plan.form == "tile" else config
            names = {"flat": ["BLOCK"], "tile": ["BLOCK_M", "ROWS"], "general": ["BLOCK_M", "BLOCK_N"]}[plan.form]
            compiled.jit(plan.form)[grid](*plan.args, **dict(zip(names, blocks)), **extra, num_warps=warps)
    return [o for o, s in zip(outs, ir.stores) if s.param is None]


# ---- the torch op -------------------------------------------------------------------------

def _signature(ir: KernelIR) -> inspect.Signature:
    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
              for i in range(len(ir.params))]
    params += [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int)
               for i in range(ir.scalars)]
    fresh = sum(1 for s in ir.stores if s.param is None)
    if fresh == 0:
        ret: Any = None
    elif fresh == 1:
        ret = torch.Tensor
    else:
        ret = typing.Tuple[tuple([torch.Tensor] * fresh)]  # noqa: UP006 (infer_schema reads typing.Tuple)
    return inspect.Signature(params, return_annotation=ret)


def _register_op(compiled: CompiledKernel):
    ir = compiled.ir
    n_tensors = len(ir.params)
    mutated = [f"x{i}" for i, p in enumerate(ir.params) if p.mutated]
    fresh = sum(1 for s in ir.stores if s.param is None)

    def result(outs):
        if fresh == 0:
            return None
        return outs[0] if fresh == 1 else tuple(outs)

    def impl(*args):
        return result(launch(compiled, list(args[:n_tensors]), list(args[n_tensors:])))

    def fake(*args):
        _, outs = allocate_outputs(ir, list(args[:n_tensors]))
        return result([o for o, s in zip(outs, ir.stores) if s.param is None])

    signature = _signature(ir)
    impl.__signature__ = signature  # triton_op infers the op's schema from it
    impl.__name__ = ir.name
    fake.__signature__ = signature
    # an interpreted kernel's op gets its own name (see _CACHE)
    op_name = ir.name + ("_interpreted" if compiled.target == "interpreter" else "")
    name = f"{NAMESPACE}::{op_name}"
    op = torch.library.triton_op(name, impl, mutates_args=tuple(mutated))
    op.register_fake(fake)
    return getattr(getattr(torch.ops, NAMESPACE), op_name).default
