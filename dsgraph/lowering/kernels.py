"""Region kernels as torch ops: compiled once per signature, launched through ``wrap_triton``.

``compile_kernel(ir)`` writes the kernel's source to a file (Triton reads kernels' source),
imports it, wraps it in a small ``triton.autotune`` over tile sizes and warps, and registers
a ``torch.library.triton_op`` ``dsgraph_triton::<kernel name>`` whose implementation
launches it through ``wrap_triton``, with a fake implementation that gives the outputs'
shapes, dtypes and strides. FX execution calls the op; Inductor sees the Triton kernel.
The cache key is the kernel's signature (ops, constants, dtypes, broadcast pattern,
rank), never the sizes::

    kernel = compile_kernel(ir)           # the same object for every region with this signature
    out0, out1 = kernel.op(x, w, b)       # torch.ops.dsgraph_triton.dsg_red_1a2b3c4d5e6f
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os
import sys
import tempfile
import time
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .codegen import render
from .kernel_ir import KernelIR

NAMESPACE = "dsgraph_triton"


class DsgraphLoweringWarning(UserWarning):
    """A region was left to Inductor: its kernel failed to compile or to match eager."""


class KernelCompileError(RuntimeError):
    """Triton could not compile (or run) a region's kernel."""


# (BLOCK_M, BLOCK_N, num_warps). On the GPU the autotuner times each for every new (M, N);
# under TRITON_INTERPRET there is nothing to time, so two small tiles (which also make the
# CPU tests cross block edges and loop over columns) are tried with a wall clock.
GPU_CONFIGS = {
    "pointwise": [(1, 1024, 4), (1, 4096, 8), (8, 128, 4), (32, 32, 4), (128, 8, 4)],
    "reduction": [(1, 1024, 4), (1, 4096, 8), (4, 256, 4), (16, 64, 4), (64, 16, 4)],
}
INTERPRETER_CONFIGS = {
    "pointwise": [(2, 16, 1), (4, 8, 1)],
    "reduction": [(2, 16, 1), (1, 8, 1)],
}


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


@dataclass
class CompiledKernel:
    ir: KernelIR
    source: str
    kernel: Any  # the autotuned Triton kernel
    jit: Any  # the bare @triton.jit function
    op: Any  # torch.ops.dsgraph_triton.<name>.default
    configs: list
    checked: dict = field(default_factory=dict)  # input layouts checked against eager -> error

    @property
    def name(self) -> str:
        return self.ir.name


# (interpreted?, signature) -> kernel: a process that runs both the interpreter and the GPU
# (the test suite on a GPU machine) keeps the two kernels apart
_CACHE: dict[tuple[bool, str], CompiledKernel] = {}
_BY_OP: dict[object, CompiledKernel] = {}  # its op (OpOverload) -> kernel


def compiled_for_op(target) -> CompiledKernel | None:
    """The kernel behind a ``dsgraph_triton`` op of this process, or None for any other target."""
    return _BY_OP.get(target)


def cache_info() -> dict[str, str]:
    """Signature hash -> kernel name of every kernel compiled in this process."""
    return {hashlib.sha256(sig.encode()).hexdigest()[:12]: k.name for (_, sig), k in _CACHE.items()}


def _load_module(name: str, source: str):
    path = os.path.join(kernel_dir(), f"{name}.py")
    if not os.path.exists(path) or open(path).read() != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: another process may be writing the same kernel
    module_name = f"dsgraph_triton_kernels.{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _autotuned(jit_fn, kind: str, in_place: list[str]):
    import triton

    table = INTERPRETER_CONFIGS if interpreting() else GPU_CONFIGS
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w) for m, n, w in table[kind]]
    if in_place:
        # a kernel that reads and writes a tensor (slot += g) must not run twice for timing
        configs = configs[:1]
    kwargs = {"do_bench": _wall_clock_bench} if interpreting() and len(configs) > 1 else {}
    return triton.autotune(configs=configs, key=["M", "N"], **kwargs)(jit_fn), configs


def compile_kernel(ir: KernelIR, fail: bool = False) -> CompiledKernel:
    """The kernel and op for ``ir`` (cached by signature). ``fail``: raise as a Triton
    compile failure would (the failure-injection hook of the lowering pass's tests)."""
    if fail:
        raise KernelCompileError(f"{ir.name}: injected compile failure (fail_regions)")
    key = (interpreting(), ir.signature())
    if key in _CACHE:
        return _CACHE[key]
    source = render(ir)
    try:
        module = _load_module(ir.name, source)
        jit_fn = getattr(module, ir.name)
    except Exception as e:  # a syntax error in generated source is a compile failure
        raise KernelCompileError(f"{ir.name}: {type(e).__name__}: {e}") from e
    in_place = [s.name for s in ir.stores if s.param is not None]
    kernel, configs = _autotuned(jit_fn, ir.kind, in_place)
    compiled = CompiledKernel(ir, source, kernel, jit_fn, None, configs)
    compiled.op = _register_op(compiled)
    _CACHE[key] = compiled
    _BY_OP[compiled.op] = compiled
    return compiled


# ---- launching ----------------------------------------------------------------------------

def _pad(t: torch.Tensor, rank: int) -> torch.Tensor:
    while t.dim() < rank:
        t = t.unsqueeze(0)
    return t


def full_shape(ir: KernelIR, tensors: list[torch.Tensor]) -> tuple:
    """F: the broadcast of every tensor the kernel reads (plan checks that it is the region's)."""
    read = sorted({l.param for l in ir.loads})
    return tuple(torch.broadcast_shapes(*[tensors[i].shape for i in read])) if read else ()


def _strides_of_layout(shape, order) -> list:
    """Dense strides of ``shape`` with dims laid out outermost to innermost as ``order`` says
    (``empty_permuted``'s layout). Written as ``empty_strided``: in a graph handed to
    Inductor, ``empty_permuted`` is an op with both a fallback and a decomposition, which
    Inductor refuses (seen on the H200, torch 2.11)."""
    strides = [0] * len(shape)
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step = step * shape[dim]
    return strides


def allocate_outputs(ir: KernelIR, tensors: list[torch.Tensor]) -> tuple[tuple, list[torch.Tensor]]:
    """F, then every store's tensor: fresh outputs (dense in the order the graph had them)
    or the tensor written in place."""
    full = full_shape(ir, tensors)
    device = next(t.device for t in tensors)
    outs = []
    for s in ir.stores:
        if s.param is not None:
            outs.append(tensors[s.param])
        elif s.space == "full":
            order = list(s.order) if len(s.order) == len(full) else list(range(len(full)))
            outs.append(torch.empty_strided(full, _strides_of_layout(full, order), dtype=s.dtype, device=device))
        elif s.space == "row":
            outs.append(torch.empty(full[:-1] + (1,), dtype=s.dtype, device=device))
        else:
            outs.append(torch.empty(full[:-1], dtype=s.dtype, device=device))
    return full, outs


def _flat(ir: KernelIR, tensors: list[torch.Tensor], outs: list[torch.Tensor], full: tuple) -> bool:
    """A pointwise kernel whose every tensor is contiguous with shape F runs over a 1 x numel
    index space: no row arithmetic, one long contiguous run per program."""
    if ir.kind != "pointwise" or any(l.space != "full" for l in ir.loads):
        return False
    used = [tensors[l.param] for l in ir.loads] + outs
    return all(tuple(t.shape) == tuple(full) and t.is_contiguous() for t in used)


def launch_arguments(ir: KernelIR, tensors: list[torch.Tensor], outs: list[torch.Tensor], full: tuple,
                     scalars: list) -> tuple[list, int, int]:
    """Arguments in ``codegen.kernel_arguments`` order, and M, N."""
    r = ir.rank
    if _flat(ir, tensors, outs, full):
        numel = math.prod(full)
        sizes = [1] * (r - 1) + [numel]
        load_strides = [[0] * (r - 1) + [1] for _ in ir.loads]
        store_strides = [[0] * (r - 1) + [1] for _ in ir.stores]
    else:
        padded = (1,) * (r - len(full)) + tuple(full)
        sizes = list(padded)
        load_strides = []
        for l in ir.loads:
            t = tensors[l.param]
            if l.space == "full":
                load_strides.append(list(_pad(t.expand(full), r).stride()))
            else:
                load_strides.append(list(_pad(t.expand(full[:-1] + (1,)), r).stride())[:-1])
        store_strides = []
        for s, out in zip(ir.stores, outs):
            if s.space == "full":
                store_strides.append(list(_pad(out, r).stride()))
            elif s.space == "row":
                store_strides.append(list(_pad(out, r).stride())[:-1])
            else:
                store_strides.append(list(_pad(out.unsqueeze(-1), r).stride())[:-1])
    m, n = math.prod(sizes[:-1]), sizes[-1]
    args = [tensors[l.param] for l in ir.loads] + list(outs) + list(scalars)
    args += [m, n] + sizes[1:-1]
    for strides in load_strides + store_strides:
        args += strides
    return args, m, n


def launch(compiled: CompiledKernel, tensors: list[torch.Tensor], scalars: list,
           config: tuple[int, int, int] | None = None) -> list[torch.Tensor]:
    """Run the kernel; returns the fresh outputs (tensors written in place are not returned).
    ``config``: (BLOCK_M, BLOCK_N, num_warps) instead of the autotuner's choice (tests,
    benchmarks)."""
    from torch.library import wrap_triton
    import triton

    ir = compiled.ir
    full, outs = allocate_outputs(ir, tensors)
    args, m, n = launch_arguments(ir, tensors, outs, full, scalars)
    if m > 0 and (n > 0 or ir.kind == "reduction"):
        if ir.kind == "pointwise":
            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        else:
            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]),)
        if config is None:
            wrap_triton(compiled.kernel)[grid](*args)
        else:
            block_m, block_n, warps = config
            compiled.jit[grid](*args, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
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
    op_name = ir.name + ("_interpreted" if interpreting() else "")
    name = f"{NAMESPACE}::{op_name}"
    op = torch.library.triton_op(name, impl, mutates_args=tuple(mutated))
    op.register_fake(fake)
    return getattr(getattr(torch.ops, NAMESPACE), op_name).default
