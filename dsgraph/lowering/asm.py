"""A region's kernel compiled for a CUDA GPU without one: PTX, SASS and what they say.

Triton compiles for a named target without a device (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))``, ptxas and nvdisasm come with its wheel), so the code a
kernel becomes on an H100/H200 can be read on any machine. ``compile_for_cuda`` specializes
the arguments as a launch on the GPU would (pointers and ints divisible by 16 marked so, ints
equal to 1 made constants: Triton's own binder), for the entry point and arguments the
launcher picks for the given tensors (meta tensors: no memory), and ``count`` reads the
result::

    asm = compile_for_cuda(ir, [x, w, b], config=(1, 8))      # x: meta [16, 1024, 4096] bf16
    asm.form, asm.per_element, asm.vector_loads, asm.int_divisions
    ('tile', 27.3, 3, 0)

``per_element`` is the kernel's SASS instruction count (NOPs left out) over the elements one
thread handles (BLOCK / threads): the instructions a thread issues per element, exactly, for
the straight-line entry points (flat, tile); for the general ones, both sides of their
runtime branch are counted. Compute-bound is when that count times the elements exceeds
what the SMs issue while the bytes stream at the copy bandwidth (H200: 132 SMs x 4
schedulers x ~1.98 GHz ~ 33e12 thread-instructions/s; 100 M elements at 37 per element
~ 110 us, about the time 400 MB take to stream).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from .codegen import block_arguments, kernel_name, render
from .kernel_ir import KernelIR

SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
SASS_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def loop_bodies(sass: str) -> list[tuple[int, int]]:
    """Backward branches of the listing as (first, last) instruction indices (NOPs left out,
    as in ``CudaKernel.opcodes``) of the loop they close; the trap loop after EXIT (a branch
    to itself) is not one."""
    labels: dict[str, int] = {}
    loops = []
    index = 0
    for line in sass.splitlines():
        if (m := SASS_LABEL.match(line)):
            labels[m.group(1)] = index
            continue
        m = SASS_LINE.match(line)
        if not m or m.group(1).startswith("NOP"):
            continue
        b = SASS_BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] < index:
            loops.append((labels[b.group(1)], index))
        index += 1
    return loops


@dataclass
class CudaKernel:
    name: str
    form: str
    config: tuple  # the block sizes then num_warps (``kernels.launch``'s config)
    per_thread: float  # elements one thread handles
    ptx: str
    sass: str  # nvdisasm's listing ("" when nvdisasm is missing)
    registers: int | None = None
    opcodes: list[str] = field(default_factory=list)
    trips: int = 1  # times the one-tile kernel's loop over its tiles runs (ROWS)
    threads: int = 0  # per program (32 x num_warps)
    shared: int = 0  # bytes of shared memory per program (the reductions' scratch)
    tile_bytes: int = 0  # one-tile kernels: bytes of per-row inputs one tile reads

    @property
    def instructions(self) -> int:
        """SASS instructions in the listing (NOPs left out)."""
        return len(self.opcodes)

    @property
    def executed(self) -> int:
        """Instructions one thread issues per program: the listing's, with the body of the
        one-tile kernel's loop over its ROWS tiles counted ROWS times (when the compiler
        kept the loop: one backward branch; unrolled, the listing is what runs)."""
        if self.trips == 1 or self.form != "tile":
            return self.instructions
        loops = loop_bodies(self.sass)
        if len(loops) != 1:
            return self.instructions
        first, last = loops[0]
        return self.instructions + (self.trips - 1) * (last - first + 1)

    @property
    def per_element(self) -> float:
        return self.executed / self.per_thread

    def _count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.ptx, re.MULTILINE))

    def _memory(self, op: str, vector: bool) -> int:
        """PTX global loads or stores (``op``: "ld" / "st"), vector ones (.v2/.v4/.v8: 8 or
        16 bytes at once, ld.global.v4.b32) or not."""
        found = re.findall(r"^\s*(?:@!?%p\d+\s+)?(" + op + r"\.global\S*)", self.ptx, re.MULTILINE)
        return sum(1 for f in found if bool(re.search(r"\.v[248]\.", f)) == vector)

    @property
    def vector_loads(self) -> int:
        return self._memory("ld", True)

    @property
    def scalar_loads(self) -> int:
        return self._memory("ld", False)

    @property
    def vector_stores(self) -> int:
        return self._memory("st", True)

    @property
    def scalar_stores(self) -> int:
        return self._memory("st", False)

    @property
    def int_divisions(self) -> int:
        """Integer divisions and remainders left in the PTX (64-bit ones are ~70 instructions)."""
        return self._count(r"\b(?:div|rem)\.(?:s|u)(?:32|64)\b")

    @property
    def spills(self) -> int:
        """Local-memory loads and stores in the SASS (register spills)."""
        return sum(1 for o in self.opcodes if o.startswith(("LDL", "STL")))

    @property
    def bf16_conversions(self) -> int:
        """Hardware fp32 -> bf16 conversions (cvt.rn.bf16x2.f32 / cvt.rn.bf16.f32)."""
        return self._count(r"cvt\.rn\.bf16")

    @property
    def programs_per_sm(self) -> int | None:
        """Programs resident on one H100/H200 SM at once: 64 K registers (allocated per warp
        in units of 8 per thread), 2048 threads, 32 programs, 228 KB of shared memory."""
        if not self.registers or not self.threads:
            return None
        per_thread = -(-self.registers // 8) * 8
        limits = [65536 // (per_thread * self.threads), 2048 // self.threads, 32]
        if self.shared:
            limits.append(233472 // (self.shared + 1024))  # 1 KB reserved per program
        return min(limits)

    @property
    def in_flight_per_sm(self) -> int | None:
        """One-tile kernels: bytes of rows an SM's resident programs read at once (each
        program reads a whole tile before its first reduction can finish): what bounds the
        bandwidth of a kernel that waits on memory latency."""
        return None if not self.tile_bytes or not self.programs_per_sm else self.tile_bytes * self.programs_per_sm

    @property
    def sass_loads(self) -> int:
        """Global loads in the SASS (LDG): after ptxas, which merges the loads of an input
        the same for every row of a tile (w of a layer norm) that the PTX repeats per row."""
        return sum(1 for o in self.opcodes if o.startswith("LDG"))

    def summary(self) -> dict:
        return {"form": self.form, "config": list(self.config), "per_thread": self.per_thread,
                "sass_instructions": self.instructions, "executed": self.executed,
                "per_element": round(self.per_element, 1),
                "vector_loads": self.vector_loads, "scalar_loads": self.scalar_loads,
                "vector_stores": self.vector_stores, "scalar_stores": self.scalar_stores,
                "int_divisions": self.int_divisions, "registers": self.registers, "spills": self.spills,
                "sass_loads": self.sass_loads, "shared": self.shared, "programs_per_sm": self.programs_per_sm,
                "tile_bytes": self.tile_bytes, "in_flight_per_sm": self.in_flight_per_sm}


def _tool(name: str) -> str | None:
    import triton

    knobs = getattr(triton, "knobs", None)
    tool = getattr(getattr(knobs, "nvidia", None), name, None) if knobs is not None else None
    path = getattr(tool, "path", None)
    return path if path and os.path.exists(path) else None


def _disassemble(cubin: bytes) -> tuple[str, int | None]:
    nvdisasm, cuobjdump = _tool("nvdisasm"), _tool("cuobjdump")
    if nvdisasm is None:
        return "", None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
        registers = None
        if cuobjdump is not None:
            usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=False).stdout
            m = re.search(r"REG:(\d+)", usage)
            registers = int(m.group(1)) if m else None
    return sass, registers


def _compile(jit_fn, args: list, constexprs: dict, num_warps: int, arch: int):
    """``jit_fn`` compiled for ``sm_<arch>`` with these arguments specialized as Triton's
    launcher would (the binder's specialization; no device needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    kwargs = dict(constexprs, num_warps=num_warps)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constants, attrs = jit_fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(jit_fn, signature, constants, attrs), target=target, options=options.__dict__)


_MODULES: dict[tuple[str, str], Any] = {}


def source_module(ir: KernelIR, target: str = "gpu"):
    """``ir``'s kernels as written for ``target``, imported (whatever this process's own
    target is)."""
    from .kernels import _load_module

    import triton

    key = (ir.name, target)
    if key not in _MODULES:
        # compiled, not interpreted, even under TRITON_INTERPRET=1: @triton.jit reads the
        # knob when it decorates (the module is imported under its own name: see _load_module)
        knobs = triton.knobs.runtime
        interpret, knobs.interpret = knobs.interpret, False
        try:
            _MODULES[key] = _load_module(f"{ir.name}_asm", target, render(ir, target))
        finally:
            knobs.interpret = interpret
    return _MODULES[key]


def compile_for_cuda(ir: KernelIR, tensors: list[torch.Tensor], scalars: list = (), config: tuple | None = None,
                     form: str | None = None, arch: int = 90, source: str = "gpu") -> CudaKernel:
    """Compile the entry point the launcher picks for ``tensors`` (meta tensors do: only
    shapes, strides and dtypes matter) for ``sm_<arch>``. ``config``: the block sizes then
    num_warps (default: the form's first GPU config); ``form`` forces an entry point;
    ``source="interpreter"`` compiles the interpreter's source instead (what the bit-level
    bf16 rounding would cost on the GPU)."""
    from . import kernels, launch_layout

    full, outs = launch_layout.allocate_outputs(ir, tensors)
    plan = launch_layout.launch_plan(ir, tensors, outs, full, list(scalars), form)
    if config is None:
        config = kernels.tile_configs(plan.block_n)[0] if plan.form == "tile" else \
            kernels.GPU_CONFIGS["flat" if plan.form == "flat" else ir.kind][0]
    if plan.form == "tile":
        config = kernels.tile_config(config)
    *blocks, warps = config
    constexprs = dict(zip(block_arguments(ir, plan.form), blocks)) if plan.form != "tile" else \
        {"BLOCK_M": blocks[0], "ROWS": blocks[1], "BLOCK_N": plan.block_n}
    jit_fn = getattr(source_module(ir, source), kernel_name(ir, plan.form))
    compiled = _compile(jit_fn, plan.args, constexprs, warps, arch)
    sass, registers = _disassemble(compiled.asm["cubin"])
    opcodes = [m.group(1) for line in sass.splitlines() if (m := SASS_LINE.match(line))]
    opcodes = [o for o in opcodes if not o.startswith("NOP")]
    elements = 1
    for b in constexprs.values():
        elements *= b
    tile_bytes = 0
    if plan.form == "tile":
        row_loads = [l for l in ir.loads if not l.cols_only]
        tile_bytes = sum(blocks[0] * (plan.block_n if l.space == "full" else 1) * ir.params[l.param].dtype.itemsize
                         for l in row_loads)
    shared = getattr(compiled.metadata, "shared", 0) or 0
    return CudaKernel(kernel_name(ir, plan.form), plan.form, tuple(config), elements / (32 * warps),
                      compiled.asm["ptx"], sass, registers, opcodes, constexprs.get("ROWS", 1), 32 * warps,
                      shared, tile_bytes)
