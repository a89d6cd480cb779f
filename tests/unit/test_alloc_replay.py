"""benchmarks.alloc_replay's replay of allocator events (the CUDA part needs a GPU)."""

from benchmarks.alloc_replay import graph_frame, group, native, phase_peaks, replay


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


def test_replay_from_a_start_event_counts_earlier_blocks_as_live():
    """A history recorded from the process's start: the peak of the last step only, with the
    blocks allocated before that step (a library workspace) live at it."""
    events = [_alloc(1, 500, "early"), {"action": "free_completed", "addr": 1, "size": 500},
              _alloc(2, 40, "workspace"), _alloc(3, 100, "step"), {"action": "free_completed", "addr": 3, "size": 100}]
    peak, live = replay(events, base=10, start=2)
    assert peak == 150 and sorted(live) == [2, 3]


def test_native_frames_skip_the_allocator_and_dispatch():
    event = {"frames": [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
                        {"filename": "Blas.cpp", "line": 0, "name": "at::cuda::getCUDABlasLtWorkspace()"},
                        {"filename": "/x/graph.py", "line": 3, "name": "call"}]}
    assert native(event) == "at::cuda::getCUDABlasLtWorkspace()"


def test_phase_peaks_split_the_step_by_the_generated_file_that_ran():
    fw, bw = "c" + "a" * 51 + ".py", "c" + "b" * 51 + ".py"

    def alloc(addr, size, gen):
        return {"action": "alloc", "addr": addr, "size": size,
                "frames": [{"filename": "/x/_ops.py", "line": 1, "name": "op"}, {"filename": f"/tmp/ind/{gen}", "line": 7, "name": "call"}]}

    events = [alloc(1, 100, fw), alloc(2, 50, fw), {"action": "free_completed", "addr": 2, "size": 50},
              alloc(3, 30, bw), {"action": "free_completed", "addr": 1, "size": 100}, alloc(4, 10, bw)]
    peaks = phase_peaks(events, base=5, start=0)
    assert peaks[fw][0] == 155 and sorted(peaks[fw][1]) == [1, 2]
    assert peaks[bw][0] == 135 and sorted(peaks[bw][1]) == [1, 3]
    assert graph_frame(events[0]) == f"{fw}:7"
