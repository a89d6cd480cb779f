"""benchmarks/lowering.py on the CPU: every case forms the one region it is meant to, its
kernel (Triton's interpreter) matches eager, the bytes it counts are the tensors' bytes, and
the script's dry run writes its JSON. The timings need a GPU (the lead runs the script on an
H200); nothing here is timed."""

import json

import pytest
from benchmarks import lowering as bench


@pytest.fixture(autouse=True, scope="module")
def triton_interpreter():
    """Triton's interpreter for this module's kernels (see test_lowering_codegen.py)."""
    import triton

    old = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    yield
    triton.knobs.runtime.interpret = old


@pytest.mark.parametrize("case", bench.CASES, ids=[c.name for c in bench.CASES])
def test_each_case_is_one_region_whose_kernel_matches_eager(case):
    built = bench.build(case, "cpu", tiny=True)
    planned = built.plan.regions[0]
    inputs = case.inputs("cpu", tiny=True)
    # bytes: every input read once, every output (and the written input) written once
    read = sum(t.numel() * t.element_size() for t in inputs)
    outs = bench._as_list(case.fn(*[t.clone() for t in inputs]))
    written = sum(t.numel() * t.element_size() for t in outs) + sum(inputs[i].numel() * inputs[i].element_size()
                                                                     for i in case.mutates)
    assert (planned.bytes_read, planned.bytes_written) == (read, written)
    assert bench.check(built, "cpu", tiny=True) <= 1.0


def test_full_size_cases_move_at_least_256_mb():
    for case in bench.CASES:
        assert bench.full_size_bytes(case) >= 256e6, case.name


def test_dry_run_writes_json(tmp_path):
    out = tmp_path / "lowering.json"
    assert bench.main(["--dry-run", "--cases", "gelu_bwd,bucket_epilogue", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["dry_run"] and [c["case"] for c in data["cases"]] == ["gelu_bwd", "bucket_epilogue"]
    assert all(c["error_vs_allowed"] <= 1.0 and c["kernel"].startswith("dsg_") for c in data["cases"])
