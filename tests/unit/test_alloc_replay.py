"""benchmarks.alloc_replay's replay of allocator events (the CUDA part needs a GPU)."""

from benchmarks.alloc_replay import group, replay


def _alloc(addr, size, fn="f"):
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": "/x/graph.py", "line": 1, "name": fn}, {"filename": "lib.so", "line": 0, "name": "c"}]}


def test_replay_finds_the_peak_and_what_is_live_there():
    events = [
        _alloc(1, 100, "a"),
        _alloc(2, 50, "b"),
        {"action": "free_requested", "addr": 1, "size": 100},  # still allocated
        _alloc(3, 30, "c"),  # peak: 10 + 100 + 50 + 30
        {"action": "free_completed", "addr": 1, "size": 100},
        _alloc(4, 60, "d"),  # 10 + 50 + 30 + 60 = 150, below the peak
        {"action": "free_completed", "addr": 99, "size": 5},  # a block from before: ignored
    ]
    peak, live = replay(events, base=10)
    assert peak == 190 and sorted(live) == [1, 2, 3]
    assert group(live) == [(100, "graph.py:1:a"), (50, "graph.py:1:b"), (30, "graph.py:1:c")]
