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


def test_chunk_count_times_the_op_at_each_count_with_its_workspace(tmp_path):
    from benchmarks import chunk_count

    out = tmp_path / "counts.json"
    chunk_count.main(["--device", "cpu", "--shapes", "40x8", "--vocab", "53", "--counts", "1,3", "--reps", "2",
                      "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["chunks"], r["chunk_tokens"]) for r in rows] == [(1, 40), (3, 14)]
    assert all(r["ms"] > 0 and len(r["ms_all"]) == 2 for r in rows)
    assert rows[0]["workspace_bytes"] > rows[1]["workspace_bytes"] > 0  # one large chunk holds more
