"""dsgraph: a torch.compile backend for training.

``torch.compile(model, backend="dsgraph", options={...})`` works without importing this
package (entry point). The public helpers live here.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import NotBuiltError, PassFailure
from .memory import MemoryProfile, memory_profile
from .pool import GradPool, grad_pool
from .options import Options, validate_options
from .pipeline import Pipeline, parse as parse_pipeline
from .compile_reports import GraphReport, PassRecord, clear_reports, format_table as report_table, reports

__all__ = [
    "__version__",
    "GradPool",
    "GraphReport",
    "MemoryProfile",
    "NotBuiltError",
    "Options",
    "PassFailure",
    "PassRecord",
    "Pipeline",
    "clear_reports",
    "grad_pool",
    "memory_profile",
    "parse_pipeline",
    "report_table",
    "reports",
    "validate_options",
]
