"""Check a region's kernel against eager before the graph relies on it.

Triton compiles a kernel at its first launch, so a compile failure shows up only when the
kernel runs. ``check_region`` therefore runs it once, on small random inputs shaped like
the region's (same ranks, same broadcast dims, same memory order, every size cut to a few
elements), next to the region's own aten ops run eagerly, and raises
``KernelMismatch`` when they differ (fp32: ``||k - e|| / ||e|| <= 1e-5``; bf16/fp16: 1e-2,
a sanity bound, not the accuracy claim, which the tests make with the bf16 rule). The
entry point the launcher picks for the sample runs first; every other entry point that
can take the sample runs too (``launch_layout.launch_plan``: the flat and general pointwise
kernels, the one-tile and general reductions), since real inputs may pick another; each
with fixed configs (``kernels.check_configs``), not the autotuner::

    check_region(region, binding, compiled)   # raises KernelCompileError / KernelMismatch
"""

from __future__ import annotations

import torch
from torch.fx import Node

from dsgraph import compat

from . import kernels, launch_layout
from .kernel_ir import Binding
from .kernels import CompiledKernel, KernelCompileError
from .regions import Region

SAMPLE_LEADING = 3  # every leading dim that is not 1 becomes this
SAMPLE_LAST = 37  # and the last dim this: not a multiple of any block size


class KernelMismatch(RuntimeError):
    """A kernel ran but disagreed with eager on the check's inputs."""


def tolerance(region: Region) -> float:
    """fp32 rule when everything is fp32/fp64; with a bf16/fp16 tensor anywhere in the region
    eager rounds in between where the kernel does not, so a sanity bound of 1e-2."""
    dtypes = set()
    for n in region.nodes + region.inputs:
        val = n.meta.get("val")
        for v in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(v, torch.Tensor):
                dtypes.add(v.dtype)
    return 1e-2 if dtypes & {torch.float16, torch.bfloat16} else 1e-5


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in fp64 (NaNs must sit at the same places; they are left out)."""
    g, w = got.double(), want.double()
    nan = torch.isnan(w)
    if not torch.equal(nan, torch.isnan(g)):
        return float("inf")
    g, w = g[~nan], w[~nan]
    inf = torch.isinf(w)
    if not torch.equal(g[inf], w[inf]):
        return float("inf")
    g, w = g[~inf], w[~inf]
    denom = w.norm().item()
    return (g - w).norm().item() / (denom if denom > 0 else 1.0)


def _sample_shape(t: torch.Tensor, full: tuple) -> tuple[int, ...]:
    """``t``'s shape with each dim that matches F's cut to the sample size (broadcast dims
    of size 1 stay 1)."""
    out = []
    offset = len(full) - t.dim()
    for d, size in enumerate(t.shape):
        if isinstance(size, int) and size == 1:
            out.append(1)
            continue
        last = offset + d == len(full) - 1
        out.append(min(compat.size_hint(size), SAMPLE_LAST if last else SAMPLE_LEADING))
    return tuple(out)


def _random(shape, dtype: torch.dtype, device, order) -> torch.Tensor:
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, device=device).bool()
    elif not dtype.is_floating_point:
        t = torch.randint(-4, 5, shape, device=device).to(dtype)
    else:
        t = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    if order is not None and len(order) == len(shape):
        t = t.permute(*order).contiguous().permute(*[order.index(d) for d in range(len(order))])
        # the same values, laid out in the graph's memory order
    return t


def _order(t: torch.Tensor) -> list[int] | None:
    strides = [compat.size_hint(s) for s in t.stride()]
    return sorted(range(t.dim()), key=lambda d: (-strides[d], d)) if t.dim() > 1 else None


def sample_inputs(region: Region, binding: Binding) -> tuple[list[torch.Tensor], list[int]]:
    full = tuple(region.full_shape)
    tensors = []
    for node in binding.params:
        t = node.meta["val"]
        tensors.append(_random(_sample_shape(t, full), t.dtype, t.device, _order(t)))
    scalars = [compat.size_hint(n.meta["val"]) for n in binding.scalars]
    return tensors, scalars


def eager(region: Region, binding: Binding, tensors: list[torch.Tensor], scalars: list[int]) -> dict[Node, object]:
    """Run the region's own aten ops on concrete inputs (tensors it writes are written)."""
    env: dict[Node, object] = dict(zip(binding.params, tensors))
    env.update(zip(binding.scalars, scalars))
    for n in region.nodes:
        args = torch.fx.node.map_arg(n.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
        env[n] = n.target(*args, **kwargs)
    return env


def _layouts(region: Region, binding: Binding) -> tuple:
    """What the check's inputs look like besides their values: per tensor, the sample shape
    (broadcast dims stay 1) and memory order. One check per kernel and layout: the
    signature fixes the arithmetic, the layout the indexing."""
    full = tuple(region.full_shape)
    ops = tuple(str(n.target) for n in region.nodes)
    return ops, tuple((_sample_shape(n.meta["val"], full), tuple(_order(n.meta["val"]) or ())) for n in binding.params)


def check_region(region: Region, binding: Binding, compiled: CompiledKernel) -> float:
    """Run the kernel once against eager (once per input layout); returns the largest
    relative error seen."""
    key = _layouts(region, binding)
    if key not in compiled.checked:
        # a compile may have its FakeTensorMode active: these tensors are real
        with compat.real_tensors():
            compiled.checked[key] = _check(region, binding, compiled)
    return compiled.checked[key]


def _forms(compiled: CompiledKernel, tensors: list[torch.Tensor], scalars: list) -> list[str]:
    """The launcher's choice for these inputs first, then every other entry point that could
    run them (the general kernel serves layouts and widths the sample may not have)."""
    full, outs = launch_layout.allocate_outputs(compiled.ir, tensors)
    chosen = launch_layout.launch_plan(compiled.ir, tensors, outs, full, scalars).form
    forms = [chosen]
    for form in compiled.forms:
        if form == chosen:
            continue
        try:
            launch_layout.launch_plan(compiled.ir, tensors, outs, full, scalars, form)
        except ValueError:
            continue
        forms.append(form)
    return forms


def _check(region: Region, binding: Binding, compiled: CompiledKernel) -> float:
    """Every entry point that can run these inputs, with ``kernels.check_configs``, each
    against eager on the same inputs. The autotuner's other configs differ only in block
    sizes; one that needs more resources than the GPU has is dropped by the autotuner."""
    tensors, scalars = sample_inputs(region, binding)
    theirs = [t.clone() for t in tensors]
    env = eager(region, binding, [t.clone() for t in theirs], scalars)
    worst = 0.0
    for form in _forms(compiled, tensors, scalars):
        for config in kernels.check_configs(compiled, form):
            mine = [t.clone() for t in theirs]  # in-place writes start from the same values
            try:
                got = kernels.launch(compiled, mine, scalars, config=config, form=form)
            except Exception as e:  # Triton compiles at the first launch: this is where it fails
                raise KernelCompileError(f"{compiled.name} ({form} form, config {config}): "
                                         f"{type(e).__name__}: {e}") from e
            worst = max(worst, _compare(region, binding, compiled, got, mine, env))
    return worst


def _compare(region: Region, binding: Binding, compiled: CompiledKernel, got: list, tensors: list,
             env: dict) -> float:
    pairs = list(zip(got, [env[n] for n in region.outputs]))
    pairs += [(tensors[binding.params.index(w.args[0])], env[binding.params[binding.params.index(w.args[0])]])
              for w in region.writes]
    worst = 0.0
    for (g, e), name in zip(pairs, [n.name for n in region.outputs] + [w.name for w in region.writes]):
        if g.shape != e.shape or g.dtype != e.dtype:
            raise KernelMismatch(f"{compiled.name}: {name} is {g.dtype} {tuple(g.shape)}, eager "
                                 f"{e.dtype} {tuple(e.shape)}")
        if g.dtype == torch.bool or not g.dtype.is_floating_point:
            # comparisons of values computed in fp32 against eager's rounded ones may flip at
            # ties; more than 1% is a wrong kernel
            wrong = (g != e).double().mean().item()
            if wrong > 0.01:
                raise KernelMismatch(f"{compiled.name}: {name}: {wrong:.1%} of elements differ from eager")
            continue
        err = rel_err(g, e)
        worst = max(worst, err)
        if err > tolerance(region):
            raise KernelMismatch(f"{compiled.name}: {name} differs from eager by {err:.3g} (relative)")
    return worst
