"""Where a first step's Triton kernels were compiled: in Inductor's worker pool or in the
compiling process (benchmarks.measure records it for every run on a GPU).

Inductor hands a kernel to its subprocess pool only once the pool has answered a first
dummy job (``AsyncCompile.use_process_pool``: ``_ready_future.done()``); until then each
kernel is compiled in the compiling process, one after the other. A first step whose pool
came up late compiles more kernels serially. Recorded per kernel request: seconds since
the step began, pool or not, the time the request took in the compiling process (the whole
compile when serial, a submission when pooled); and when each graph's lowering began
(``GraphLowering``: the forward's, then the backward's). Counts only; changes nothing,
except with ``BENCH_WAIT_POOL=1`` (an experiment, for any backend): each graph's lowering
first waits until the pool has answered its first job (the future
``use_process_pool`` checks), recorded as
``waited_s``.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator


class Seen(list):
    """(start s, pooled, seconds) per kernel request; ``graphs``: start s of each lowering."""

    graphs: list[float]
    waited: float


@contextlib.contextmanager
def recorded() -> Iterator[Seen]:
    """Within the block: one (start s, pooled, seconds) per ``AsyncCompile.triton`` call."""
    seen = Seen()
    seen.graphs, seen.waited = [], 0.0
    wait = os.environ.get("BENCH_WAIT_POOL") == "1"
    try:
        from torch._inductor.async_compile import AsyncCompile
        from torch._inductor.graph import GraphLowering
    except ImportError:  # no Inductor: nothing to record
        yield seen
        return
    original = AsyncCompile.triton
    original_init = GraphLowering.__init__
    t0 = time.perf_counter()

    def init(self, *args, **kwargs):
        start = time.perf_counter()
        seen.graphs.append(start - t0)
        if wait and not AsyncCompile.use_process_pool() and AsyncCompile._ready_future is not None:
            AsyncCompile._ready_future.result(timeout=120)
            seen.waited += time.perf_counter() - start
        original_init(self, *args, **kwargs)

    def triton(self, *args, **kwargs):
        start = time.perf_counter()
        pooled = bool(type(self).use_process_pool())
        try:
            return original(self, *args, **kwargs)
        finally:
            seen.append((start - t0, pooled, time.perf_counter() - start))

    AsyncCompile.triton = triton
    GraphLowering.__init__ = init
    try:
        yield seen
    finally:
        AsyncCompile.triton = original
        GraphLowering.__init__ = original_init


def summary(seen: Seen) -> dict[str, Any]:
    pooled = [s for s in seen if s[1]]
    serial = [s for s in seen if not s[1]]
    return {
        "pooled": len(pooled),
        "serial": len(serial),
        "serial_s": round(sum(s[2] for s in serial), 3),
        "first_pooled_at_s": round(pooled[0][0], 3) if pooled else None,
        "last_serial_at_s": round(serial[-1][0], 3) if serial else None,
        "graphs_at_s": [round(t, 3) for t in seen.graphs],
        "waited_s": round(seen.waited, 3),
    }
