"""benchmarks.profile_step on CPU: per-kernel times for several configs, one JSON."""

import json

from benchmarks import profile_step


def test_profiles_each_config_into_one_json(tmp_path):
    out = tmp_path / "profile.json"
    profile_step.main(["--workload", "mlp", "--configs", "eager", "dsgraph:inductor=false",
                       "--size", "tiny", "--device", "cpu", "--steps", "2", "--json", str(out)])
    profiles = json.loads(out.read_text())["profiles"]
    assert [p["config"] for p in profiles] == ["eager", "dsgraph:inductor=false"]
    for p in profiles:
        names = [k["name"] for k in p["kernels"]]
        assert p["total_ms"] > 0 and p["time"] == "cpu self"
        assert any(n in ("aten::addmm", "aten::mm") for n in names), names
        assert all(k["per_step"] > 0 and k["ms"] >= 0 for k in p["kernels"])
