"""Triton source for one region: a module of ``@triton.jit`` kernels, readable and deterministic.

Each region's module has two entry points, the general one and a fast form for the common
layout; the launcher (``launch_layout.launch_plan``) picks one per call:

- pointwise: ``<name>_flat`` when every tensor is dense in one and the same layout (element
  i of each at offset i: one 64-bit program offset, then contiguous ``tl.arange`` offsets
  that the compiler turns into 16-byte vector loads and stores, no row arithmetic);
  ``<name>``, the general kernel, for any layout (transposed, broadcast);
- reductions: ``<name>_tile`` when a whole row fits one tile (the launcher passes BLOCK_N =
  next_power_of_2(N) <= 4096, and N as a constexpr): every input read once, ROWS tiles of
  BLOCK_M rows per program, the inputs the same for every row (``Load.cols_only``) loaded
  once per program, each tile's loads issued while the previous tile computes;
  ``<name>``, the general kernel, for wider rows and for launches traced with a symbolic N
  (a runtime branch between the one-tile body and a loop per level of reductions).

The general kernels' iteration space is 2-D: rows (every index of F but the last,
flattened) by columns (F's last dimension N). Every tensor comes with its strides as
arguments (0 where it is broadcast), so contiguous, transposed and broadcast inputs run the
same kernel, and sizes (M rows, N columns, the leading sizes D1.. that unflatten a row
index) are arguments, never constants: one compiled kernel serves every size. The launcher
merges leading dimensions that every tensor walks in step (contiguous ones do), so D1.. are
1 in the common case; Triton compiles an argument equal to 1 as the constant 1 and the
``%``/``//`` that unflatten the row index fold away::

    pid = tl.program_id(0)
    col_blocks = (N + BLOCK_N - 1) // BLOCK_N
    rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    ...
    v0 = tl.load(in0_ptr + in0_row + cols * in0_s1, mask=mask, other=0).to(tl.float32)
    v1 = v0 * 0.5  # mul

Reductions loop over the columns in BLOCK_N chunks when a row is wider than a tile, once
per level of reductions (layer norm: the sum for the mean, the sum of squares about it,
then the normalized output), accumulating per lane in fp32 and reducing the lanes after
the loop; values are recomputed from loads in each loop that needs them, the first loops
ask the cache to keep what they read (``evict_last``), the last one not to.

Targets: the source depends on where the kernel runs, and only there (``render(ir,
target)`` is deterministic per target). fp32 -> bf16 is ``_to_bf16`` / ``_round_bf16``: on
a GPU (``target="gpu"``) the hardware conversion (``cvt.rn.bf16``: round to nearest even,
one instruction per two values); under Triton's interpreter (``target="interpreter"``),
whose own conversion truncates, the same rounding done on the bits (about 13 integer
instructions per value, which is why the GPU does not get that form). Both give eager's
bits (tests/unit/test_lowering_codegen.py checks the bit form bitwise; the GPU tests the
hardware one).
"""

from __future__ import annotations

import torch

from .codegen_reduction import ReductionWriter
from .kernel_ir import KernelIR, Store, Value
from .op_table import TL_DTYPE, compute_dtype

INDENT = "    "
TARGETS = ("gpu", "interpreter")

# entry points of a region's module: form -> suffix of the kernel name
FORMS = {"pointwise": {"flat": "_flat", "general": ""}, "reduction": {"tile": "_tile", "general": ""}}

# fp32 -> bf16, rounding to nearest even (eager's rounding), per target
BF16_HELPERS = {
    "gpu": [
        "",
        "@triton.jit",
        "def _round_bf16(x):",
        "    # x rounded to the nearest bfloat16 (ties to even: the hardware conversion), kept in fp32",
        '    return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)',
        "",
        "",
        "@triton.jit",
        "def _to_bf16(x):",
        '    return x.to(tl.bfloat16, fp_downcast_rounding="rtne")',
        "",
    ],
    # Triton's interpreter truncates fp32 -> bf16 (and flushes bf16 subnormals): by bits
    "interpreter": [
        "",
        "@triton.jit",
        "def _round_bf16(x):",
        "    # x rounded to the nearest bfloat16 (ties to even), kept in fp32",
        "    bits = x.to(tl.uint32, bitcast=True)",
        "    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16",
        "    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))",
        "",
        "",
        "@triton.jit",
        "def _to_bf16(x):",
        "    bits = _round_bf16(x).to(tl.uint32, bitcast=True) >> 16",
        "    bits = tl.where(x != x, 0x7FC0, bits)",
        "    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)",
        "",
    ],
}

# erf for fp32 (op_table.erf_function), branch-free. Coefficients: minimax fits (Lawson's
# iteration, fp64) rounded to fp32: P for erf(x)/x - 1 on |x| < 1 (relative error 5.9e-8), Q
# for log2(erfc(a)) on 1 <= a <= 4 (error of erf 1.6e-8; erfc(4) = 1.5e-8 rounds 1 - erfc to
# 1.0 in fp32). Within 2 ulp of erf in fp32 (tests/unit/test_lowering_codegen.py measures it
# over 2.5 M values under the interpreter; libdevice's erff is documented at 2 ulp too), in
# about 18 instructions on sm_90 where libdevice's erff, which selects one polynomial's
# coefficients per element, takes about 30: a GELU region is otherwise compute-bound there.
ERF_HELPER = [
    "",
    "@triton.jit",
    "def _erf(x):",
    "    # fp32 erf, both branches computed: x + x * P(x^2) below |x| = 1, 1 - 2^Q(min(|x|, 4)) above",
    "    t = x * x",
    "    p = -0.0005600883741863072 * t + 0.004909285344183445",
    "    p = p * t - 0.02670324593782425",
    "    p = p * t + 0.11279841512441635",
    "    p = p * t - 0.37612271308898926",
    "    p = p * t + 0.12837910652160645",
    "    small = x * p + x",
    "    a = tl.minimum(tl.abs(x), 4.0)",
    "    q = -0.001657149288803339 * a + 0.021301792934536934",
    "    q = q * a - 0.1278194934129715",
    "    q = q * a - 0.9443012475967407",
    "    q = q * a - 1.6120728254318237",
    "    q = q * a - 0.0038679654244333506",
    "    large = 1.0 - tl.exp2(q)",
    "    large = tl.where(x < 0, -large, large)",
    "    return tl.where(tl.abs(x) >= 1.0, large, small)  # NaN: small, which is NaN",
    "",
]

# a value rounded to a storage type and kept in fp32 (op_table's casts): storing it as that
# type stores the unrounded value with one conversion (rounding twice gives the same bits)
_ROUNDED = {torch.bfloat16: "_round_bf16({0})", torch.float16: "{0}.to(tl.float16).to(tl.float32)"}


def _stride_names(name: str, count: int) -> list[str]:
    return [f"{name}_s{i}" for i in range(count)]


def kernel_arguments(ir: KernelIR, form: str = "general") -> list[str]:
    """The arguments of one entry point in order (the launcher passes them in this order),
    without the constexpr block sizes."""
    args = [f"{l.name}_ptr" for l in ir.loads] + [f"{s.name}_ptr" for s in ir.stores]
    args += [f"a{i}" for i in range(ir.scalars)]
    if form == "flat":
        return args + ["NUMEL"]
    r = ir.rank
    args += ["M", "N"] + [f"D{i}" for i in range(1, r - 1)]
    for l in ir.loads:
        args += _stride_names(l.name, r if l.space == "full" else r - 1)
    for s in ir.stores:
        args += _stride_names(s.name, r if s.space == "full" else r - 1)
    return args


def block_arguments(ir: KernelIR, form: str = "general") -> list[str]:
    """The constexpr block sizes of one entry point."""
    if form == "flat":
        return ["BLOCK"]
    return ["BLOCK_M", "ROWS", "BLOCK_N"] if form == "tile" else ["BLOCK_M", "BLOCK_N"]


def kernel_name(ir: KernelIR, form: str = "general") -> str:
    return ir.name + FORMS[ir.kind][form]


class _Writer(ReductionWriter):
    def __init__(self, ir: KernelIR, target: str):
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.ir = ir
        self.target = target
        self.lines: list[str] = []
        self.values = {v.name: v for v in ir.values}
        self.loads = {l.name: l for l in ir.loads}
        self.flat = False  # writing the flat entry point: one offset for every tensor

    def emit(self, line: str, depth: int = 1) -> None:
        self.lines.append(INDENT * depth + line)

    # ---- pieces -------------------------------------------------------------------------

    def row_offsets(self, depth: int, rows: str = "rows", clamp: bool = False, args=None, suffix: str = "") -> None:
        """Each tensor's offset of ``rows`` (``<name>_row<suffix>``; ``args``: those tensors'
        only, default every load but the cols_only ones and every store). ``clamp``: rows past
        M read row M - 1, so that loads need no row mask (their stores are masked)."""
        r = self.ir.rank
        ri = f"r{suffix}"
        if clamp:
            self.emit(f"{ri} = tl.minimum({rows}, M - 1).to(tl.int64)  # row index, 64-bit for the offsets below",
                      depth)
        else:
            self.emit(f"{ri} = {rows}.to(tl.int64)  # row index, 64-bit for the offsets below", depth)
        # unflatten the row index into the leading dims i0 .. i{r-2} (D1.. are 1 when the
        # launcher merged the leading dims: Triton then folds the % and // away)
        if r == 2:
            self.emit(f"i0{suffix} = {ri}", depth)
        else:
            current = ri
            for d in range(r - 2, 0, -1):
                self.emit(f"i{d}{suffix} = {current} % D{d}", depth)
                if d > 1:
                    self.emit(f"t{suffix} = {current} // D{d}", depth)
                    current = f"t{suffix}"
                else:
                    self.emit(f"i0{suffix} = {current} // D{d}", depth)
        if args is None:
            args = [*(l for l in self.ir.loads if not l.cols_only), *self.ir.stores]
        for arg in args:
            terms = " + ".join(f"i{d}{suffix} * {arg.name}_s{d}" for d in range(r - 1))
            self.emit(f"{arg.name}_row{suffix} = {terms}", depth)

    def load(self, v: Value, depth: int, eviction: str | None) -> None:
        load = self.loads[v.args[0]]
        dtype = self.ir.params[load.param].dtype
        last = self.ir.rank - 1
        evict = f', eviction_policy="{eviction}"' if eviction else ""
        if self.flat:
            ptr, mask = f"{load.name}_ptr + start + offs", "mask"
        elif load.cols_only:
            # the same for every row: one address per column, as a [BLOCK_M, BLOCK_N] tile (the
            # shape of the other loads, so one layout serves them all; ptxas loads it once)
            ptr = f"tl.broadcast_to({load.name}_ptr + cols * {load.name}_s{last}, (BLOCK_M, BLOCK_N))"
            mask = "col_mask"
        elif load.space == "full":
            ptr, mask = f"{load.name}_ptr + {load.name}_row + cols * {load.name}_s{last}", "mask"
        else:
            ptr, mask = f"{load.name}_ptr + {load.name}_row", "row_mask"
        self.emit(f"{v.name} = tl.load({ptr}, mask={mask}, other=0{evict}){self.cast(v)}  # {v.label}", depth)

    def cast(self, v: Value) -> str:
        """What a loaded value is converted with to its compute type ("" when none)."""
        dtype = self.ir.params[self.loads[v.args[0]].param].dtype
        return "" if compute_dtype(dtype) == dtype else f".to({TL_DTYPE[v.dtype]})"

    def tile_load(self, v: Value, depth: int, target: str, suffix: str, mask: str | None) -> None:
        """One-tile kernel: ``target`` = the load of ``v`` in its stored type, at the rows of
        ``row_offsets(suffix=suffix)``; cols_only loads as a [BLOCK_M, BLOCK_N] tile (the
        shape of every other load and store: one layout, no conversion between them)."""
        load = self.loads[v.args[0]]
        last = self.ir.rank - 1
        if load.cols_only:
            ptr = f"tl.broadcast_to({load.name}_ptr + cols * {load.name}_s{last}, (BLOCK_M, BLOCK_N))"
        elif load.space == "full":
            ptr = f"{load.name}_ptr + {load.name}_row{suffix} + cols * {load.name}_s{last}"
        else:
            ptr = f"{load.name}_ptr + {load.name}_row{suffix}"
        # the next tile's loads are masked off after the program's last tile: what they
        # would hold is never used, so no zero fill (other) either
        other = "" if mask == "next_mask" else ", other=0"
        if load.space == "full":
            mask = "col_mask" if mask is None else f"{mask} & col_mask"
        masked = f", mask={mask}{other}" if mask else ""
        self.emit(f"{target} = tl.load({ptr}{masked})  # {v.label}", depth)

    def expr(self, v: Value, depth: int) -> None:
        text = v.expr
        for i, a in enumerate(v.args):
            text = text.replace("{%d}" % i, a)
        self.emit(f"{v.name} = {text}  # {v.label}", depth)

    def stored(self, s: Store) -> str:
        """The expression a store writes: the value converted to the stored type (a value
        the graph already rounded to that type is converted from before its rounding)."""
        value = self.values[s.value]
        if value.dtype == s.dtype:
            return s.value
        if value.op == "expr" and value.expr == _ROUNDED.get(s.dtype) and \
                self.values[value.args[0]].dtype == torch.float32:
            value = self.values[value.args[0]]
        if s.dtype == torch.bfloat16:
            return f"_to_bf16({value.name})"
        return f"{value.name}.to({TL_DTYPE[s.dtype]})"

    def store(self, s: Store, depth: int) -> None:
        text = self.stored(s)
        last = self.ir.rank - 1
        if self.flat:
            self.emit(f"tl.store({s.name}_ptr + start + offs, {text}, mask=mask)", depth)
        elif s.space == "full":
            self.emit(f"tl.store({s.name}_ptr + {s.name}_row + cols * {s.name}_s{last}, {text}, mask=mask)", depth)
        else:
            self.emit(f"tl.store({s.name}_ptr + {s.name}_row, {text}, mask=row_mask)", depth)

    def signature_lines(self) -> None:
        ir = self.ir
        ops = [v.label for v in ir.values if v.op not in ("load",)]
        self.lines.append(f"# {ir.name}: {ir.kind} kernel over rank-{ir.rank} tensors (rows x last dim)")
        self.lines.append(f"# ops: {', '.join(ops)}")
        self.lines.append("# inputs: " + ", ".join(
            f"{l.name} {str(ir.params[l.param].dtype).replace('torch.', '')} ({l.space})" for l in ir.loads))
        self.lines.append("# outputs: " + ", ".join(
            f"{s.name} {str(s.dtype).replace('torch.', '')} ({s.space}{', in place' if s.param is not None else ''})"
            for s in ir.stores))
        forms = ", ".join(kernel_name(ir, f) for f in FORMS[ir.kind])
        self.lines.append(f"# entry points: {forms} (launch_layout.launch_plan picks one per launch)")
        how = ("the GPU's conversion" if self.target == "gpu" else "bits (the interpreter's conversion truncates)")
        self.lines.append(f"# target: {self.target} (fp32 -> bf16 rounds to nearest even by {how})")

    def header(self, form: str) -> None:
        self.lines += ["", "@triton.jit"]
        args = kernel_arguments(self.ir, form) + [f"{b}: tl.constexpr" for b in block_arguments(self.ir, form)]
        if form == "tile":
            # a one-tile launch has N known (an int): a constant of the kernel, as in Inductor's
            args = [f"{a}: tl.constexpr" if a == "N" else a for a in args]
        self.lines.append(f"def {kernel_name(self.ir, form)}(")
        for a in args:
            self.emit(f"{a},")
        self.lines.append("):")

    # ---- pointwise ------------------------------------------------------------------------

    def body(self, depth: int) -> None:
        for v in self.ir.values:
            if v.op == "load":
                self.load(v, depth, None)
            else:
                self.expr(v, depth)
        for s in self.ir.stores:
            self.store(s, depth)

    def pointwise_flat(self) -> None:
        self.flat = True
        self.emit('"""Every tensor dense in one layout: element i of each at offset i."""')
        self.emit("start = tl.program_id(0).to(tl.int64) * BLOCK  # 64-bit: NUMEL may pass 2**31")
        self.emit("offs = tl.arange(0, BLOCK)  # contiguous: vector loads and stores")
        self.emit("mask = offs < NUMEL - start")
        self.body(1)
        self.flat = False

    def pointwise(self) -> None:
        self.emit('"""Any layout: one BLOCK_M x BLOCK_N tile of rows x columns per program."""')
        self.emit("pid = tl.program_id(0)")
        self.emit("col_blocks = (N + BLOCK_N - 1) // BLOCK_N")
        self.emit("rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
        self.emit("cols = (pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
        self.emit("row_mask = rows < M")
        self.emit("col_mask = cols < N")
        self.emit("mask = row_mask & col_mask")
        self.row_offsets(1)
        self.body(1)

    def render(self) -> str:
        self.signature_lines()
        self.lines += ["", "import triton", "import triton.language as tl", ""]
        if self.ir.kind == "reduction":
            # combine functions for tl.reduce (tl.sum / tl.max are triton.language's own @jit
            # helpers, which the interpreter runs only when it was on before triton's import);
            # _max propagates NaN as torch.amax does (one max.NaN instruction on the GPU)
            self.lines += ["", "@triton.jit", "def _add(a, b):", "    return a + b", "", "",
                           "@triton.jit", "def _max(a, b):",
                           "    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)", ""]
        if any("_round_bf16(" in v.expr for v in self.ir.values) or any(
                s.dtype == torch.bfloat16 and self.values[s.value].dtype != s.dtype for s in self.ir.stores):
            self.lines += BF16_HELPERS[self.target]
        if any("_erf(" in v.expr for v in self.ir.values):
            self.lines += ERF_HELPER
        if self.ir.kind == "pointwise":
            self.header("flat")
            self.pointwise_flat()
            self.lines.append("")
            self.header("general")
            self.pointwise()
        else:
            self.header("tile")
            self.reduction_tile()
            self.lines.append("")
            self.header("general")
            self.reduction()
        return "\n".join(self.lines) + "\n"


def render(ir: KernelIR, target: str) -> str:
    """The Triton source of ``ir``'s kernels for ``target`` ("gpu" or "interpreter"): a
    module defining the entry points of ``FORMS[ir.kind]`` (``kernel_name(ir, form)``)."""
    return _Writer(ir, target).render()
