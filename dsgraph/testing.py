"""Parity harness: does a dsgraph-compiled training step give the reference's loss and grads?

``check_training_step(model, inputs, options)`` copies the model twice, runs one
forward+backward through the reference (eager by default) and through
``torch.compile(backend="dsgraph", options=options)`` from the same parameters and RNG
seed, and compares the loss and every parameter gradient:

- default: the fp32 rule of DESIGN.md, ``||g - g_ref|| / ||g_ref|| <= rtol`` (1e-5) per
  tensor, with TF32 off;
- ``bitwise=True``: ``torch.equal`` per tensor (for passes that must not change
  arithmetic; compare against ``reference={"pipeline": "", "inductor": False}``).

On a mismatch it raises ``AssertionError`` with a per-parameter table; otherwise it returns
the ``ParityResult`` (whose ``table()`` prints the same table).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from . import compat


@dataclass
class ParityRow:
    name: str
    shape: tuple
    rel_err: float
    max_abs: float
    ok: bool
    note: str = ""


@dataclass
class ParityResult:
    rows: list[ParityRow] = field(default_factory=list)
    bitwise: bool = False
    rtol: float = 1e-5

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def table(self) -> str:
        head = ("tensor", "shape", "rel_err", "max_abs", "ok")
        body = [(r.name, str(list(r.shape)), f"{r.rel_err:.3e}", f"{r.max_abs:.3e}",
                 ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")) for r in self.rows]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(5)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
        rule = "bitwise equality" if self.bitwise else f"||g - g_ref|| / ||g_ref|| <= {self.rtol:g}"
        return f"rule: {rule}\n" + "\n".join(line.rstrip() for line in lines)


def loss_of(output: Any) -> torch.Tensor:
    """A scalar from a model's output: itself, its sum, or a ``loss`` entry if it has one."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else output.sum()
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        if "loss" in output.keys() and output["loss"] is not None:
            return loss_of(output["loss"])
        values = [output[k] for k in output.keys()]
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        raise TypeError(f"cannot make a loss from a model output of type {type(output).__name__}")
    tensors = [loss_of(v) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not tensors:
        raise TypeError("the model output holds no floating-point tensor to make a loss from")
    return torch.stack([t.float() for t in tensors]).sum()


@contextlib.contextmanager
def fp32_exact():
    """TF32 off (DESIGN.md's fp32 rule) and Inductor's random ops drawn like eager's."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        with compat.fallback_random(True):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _as_tuple(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def run_step(fn: Any, model: torch.nn.Module, inputs: Any, seed: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """One forward+backward of ``fn`` (``model`` or a compiled wrapper of it) from grads set
    to None; returns the loss and a copy of every parameter gradient."""
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = loss_of(fn(*_as_tuple(inputs)))
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return loss.detach().clone(), grads


def _compare(name: str, got: torch.Tensor | None, ref: torch.Tensor | None, bitwise: bool, rtol: float) -> ParityRow:
    if got is None or ref is None:
        ok = got is None and ref is None
        shape = tuple((got if got is not None else ref).shape) if (got is not None or ref is not None) else ()
        return ParityRow(name, shape, 0.0 if ok else float("inf"), 0.0, ok,
                         "" if ok else f"grad is None in {'dsgraph' if got is None else 'reference'} only")
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return ParityRow(name, tuple(got.shape), float("inf"), float("inf"), False,
                         f"dsgraph {got.dtype}{list(got.shape)} vs reference {ref.dtype}{list(ref.shape)}")
    diff = (got.double() - ref.double())
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    ref_norm = float(ref.double().norm())
    rel = float(diff.norm()) / ref_norm if ref_norm > 0 else float(diff.norm())
    if bitwise:
        ok = torch.equal(got, ref)
    else:
        ok = rel <= rtol and not (torch.isnan(got).any() or torch.isinf(got).any()) or torch.equal(got, ref)
    return ParityRow(name, tuple(got.shape), rel, max_abs, bool(ok))


def _compiled(model: torch.nn.Module, backend: str, options: Mapping[str, Any] | None):
    return torch.compile(model, backend=backend, options=dict(options) if options else None)


def training_step_parity(
    model: torch.nn.Module,
    inputs: Any,
    compile_fn: Any,
    *,
    reference: str | Mapping[str, Any] = "eager",
    bitwise: bool = False,
    rtol: float = 1e-5,
    seed: int = 0,
) -> ParityResult:
    """Compare ``compile_fn(copy_of_model)`` with a reference on one training step; never raises
    on a mismatch (see ``ParityResult.ok``). ``reference``: ``"eager"``, ``"inductor"`` (stock
    backend) or a dict of dsgraph options. ``model`` itself is not modified.
    """
    compat.reset()
    ref_model = copy.deepcopy(model)
    test_model = copy.deepcopy(model)
    with fp32_exact():
        if reference == "eager":
            ref_fn: Any = ref_model
        elif reference == "inductor":
            ref_fn = _compiled(ref_model, "inductor", None)
        elif isinstance(reference, Mapping):
            ref_fn = _compiled(ref_model, "dsgraph", reference)
        else:
            raise ValueError(f"reference must be 'eager', 'inductor' or a dict of dsgraph options, got {reference!r}")
        ref_loss, ref_grads = run_step(ref_fn, ref_model, inputs, seed)
        got_loss, got_grads = run_step(compile_fn(test_model), test_model, inputs, seed)
    result = ParityResult(bitwise=bitwise, rtol=rtol)
    result.rows.append(_compare("loss", got_loss, ref_loss, bitwise, rtol))
    for name in ref_grads:
        result.rows.append(_compare(name, got_grads.get(name), ref_grads[name], bitwise, rtol))
    return result


def check_training_step(
    model: torch.nn.Module,
    inputs: Any,
    options: Mapping[str, Any] | None = None,
    *,
    reference: str | Mapping[str, Any] = "eager",
    bitwise: bool = False,
    rtol: float = 1e-5,
    seed: int = 0,
) -> ParityResult:
    """Compare one training step of ``torch.compile(model, backend="dsgraph", options=options)``
    with a reference; raise ``AssertionError`` with a per-tensor table on a mismatch.

    Dynamo's caches are reset first, so each check compiles afresh (a cached compile from an
    earlier check with other environment settings would make the check vacuous).
    """
    result = training_step_parity(
        model, inputs, lambda m: _compiled(m, "dsgraph", options),
        reference=reference, bitwise=bitwise, rtol=rtol, seed=seed,
    )
    if not result.ok:
        raise AssertionError(f"dsgraph training step differs from the reference ({reference}):\n{result.table()}")
    return result


__all__: Sequence[str] = [
    "ParityResult", "check_training_step", "fp32_exact", "loss_of", "run_step", "training_step_parity",
]
