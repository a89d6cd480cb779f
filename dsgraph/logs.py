"""dsgraph's messages go through Python logging, under the logger "dsgraph".

Quiet by default, like torch: warnings reach stderr through Python's last-resort handler,
nothing else. ``DSGRAPH_LOG=info`` (or ``debug``, ``warning``) prints dsgraph's progress: one
line per stage and pass with its time, and a summary per compiled graph. Applications that
configure logging themselves just set the "dsgraph" logger's level.
"""

from __future__ import annotations

import logging
import threading
from typing import Mapping

LOGGER = "dsgraph"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

_lock = threading.Lock()
_handler: logging.Handler | None = None


def configure_from_env(env: Mapping[str, str]) -> None:
    """Honour ``DSGRAPH_LOG`` (read by the backend at each compile; a change takes effect
    at the next compile). An unknown level is an error naming the accepted ones."""
    raw = env.get("DSGRAPH_LOG", "").strip().lower()
    if not raw:
        return
    if raw not in LEVELS:
        raise ValueError(f"DSGRAPH_LOG={raw!r}: accepted levels are {', '.join(LEVELS)}")
    enable(LEVELS[raw])


def enable(level: int = logging.INFO) -> None:
    """Print dsgraph's messages at ``level`` and above to stderr (one handler, added once)."""
    global _handler
    logger = logging.getLogger(LOGGER)
    with _lock:
        if _handler is None:
            _handler = logging.StreamHandler()
            _handler.setFormatter(logging.Formatter("[dsgraph] %(message)s"))
            logger.addHandler(_handler)
            logger.propagate = False  # printed once, not again by a root handler
    logger.setLevel(level)
