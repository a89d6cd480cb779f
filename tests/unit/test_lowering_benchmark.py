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


def test_tile_sweep_runs_every_gpu_tile_config_against_eager():
    """--sweep on the GPU times each one-tile config alone; here (interpreter, tiny sizes, a
    stand-in for the timer) every config the GPU autotuner has for the tile width runs and
    matches eager, the multi-tile ones (next tile loaded while one computes) included."""
    from dsgraph.lowering import kernels

    for name in ("layer_norm", "rms_norm", "softmax"):
        case = next(c for c in bench.CASES if c.name == name)
        built = bench.build(case, "cpu", tiny=True)
        rows = bench.tile_sweep(built, 1, 1e12, device="cpu", tiny=True, bench=lambda fn, **kw: 1.0)
        assert [tuple(r["config"]) for r in rows] == kernels.tile_configs(64), name  # 37 columns
        assert any(r["config"][1] > 1 for r in rows)
        assert all(r["error"] <= 1.0 for r in rows), (name, rows)


def test_the_autotuned_entry_point_is_what_the_launcher_picks():
    for case in bench.CASES:
        built = bench.build(case, "cpu", tiny=True)
        inputs = case.inputs("cpu", tiny=True)
        built.call(inputs)
        form, tuner = bench.chosen(built, inputs)
        assert (form, tuner) == built.compiled.last, case.name
        assert form == ("flat" if built.compiled.ir.kind == "pointwise" else "tile"), case.name
        assert tuner.best_config in tuner.configs


def test_lowering_stats_say_whether_the_region_was_lowered():
    import torch

    case = next(c for c in bench.CASES if c.name == "gelu_bwd")
    compiled = torch.compile(case.fn, backend="dsgraph",
                             options={"inductor": False, "pipeline": "lower_triton{select=all}"})
    inputs = case.inputs("cpu", tiny=True, seed=3)
    before = [t.clone() for t in inputs]
    assert bench.error(case, bench._fn_outputs(case, compiled, inputs), before) <= 1.0
    assert bench.lowering_stats()["lowered"] == 1
