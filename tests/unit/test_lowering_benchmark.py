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


# ---- the profiler's events: device time, kernels and CPU time per call -------------------------

def _event(name, start, end, device="cuda", annotation=False, **props):
    """A stand-in for torch.autograd.profiler_util.FunctionEvent: the attributes the parser reads."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    return SimpleNamespace(name=name, time_range=Interval(start, end), is_user_annotation=annotation,
                           device_type=DeviceType.CUDA if device == "cuda" else DeviceType.CPU, **props)


def test_kernel_profile_sums_device_time_and_lists_each_calls_kernels():
    """Two calls: each launches the region kernel and a copy; the CPU side has the markers, a
    runtime launch event and the GPU side of the markers (annotations), none of which is a kernel."""
    events = []
    for call, t in enumerate((0.0, 1000.0)):
        events += [_event(bench.CALL_MARKER, t, t + 30 + 10 * call, device="cpu", annotation=True),
                   _event("cudaLaunchKernel", t + 5, t + 8, device="cpu"),
                   _event(bench.CALL_MARKER, t + 40, t + 200, annotation=True),  # its GPU-side span
                   _event("dsg_red_abc_tile", t + 50, t + 116),
                   _event("Memcpy DtoD (Device -> Device)", t + 120, t + 130)]
    prof = bench.kernel_profile(events, calls=2)
    assert prof["kernel_us"] == 76.0 and prof["kernels_per_call"] == 2.0
    assert prof["kernel_names"] == ["dsg_red_abc_tile", "Memcpy DtoD (Device -> Device)"]
    assert prof["kernel_us_by_name"] == {"dsg_red_abc_tile": 66.0, "Memcpy DtoD (Device -> Device)": 10.0}
    assert prof["cpu_us"] == 35.0 and prof["profiled_calls"] == 2  # median of 30 and 40


def test_kernel_profile_a_kernel_launched_twice_per_call_is_listed_twice():
    events = [_event("triton_poi_fused_0", 10 * i, 10 * i + 4) for i in range(6)]
    prof = bench.kernel_profile(events, calls=3)
    assert prof["kernel_names"] == ["triton_poi_fused_0"] * 2 and prof["kernels_per_call"] == 2.0
    assert prof["kernel_us"] == 8.0 and prof["cpu_us"] is None


def test_event_device_us_reads_either_torch_releases_name():
    """torch >= 2.4: self_device_time_total; older: self_cuda_time_total; an event whose
    property gives 0 (a profile without use_device) or has neither: its time range."""
    assert bench.event_device_us(_event("k", 0, 9, self_device_time_total=7.0)) == 7.0
    assert bench.event_device_us(_event("k", 0, 9, self_cuda_time_total=6.0)) == 6.0
    assert bench.event_device_us(_event("k", 0, 9, self_device_time_total=0)) == 9.0
    assert bench.event_device_us(_event("k", 0, 9)) == 9.0


def test_kernel_profile_reads_this_torchs_profiler():
    """The profiler of the installed torch (CPU activity only, no CUDA here): the markers
    give one CPU span per call and CPU ops are not counted as kernels; and this torch's own
    FunctionEvent, made as the profiler makes a CUDA kernel's, is a device event whose time
    the accessor reads."""
    import torch
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    kernel = FunctionEvent(id=1, name="dsg_red_abc_tile", thread=0, start_us=100, end_us=166,
                           device_type=DeviceType.CUDA, use_device="cuda")
    assert bench._is_device_event(kernel) and bench.event_device_us(kernel) == 66
    assert bench.kernel_profile([kernel], calls=1)["kernel_names"] == ["dsg_red_abc_tile"]
    x = torch.randn(64, 64)
    prof = bench.profile_calls(lambda: (x * 2).sum(), calls=4, device="cpu")
    assert prof["profiled_calls"] == 4 and prof["cpu_us"] > 0 and prof["launch_us"] > 0
    assert prof["kernels_per_call"] == 0 and prof["kernel_names"] == [] and prof["kernel_us"] == 0


def test_sweep_best_says_whether_each_autotuner_picked_the_fastest_config():
    row = {"config": {"BLOCK_M": 1, "ROWS": 1, "num_warps": 4},
           "dsgraph_inductor_config": {"BLOCK_M": 2, "ROWS": 1, "num_warps": 8},
           "tile_sweep": [{"config": [1, 1, 4], "us": 66.5}, {"config": [2, 1, 8], "us": 67.4}]}
    assert bench.sweep_best(row) == {"sweep_best_config": [1, 1, 4], "sweep_best_us": 66.5,
                                     "config_is_sweep_best": True, "dsgraph_inductor_config_is_sweep_best": False}
    row["dsgraph_inductor_config"] = None  # not readable from Inductor's autotuners
    assert bench.sweep_best(row)["dsgraph_inductor_config_is_sweep_best"] is None
    assert bench.sweep_best({"tile_sweep": []}) == {}


def test_inductor_chosen_config_reads_a_caching_autotuner_down_to_one_launcher():
    """A stand-in CachingAutotuner (made without __init__) holding the launcher Inductor keeps."""
    from types import SimpleNamespace

    import triton
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    tuner = CachingAutotuner.__new__(CachingAutotuner)
    tuner.fn = SimpleNamespace(__name__="dsg_red_test_only_tile")
    tuner.launchers = [SimpleNamespace(config=triton.Config({"BLOCK_M": 4, "ROWS": 1}, num_warps=8))]
    assert bench.inductor_chosen_config("dsg_red_test_only_tile") == {"BLOCK_M": 4, "ROWS": 1, "num_warps": 8}
    assert bench.inductor_chosen_config("dsg_red_no_such_tile") is None
    del tuner
