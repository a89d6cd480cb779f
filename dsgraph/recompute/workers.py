"""Exact plan evaluations in forked worker processes.

Most of the checkpoint planner's time is ``StepModel.evaluate``: pure Python over integer
ids, about 40 ms a plan for GPT-2-small (bf16, chunked loss; 52 plans of a 2.94 GiB
budget), one plan at a time. The plans of a search phase (the uniform plans, the frontier
points and the prefix mixes, a descent step's trials) do not depend on each other, so they
can be evaluated side by side. Workers are forked once the step model is built: they
inherit it (copy-on-write) and receive only the saved set of each plan, as a list of ids.

Why fork and not threads or a spawned pool: the evaluation holds the GIL throughout, and a
spawned process would have to import torch and rebuild the step model (seconds). Why fork
is safe here: a worker runs only Python over objects it inherited (no imports, no locks of
other threads, no CUDA: the ids are ints, the model a Python structure), with the cyclic
garbage collector off (the planner pauses it; no finalizer of an inherited tensor runs),
and leaves with ``os._exit`` (no atexit handler, no flush of the parent's buffers). Off
Linux, or with one worker, plans are evaluated in the planner's process. A worker that fails is not trusted again: its plans, and every later one, are
evaluated in the planner's process, where the same error then surfaces as itself.

The results are the same objects the planner's process computes (the model is
deterministic; tests/unit/test_planner_workers.py holds plans with and without workers
equal). Measured (docs/BENCHMARKS.md, session 15): GPT-2-small's planning on the H200's
host 7.64 s in-process, 3.97 s with 8 workers (16 CPUs); on 2 CPUs, a 24-layer GPT's
halfway plan 10.88 -> 7.47 s with 2 workers.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import sys
import warnings
from typing import Sequence

from ..analysis.step_model import StepModel, StepPeak

_HEADER = struct.Struct("<Q")
# at most this many workers: past it, forking (tens of ms each for a process holding a
# compiled model) costs more than it saves on a graph's few dozen plans
MAX_WORKERS = 8
ENV = "DSGRAPH_PLANNER_WORKERS"


def default_workers() -> int:
    """``DSGRAPH_PLANNER_WORKERS`` if set, else the CPUs this process may run on, at most
    ``MAX_WORKERS`` (the planning takes seconds, while Inductor's compile workers wait for
    it); 1 (no workers) on one CPU or off Linux (``can_fork``)."""
    raw = os.environ.get(ENV)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{ENV} must be an int >= 1, got {raw!r}") from None
        if value < 1:
            raise ValueError(f"{ENV} must be an int >= 1, got {raw!r}")
        return value if can_fork() else 1
    if not can_fork():
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cpus))


def can_fork() -> bool:
    """Linux only: elsewhere ``fork`` without ``exec`` is unsupported (Windows) or unsafe
    with the system's frameworks (macOS)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _fork() -> int:
    # Python 3.12+ warns (DeprecationWarning) when a process with threads forks: a child
    # may inherit a lock another thread held. A worker takes no such lock (see the module
    # docstring); under ``-W error`` the warning would be raised after the child exists
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _write(fd: int, payload: bytes) -> None:
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data):]


def _read(fd: int) -> bytes | None:
    """One message, or None at end of file."""
    def exactly(n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    header = exactly(_HEADER.size)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    return exactly(n) if n else b""


def _serve(model: StepModel, executor: str, tasks: int, replies: int) -> None:
    while True:
        message = _read(tasks)
        if not message:  # end of file, or the empty message: done
            return
        ids = pickle.loads(message)
        try:
            reply = ("ok", model.evaluate(ids, executor))
        except BaseException as e:  # reported, then evaluated again by the planner's process
            reply = ("error", repr(e))
        _write(replies, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


class Workers:
    """``count`` processes forked now, each holding ``model`` as it is at this moment."""

    def __init__(self, model: StepModel, executor: str, count: int):
        self.model = model
        self.executor = executor
        self.procs: list[tuple[int, int, int]] = []  # (pid, tasks fd, replies fd)
        self.broken = False
        for _ in range(count if can_fork() else 0):
            task_r, task_w = os.pipe()
            reply_r, reply_w = os.pipe()
            pid = _fork()
            if pid == 0:  # the worker
                status = 0
                try:
                    os.close(task_w)
                    os.close(reply_r)
                    _serve(model, executor, task_r, reply_w)
                except BaseException:
                    status = 1
                finally:
                    os._exit(status)
            os.close(task_r)
            os.close(reply_w)
            self.procs.append((pid, task_w, reply_r))

    def evaluate(self, saved: Sequence[list[int]]) -> list[StepPeak]:
        """Each saved set's exact peak, in order."""
        if not self.procs or self.broken or len(saved) < 2:
            return [self.model.evaluate(ids, self.executor) for ids in saved]
        results: list[StepPeak | None] = [None] * len(saved)
        pending = list(range(len(saved)))[::-1]
        busy: dict[int, tuple[int, int]] = {}  # replies fd -> (task index, tasks fd)
        idle = [(w, r) for _, w, r in self.procs]
        while (pending and idle and not self.broken) or busy:
            while pending and idle and not self.broken:
                w, r = idle.pop()
                k = pending.pop()
                try:
                    _write(w, pickle.dumps(list(saved[k]), protocol=pickle.HIGHEST_PROTOCOL))
                except OSError:
                    self.broken = True
                    pending.append(k)
                    break
                busy[r] = (k, w)
            if not busy:
                break
            # poll, not select: a process holding many files has descriptors past select's 1024
            poller = select.poll()
            for fd in busy:
                poller.register(fd, select.POLLIN)
            for r, _ in poller.poll():
                k, w = busy.pop(r)
                message = _read(r)
                reply = pickle.loads(message) if message else ("error", "worker exited")
                if reply[0] == "ok":
                    results[k] = reply[1]
                    idle.append((w, r))
                else:
                    self.broken = True
                    pending.append(k)
        for k in pending:  # after a failure: in this process, where an error shows as itself
            results[k] = self.model.evaluate(saved[k], self.executor)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for pid, w, r in self.procs:
            try:
                _write(w, b"")
            except OSError:
                pass
            os.close(w)
            os.close(r)
        for pid, _, _ in self.procs:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.procs = []

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
