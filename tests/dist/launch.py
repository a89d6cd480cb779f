"""Start a 2-process gloo job running one scenario of worker.py, bounded by a timeout.

Each process writes its findings as JSON; a process that hangs is killed when the timeout
expires and the test fails with both processes' output, instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(scenario: str, timeout: float, world_size: int = 2, env: dict | None = None,
                worker: Path = WORKER) -> list[dict]:
    """Run ``worker.py scenario`` (or another ``worker`` script taking the same arguments) on
    ``world_size`` ranks; returns each rank's JSON result."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world_size):
            # a fresh Inductor cache for the job, shared by its ranks as under torchrun (one
            # rank compiles a kernel, the other waits on the cache's lock and loads it)
            penv = {**os.environ, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
                    "GROUP_TIMEOUT_S": str(int(timeout))}
            penv = {k: v for k, v in penv.items() if not k.startswith("DSGRAPH_")}
            log = open(Path(tmp) / f"log{rank}.txt", "w+")
            procs.append((subprocess.Popen([sys.executable, str(worker), scenario, str(Path(tmp) / f"out{rank}.json")],
                                           env=penv, stdout=log, stderr=subprocess.STDOUT), log))
        timed_out = False
        try:
            for proc, _ in procs:
                proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        logs = []
        for rank, (proc, log) in enumerate(procs):
            log.seek(0)
            logs.append(f"--- rank {rank} (exit {proc.returncode}) ---\n{log.read()[-6000:]}")
            log.close()
        if timed_out:
            raise AssertionError(f"scenario {scenario!r} did not finish within {timeout} s (a hang?)\n" + "\n".join(logs))
        results = []
        for rank, (proc, _) in enumerate(procs):
            out = Path(tmp) / f"out{rank}.json"
            if proc.returncode != 0 or not out.exists():
                raise AssertionError(f"scenario {scenario!r}: rank {rank} failed\n" + "\n".join(logs))
            results.append(json.loads(out.read_text()))
        return results
