"""Parity harness: does a dsgraph-compiled training step give the reference's loss and grads?

``check_training_step(model, inputs, options)`` copies the model twice, runs one
forward+backward through the reference (eager by default) and through
``torch.compile(backend="dsgraph", options=options)`` from the same parameters and RNG
seed, and compares the loss and every parameter gradient:

- ``rule="fp32"`` (default): DESIGN.md's fp32 rule, ``||g - g_ref|| / ||g_ref|| <= rtol``
  (1e-5) per tensor, with TF32 off;
- ``rule="fp64"``: Inductor's accuracy rule. A float64 copy of the model runs the same step
  too, and each tensor passes when ``RMSE(g, g_fp64) <= 2 * RMSE(g_ref, g_fp64) + tol``:
  dsgraph may err at most twice as much as the reference does against the exact answer
  (the rule for bf16/fp16, e.g. ``autocast=torch.bfloat16``, where a relative bound on the
  difference from eager says little);
- ``bitwise=True`` (or ``rule="bitwise"``): ``torch.equal`` per tensor (for passes that
  must not change arithmetic; compare against ``reference={"pipeline": "", "inductor": False}``).

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


RULES = ("fp32", "fp64", "bitwise")


@dataclass
class ParityRow:
    name: str
    shape: tuple
    rel_err: float  # ||g - g_ref|| / ||g_ref||
    max_abs: float  # max |g - g_ref|
    ok: bool
    note: str = ""
    rmse: float | None = None  # fp64 rule: RMSE(g, g_fp64)
    ref_rmse: float | None = None  # fp64 rule: RMSE(g_ref, g_fp64)
    exact_rms: float | None = None  # fp64 rule: RMS(g_fp64), the scale a relative tolerance needs


@dataclass
class ParityResult:
    rows: list[ParityRow] = field(default_factory=list)
    rule: str = "fp32"
    rtol: float = 1e-5
    tol: float = 1e-3

    @property
    def bitwise(self) -> bool:
        return self.rule == "bitwise"

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def table(self) -> str:
        fp64 = self.rule == "fp64"
        head = ("tensor", "shape", "rel_err", "max_abs") + (("rmse_vs_fp64", "ref_rmse_vs_fp64") if fp64 else ()) + ("ok",)
        body = []
        for r in self.rows:
            row = (r.name, str(list(r.shape)), f"{r.rel_err:.3e}", f"{r.max_abs:.3e}")
            if fp64:
                row += tuple("-" if v is None else f"{v:.3e}" for v in (r.rmse, r.ref_rmse))
            body.append(row + (("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else ""),))
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
        rule = {"bitwise": "bitwise equality",
                "fp32": f"||g - g_ref|| / ||g_ref|| <= {self.rtol:g}",
                "fp64": f"RMSE(g, g_fp64) <= 2 * RMSE(g_ref, g_fp64) + {self.tol:g}"}[self.rule]
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


def _autocast(inputs: Any, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    devices = [x.device.type for x in _as_tuple(inputs) if isinstance(x, torch.Tensor)]
    return torch.autocast(devices[0] if devices else "cpu", dtype=dtype)


def run_step(fn: Any, model: torch.nn.Module, inputs: Any, seed: int,
             autocast: torch.dtype | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """One forward+backward of ``fn`` (``model`` or a compiled wrapper of it) from grads set
    to None, under ``torch.autocast(dtype=autocast)`` when given; returns the loss and a copy
    of every parameter gradient."""
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    with _autocast(inputs, autocast):
        loss = loss_of(fn(*_as_tuple(inputs)))
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    return loss.detach().clone(), grads


def _to_fp64(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).square().mean().sqrt()) if a.numel() else 0.0


def _compare(name: str, got: torch.Tensor | None, ref: torch.Tensor | None, rule: str, rtol: float,
             exact: torch.Tensor | None = None, tol: float = 1e-3) -> ParityRow:
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
    finite = not (torch.isnan(got).any() or torch.isinf(got).any())
    if rule == "bitwise":
        return ParityRow(name, tuple(got.shape), rel, max_abs, torch.equal(got, ref))
    if rule == "fp32":
        return ParityRow(name, tuple(got.shape), rel, max_abs, bool(rel <= rtol and finite or torch.equal(got, ref)))
    if exact is None:
        return ParityRow(name, tuple(got.shape), rel, max_abs, False, "no float64 reference for this tensor")
    rmse, ref_rmse = _rmse(got, exact), _rmse(ref, exact)
    ok = finite and rmse <= 2 * ref_rmse + tol
    exact_rms = float(exact.double().square().mean().sqrt()) if exact.numel() else 0.0
    return ParityRow(name, tuple(got.shape), rel, max_abs, bool(ok), rmse=rmse, ref_rmse=ref_rmse,
                     exact_rms=exact_rms)


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
    rule: str | None = None,
    autocast: torch.dtype | None = None,
    tol: float = 1e-3,
) -> ParityResult:
    """Compare ``compile_fn(copy_of_model)`` with a reference on one training step; never raises
    on a mismatch (see ``ParityResult.ok``). ``reference``: ``"eager"``, ``"inductor"`` (stock
    backend) or a dict of dsgraph options. ``model`` itself is not modified. ``rule``: one of
    ``RULES`` (default "bitwise" with ``bitwise=True``, else "fp64" under ``autocast``, else
    "fp32").
    """
    rule = rule or ("bitwise" if bitwise else "fp64" if autocast is not None else "fp32")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
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
        ref_loss, ref_grads = run_step(ref_fn, ref_model, inputs, seed, autocast)
        got_loss, got_grads = run_step(compile_fn(test_model), test_model, inputs, seed, autocast)
        exact_loss, exact_grads = None, {}
        if rule == "fp64":  # the exact answer, approximately: eager in float64, no autocast
            exact_model = copy.deepcopy(model).double()
            exact_loss, exact_grads = run_step(exact_model, exact_model, tuple(map(_to_fp64, _as_tuple(inputs))), seed)
    result = ParityResult(rule=rule, rtol=rtol, tol=tol)
    result.rows.append(_compare("loss", got_loss, ref_loss, rule, rtol, exact_loss, tol))
    for name in ref_grads:
        result.rows.append(_compare(name, got_grads.get(name), ref_grads[name], rule, rtol, exact_grads.get(name), tol))
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
    rule: str | None = None,
    autocast: torch.dtype | None = None,
    tol: float = 1e-3,
) -> ParityResult:
    """Compare one training step of ``torch.compile(model, backend="dsgraph", options=options)``
    with a reference; raise ``AssertionError`` with a per-tensor table on a mismatch (rules:
    see the module docstring).

    Dynamo's caches are reset first, so each check compiles afresh (a cached compile from an
    earlier check with other environment settings would make the check vacuous).
    """
    result = training_step_parity(
        model, inputs, lambda m: _compiled(m, "dsgraph", options),
        reference=reference, bitwise=bitwise, rtol=rtol, seed=seed, rule=rule, autocast=autocast, tol=tol,
    )
    if not result.ok:
        raise AssertionError(f"dsgraph training step differs from the reference ({reference}):\n{result.table()}")
    return result


__all__: Sequence[str] = [
    "RULES", "ParityResult", "check_training_step", "fp32_exact", "loss_of", "run_step", "training_step_parity",
]
