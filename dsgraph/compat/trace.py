"""torch's structured trace (``TORCH_TRACE=<dir>``, read by tlparse): dsgraph's graphs and
plans as artifacts next to Inductor's. Checked on torch 2.13 (CPU)."""

from __future__ import annotations

from typing import Callable


def tracing() -> bool:
    """Is a structured trace being written (so building a payload is worth it)?"""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def trace_artifact(name: str, payload: Callable[[], str]) -> None:
    """One text artifact in the structured trace; ``payload`` is called only when tracing."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": "string"}, payload_fn=payload)
