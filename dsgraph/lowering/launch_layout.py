"""How a call's tensors map to a region kernel's arguments: the launch-side layout.

``allocate_outputs`` makes the outputs of one call (F, the broadcast of the inputs, then
every store's tensor), and ``launch_plan`` picks the entry point for these tensors' layouts
(flat pointwise, one-tile reduction, or the general kernel) and lays out its arguments in
``codegen.kernel_arguments`` order: pointers, scalars, sizes, then each tensor's strides,
with leading dims merged where every tensor walks them in step. ``kernels.launch`` runs
the plan; the checks, the sm_90 assembly and the benchmarks make plans of their own::

    full, outs = allocate_outputs(ir, tensors)
    plan = launch_plan(ir, tensors, outs, full, scalars)   # plan.form, plan.args, plan.m, plan.n
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph import compat

from .codegen import FORMS
from .kernel_ir import KernelIR

MAX_TILE_N = 4096  # widest row a one-tile reduction holds in registers (Inductor's limit too)


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


def _is_one(x) -> bool:
    return compat.statically_equal(x, 1)


def _dense(sizes: list, strides: list) -> bool:
    """Do these strides lay ``sizes`` out without gaps or overlaps (in some dim order)?
    Decided without guards: a symbolic size or stride that is not known says no."""
    dims = [d for d in range(len(sizes)) if not _is_one(sizes[d])]
    dims.sort(key=lambda d: compat.size_hint(strides[d]))
    step = 1
    for d in dims:
        if not compat.statically_equal(strides[d], step):
            return False
        step = step * sizes[d]
    return True


def _merge_rows(sizes: list, strides: list[list]) -> tuple[list, list[list]]:
    """Merge leading dims that every tensor walks in step (stride of the outer dim = stride
    of the inner one times its size; contiguous tensors, stride-0 broadcasts), as
    TensorIterator does. The merged dims come first, then dims of size 1 (stride 0), so the
    kernel's D1.. are 1 when everything merges into one row index::

        sizes [8, 1024], strides [[1024*N, N], [0, 0]]  ->  [8192, 1], [[N, 0], [0, 0]]
    """
    merged: list[list] = []  # innermost first: [size, [stride per tensor]]
    for d in reversed(range(len(sizes))):
        if _is_one(sizes[d]):
            continue
        column = [s[d] for s in strides]
        if merged and all(compat.statically_equal(c, inner * merged[-1][0])
                          for c, inner in zip(column, merged[-1][1])):
            merged[-1][0] = merged[-1][0] * sizes[d]
        else:
            merged.append([sizes[d], column])
    merged.reverse()
    pad = len(sizes) - len(merged)
    new_sizes = [m[0] for m in merged] + [1] * pad
    new_strides = [[m[1][i] for m in merged] + [0] * pad for i in range(len(strides))]
    return new_sizes, new_strides


@dataclass
class LaunchPlan:
    """One launch: which entry point, its arguments (``codegen.kernel_arguments`` order),
    the sizes the grid is made from, and a one-tile reduction's BLOCK_N."""

    kind: str  # the kernel's: "pointwise" or "reduction"
    form: str
    args: list
    m: Any  # rows (flat: 1)
    n: Any  # columns (flat: every element)
    block_n: int | None = None

    @property
    def empty(self) -> bool:
        """Nothing to compute (a reduction over empty rows still writes its row outputs)."""
        if self.kind == "reduction":
            return not self.m > 0
        return not (self.m > 0 and self.n > 0)


def _strides(ir: KernelIR, tensors: list[torch.Tensor], outs: list[torch.Tensor], full: tuple) -> list[list]:
    """Per load then per store: its strides over F padded to the kernel's rank (full
    tensors: every dim; per-row tensors: the leading dims)."""
    r = ir.rank
    out = []
    for l in ir.loads:
        t = tensors[l.param]
        if l.space == "full":
            out.append(list(_pad(t.expand(full), r).stride()))
        else:
            out.append(list(_pad(t.expand(full[:-1] + (1,)), r).stride())[:-1])
    for s, o in zip(ir.stores, outs):
        if s.space == "full":
            out.append(list(_pad(o, r).stride()))
        elif s.space == "row":
            out.append(list(_pad(o, r).stride())[:-1])
        else:
            out.append(list(_pad(o.unsqueeze(-1), r).stride())[:-1])
    return out


def launch_plan(ir: KernelIR, tensors: list[torch.Tensor], outs: list[torch.Tensor], full: tuple,
                scalars: list, form: str | None = None) -> LaunchPlan:
    """The entry point for these tensors (``form`` forces one, if it applies) and its
    arguments: ``flat`` when every tensor is dense in one and the same layout; ``tile``
    when a reduction's rows (N <= MAX_TILE_N, a concrete int) fit one tile; else
    ``general``, whose leading dims are merged where every tensor allows it."""
    r = ir.rank
    padded = list((1,) * (r - len(full)) + tuple(full))
    strides = _strides(ir, tensors, outs, full)
    for l, st in zip(ir.loads, strides):
        # the kernels index a cols_only input by its column alone: it must not vary by row
        if l.cols_only and not all(_is_one(padded[d]) or compat.statically_equal(st[d], 0) for d in range(r - 1)):
            raise ValueError(f"{ir.name}: input {l.param} ({tuple(tensors[l.param].shape)}) varies by row; "
                             f"the kernel reads it as the same for every row")
    pointers = [tensors[l.param] for l in ir.loads] + list(outs)
    if ir.kind == "pointwise" and form in (None, "flat"):
        if all(l.space == "full" for l in ir.loads) and all(
                len(s) == r and all(compat.statically_equal(a, b) for a, b in zip(s, strides[0])) for s in strides) \
                and _dense(padded, strides[0]):
            numel = math.prod(padded)
            return LaunchPlan(ir.kind, "flat", pointers + list(scalars) + [numel], 1, numel)
        if form == "flat":
            raise ValueError(f"{ir.name}: the flat form needs every tensor dense in one layout")
    n = padded[-1]
    block_n = None
    if ir.kind == "reduction" and form in (None, "tile"):
        if isinstance(n, int) and n <= MAX_TILE_N:
            block_n = _next_power_of_2(max(n, 1))
        elif form == "tile":
            raise ValueError(f"{ir.name}: the one-tile form needs N <= {MAX_TILE_N} known, got {n}")
    if form is not None and form not in FORMS[ir.kind]:
        raise ValueError(f"{ir.name}: no form {form!r} (forms: {list(FORMS[ir.kind])})")
    sizes, lead = _merge_rows(padded[:-1], [s[: r - 1] for s in strides])
    m = math.prod(sizes)
    args = pointers + list(scalars) + [m, n] + sizes[1:]
    for s, merged in zip(strides, lead):
        args += merged + s[r - 1:]  # a full tensor's column stride after its leading ones
    return LaunchPlan(ir.kind, "tile" if block_n is not None else "general", args, m, n, block_n)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1
