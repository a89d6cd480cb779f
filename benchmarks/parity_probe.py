"""Which pass moves a zoo model's gradients away from float64: one training step of the model
under the fp64 rule of ``dsgraph.testing``, once per variant (eager, stock Inductor, dsgraph
with no pass, each pass of the full pipeline alone, the full pipeline), with TF32 off as the
rule runs it; per variant the worst tensors' RMSE against the float64 step and the ratio
RMSE / (2 * RMSE(eager, fp64) + tol) the rule holds to 1.

    python -m benchmarks.parity_probe resnet18 --json $OUT/parity_resnet18.json   # a GPU
    python -m benchmarks.parity_probe gpt2_style --device cpu --variants inductor,pool

The TF32 settings in force during the steps are printed too (the legacy ``allow_tf32``
flags and, where torch has them, the ``fp32_precision`` settings they map to), since an
eager reference that ran in TF32 would make every compiled variant look more exact than it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from typing import Any

import torch

from dsgraph.testing import _compare, fp32_exact, run_step

from benchmarks.model_zoo import BY_NAME, build, full_options

VARIANTS = ("eager", "inductor", "none", "budget", "pool", "lower", "full")


def _tf32_settings() -> dict[str, Any]:
    out: dict[str, Any] = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                           "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}
    for path in ("cuda.matmul", "cudnn", "cudnn.conv"):
        obj: Any = torch.backends
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "fp32_precision"):
            out[path + ".fp32_precision"] = obj.fp32_precision
    return out


def _variant_fn(name: str, model: torch.nn.Module, full: dict[str, Any]):
    if name == "eager":
        return model
    if name == "inductor":
        return torch.compile(model, backend="inductor")
    options = {"none": {"pipeline": ""},
               "budget": {"memory_budget": full["memory_budget"]},
               "pool": {"grad_pool": True},
               "lower": {"lower_triton": True},
               "full": full}[name]
    return torch.compile(model, backend="dsgraph", options={**options, "fallback": "error"})


def _print_variant(name: str, v: dict[str, Any]) -> None:
    if "error" in v:
        print(f"{name:9s} error: {v['error']}", flush=True)
        return
    worst = ", ".join(f"{w['tensor']} {w['rmse']:.2e}/{w['ref_rmse']:.2e} (x{w['ratio']:.3g})" for w in v["worst"])
    print(f"{name:9s} {v['seconds']:6.1f} s  failed {v['failed']}  worst: {worst}", flush=True)


def probe(model_name: str, device: str, variants: list[str], tol: float = 1e-3, top: int = 4,
          budget: int | None = None) -> dict[str, Any]:
    """Each variant's row is printed as it finishes (a run cut short says what it saw)."""
    model, inputs = build(BY_NAME[model_name], device)
    if budget is None:
        full = full_options(model, inputs)
    else:
        full = {"memory_budget": budget, "grad_pool": True, "lower_triton": True, "fallback": "error"}
    exact_model = copy.deepcopy(model).double()
    eager_model = copy.deepcopy(model)
    with fp32_exact():
        settings = _tf32_settings()
        print("tf32 settings during the steps:", settings, "cudnn enabled", torch.backends.cudnn.enabled,
              "deterministic", torch.backends.cudnn.deterministic, flush=True)
        x64 = tuple(t.double() if t.is_floating_point() else t for t in inputs)
        exact_loss, exact = run_step(exact_model, exact_model, x64, 0)
        ref_loss, ref = run_step(eager_model, eager_model, inputs, 0)
        rows_by_variant: dict[str, Any] = {}
        for name in variants:
            torch._dynamo.reset()
            m = copy.deepcopy(model)
            start = time.perf_counter()
            try:
                loss, grads = run_step(_variant_fn(name, m, full), m, inputs, 0)
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the rest still run
                rows_by_variant[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                _print_variant(name, rows_by_variant[name])
                continue
            rows = [_compare("loss", loss, ref_loss, "fp64", 1e-5, exact_loss, tol)]
            rows += [_compare(n, grads.get(n), ref[n], "fp64", 1e-5, exact.get(n), tol) for n in ref]
            scored = sorted((r for r in rows if r.rmse is not None),
                            key=lambda r: -r.rmse / (2 * r.ref_rmse + tol))
            rows_by_variant[name] = {
                "seconds": round(time.perf_counter() - start, 1),
                "failed": [r.name for r in rows if not r.ok],
                "worst": [{"tensor": r.name, "rmse": r.rmse, "ref_rmse": r.ref_rmse, "exact_rms": r.exact_rms,
                           "ratio": r.rmse / (2 * r.ref_rmse + tol)} for r in scored[:top]],
            }
            _print_variant(name, rows_by_variant[name])
    return {"model": model_name, "device": device, "torch": torch.__version__, "tf32_settings": settings,
            "cudnn": {"enabled": torch.backends.cudnn.enabled, "deterministic": torch.backends.cudnn.deterministic,
                      "benchmark": torch.backends.cudnn.benchmark},
            "full_options": full, "variants": rows_by_variant}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=sorted(BY_NAME))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--budget", type=int, default=None,
                   help="memory_budget in bytes of the budget and full variants (default: half the stock "
                        "peak, found as benchmarks.model_zoo finds it)")
    p.add_argument("--cudnn", default="default", choices=["default", "deterministic", "off"],
                   help="cuDNN for every step of the run (eager, float64 and compiled): as torch sets it, "
                        "deterministic algorithms only, or disabled (torch's own convolutions)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.cudnn == "deterministic":
        torch.backends.cudnn.deterministic = True
    elif args.cudnn == "off":
        torch.backends.cudnn.enabled = False
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    result = probe(args.model, args.device, variants, budget=args.budget)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
