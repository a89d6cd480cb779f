"""One rank of a data-parallel fault scenario (started by tests/dist/launch.py):
``fault_worker.py <scenario> <out.json>``; writes its checks (name, ok, detail) as JSON."""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: models.py

import dsgraph  # noqa: E402
from dsgraph.errors import DsgraphFallbackWarning, PassFailure, find_cause  # noqa: E402
from models import MLP  # noqa: E402

CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def scenario_fail_pass() -> None:
    """The allreduce pass (required) fails, or grad_pool in a data-parallel pipeline: raised
    on every rank whatever ``fallback`` says (a stock compile would train without averaging),
    naming the pass, with no fallback warning; the next compile without the failure trains."""
    for failing in ("allreduce", "grad_pool", "grad_pool@backward"):
        for fallback in ("inductor", "error"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = dsgraph.replicate(MLP())
            os.environ["DSGRAPH_TEST_FAIL_PASS"] = failing
            compiled = torch.compile(model, backend="dsgraph",
                                     options={"inductor": False, "data_parallel": True, "fallback": fallback})
            label = f"{failing} fails, fallback={fallback}"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    compiled(torch.randn(5, 13)).square().mean().backward()
                    check(f"{label}: raised", False, "trained without error")
                except Exception as e:  # torch wraps what the backend raises
                    failure = find_cause(e, PassFailure)
                    name = failing.split("@")[0]
                    check(f"{label}: raised naming the pass", failure is not None and failure.pass_name == name
                          and f"'{name}'" in str(e), f"{type(e).__name__}: {e}"[:800])
            check(f"{label}: no fallback warning",
                  not [w for w in caught if issubclass(w.category, DsgraphFallbackWarning)])
            check(f"{label}: no gradients", all(p.grad is None for p in model.parameters()))
    del os.environ["DSGRAPH_TEST_FAIL_PASS"]
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = dsgraph.replicate(MLP())
    compiled = torch.compile(model, backend="dsgraph", options={"inductor": False, "data_parallel": True})
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(5, 13, generator=g)
    compiled(x).square().mean().backward()
    mine = torch.cat([p.grad.flatten() for p in model.parameters()])
    both = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(both, mine)
    check("afterwards a clean compile trains in step", torch.equal(both[0], both[1]))


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("GROUP_TIMEOUT_S", "120"))))
    try:
        globals()[f"scenario_{scenario}"]()
    except Exception:
        check(f"scenario {scenario} ran to the end", False, traceback.format_exc()[-4000:])
    Path(out).write_text(json.dumps(CHECKS))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
