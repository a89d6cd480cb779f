"""compile_ahead's worker: one interpreter, started once, that runs dsgraph's compile jobs.

Why not Inductor's own worker (``_SubprocessFxCompile.process_pool()``): that is a
``SubprocPool`` of one, a spawned sidecar that imports torch, then spawns the process that
runs the job, which imports torch again; on the H200 its first job began about 8 s after
it was sent (docs/BENCHMARKS.md, session 17), and on this project's 2-CPU machine 7.7-8.7 s
after the pool was asked for. This worker is one spawned interpreter (one import of torch):
it imports Inductor's compiler and starts its own kernel-compile pool without waiting for
it (kernels generated before that pool answers compile in the worker, as Inductor does in
any process), then reads jobs. A forked worker is not an option: the forking process has
initialised CUDA, and the graph's fake CUDA inputs need it.

Started as ``python -c "from dsgraph.compile.ahead_worker import main; main(READ_FD, WRITE_FD)"``,
never by multiprocessing, so the user's ``__main__`` is not run again in it. Jobs and answers are
pickles on two pipes: ``(job_id, fn, args)`` in, ``(job_id, ok, value)`` out. The worker
exits when the pipe it reads closes (this process exited or shut it down).
"""

from __future__ import annotations

import atexit
import base64
import itertools
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from concurrent.futures import Future
from typing import Any, Callable

_lock = threading.Lock()
_worker: "Worker | None" = None


class WorkerExited(RuntimeError):
    pass


class Worker:
    """This process's side: submit(fn, *args) -> Future of fn(*args) run in the worker."""

    def __init__(self) -> None:
        from .. import compat

        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        key = compat.inductor_ahead.torch_key()
        if key is not None:  # Inductor's source hash: the worker need not hash torch again
            env["DSGRAPH_AHEAD_TORCH_KEY"] = base64.b64encode(key).decode()
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import main; main({child_reads}, {child_writes})"],
            pass_fds=(child_reads, child_writes), env=env)
        os.close(child_reads)
        os.close(child_writes)
        self._send = os.fdopen(parent_writes, "wb")
        self._recv = os.fdopen(parent_reads, "rb")
        self._send_lock = threading.Lock()  # held while a job is written (it can block)
        self._pending_lock = threading.Lock()  # never held across a write: answers are not stalled by one
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        threading.Thread(target=self._read, name="dsgraph-ahead-reader", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None and not self._send.closed

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue the job; sent from a thread, because the write blocks until the worker
        reads it (megabytes for a large graph, while the worker may still be starting)."""
        result: Future = Future()
        job_id = next(self._ids)
        with self._pending_lock:
            self._pending[job_id] = result
        threading.Thread(target=self._write, args=(job_id, fn, args), name="dsgraph-ahead-send",
                         daemon=True).start()
        return result

    def _write(self, job_id: int, fn: Callable[..., Any], args: tuple) -> None:
        try:
            data = pickle.dumps((job_id, fn, args), protocol=pickle.HIGHEST_PROTOCOL)
            with self._send_lock:
                self._send.write(data)
                self._send.flush()
        except BaseException as e:  # noqa: BLE001  reported where the result is read
            self._finish(job_id, False, e)

    def _read(self) -> None:
        while True:
            try:
                job_id, ok, value = pickle.load(self._recv)
            except BaseException:  # noqa: BLE001  EOF: the worker exited
                break
            self._finish(job_id, ok, value)
        code = self.process.wait()
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(WorkerExited(f"dsgraph's compile worker exited (code {code})"))

    def _finish(self, job_id: int, ok: bool, value: Any) -> None:
        with self._pending_lock:
            future = self._pending.pop(job_id, None)
        if future is None:
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def shutdown(self) -> None:
        """Close the worker's input: it exits after the job it runs, or now if idle."""
        with self._send_lock:
            if not self._send.closed:
                self._send.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def worker() -> Worker:
    """The process's worker, started on first use (and again if it exited)."""
    global _worker
    with _lock:
        if _worker is None or not _worker.alive():
            _worker = Worker()
            atexit.register(_worker.shutdown)
        return _worker


def _answer(outbox: Any, job_id: int, ok: bool, value: Any) -> None:
    try:
        data = pickle.dumps((job_id, ok, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001  an unpicklable result or exception
        data = pickle.dumps((job_id, False, RuntimeError(f"{value!r} could not be sent back: {e}")))
    outbox.write(data)
    outbox.flush()


def main(read_fd: int, write_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from .. import compat

    key = os.environ.pop("DSGRAPH_AHEAD_TORCH_KEY", None)
    compat.inductor_ahead.start_worker_compiler(None if key is None else base64.b64decode(key))
    inbox, outbox = os.fdopen(read_fd, "rb"), os.fdopen(write_fd, "wb")
    while True:
        try:
            job_id, fn, args = pickle.load(inbox)
        except EOFError:
            # no atexit: Inductor's would shut its kernel pool down politely (seconds); the
            # pool's sidecar exits on its own when its pipe from here closes
            os._exit(0)
        try:
            _answer(outbox, job_id, True, fn(*args))
        except BaseException as e:  # noqa: BLE001  every failure goes back to the caller
            e.add_note("in dsgraph's compile worker:\n" + traceback.format_exc())
            _answer(outbox, job_id, False, e)
