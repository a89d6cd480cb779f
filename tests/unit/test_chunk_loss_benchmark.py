"""benchmarks.chunk_loss on CPU at tiny size: each part runs its configurations in fresh
processes and writes one JSON with the chunk plan dsgraph reported."""

import json

from benchmarks import chunk_loss


def test_gpt2_part_measures_each_config_and_reports_the_chunks(tmp_path):
    out = tmp_path / "gpt2.json"
    chunk_loss.main(["--part", "gpt2", "--size", "tiny", "--device", "cpu", "--steps", "2", "--no-parity",
                     "--configs", "dsgraph:chunk_loss=2;inductor=false", "--json", str(out)])
    result = json.loads(out.read_text())
    records = result["records"]
    assert [r["config"] for r in records] == ["dsgraph:chunk_loss=2;inductor=false"]
    assert all("error" not in r and r["step_ms"] > 0 for r in records), records
    stats = chunk_loss.chunk_stats(records[0])
    assert stats["chunk_loss_chunks"] == "2" and stats["chunk_loss_logits_bytes"] > 0
    assert "command" in result["environment"]
    assert "| dsgraph:chunk_loss=2;inductor=false |" in chunk_loss.measure_table(records)


def test_capacity_part_probes_batches_in_fresh_processes(tmp_path):
    out = tmp_path / "capacity.json"
    chunk_loss.main(["--part", "capacity", "--size", "tiny", "--device", "cpu", "--steps", "2",
                     "--backends", "dsgraph", "--batches", "3", "--json", str(out)])
    (cap,) = json.loads(out.read_text())["capacity"]
    assert [p["batch"] for p in cap["probes"]] == [3]
    assert all(p["trains"] and p["tokens_per_s"] > 0 for p in cap["probes"]), cap["probes"]
    assert cap["largest_batch"] == 3 and cap["probes"][0]["chunk_loss"]["chunk_loss_sites"] == 1
    assert "| dsgraph | 3 |" in chunk_loss.capacity_table([cap])
