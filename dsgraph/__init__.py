"""dsgraph: a torch.compile backend for training.

``torch.compile(model, backend="dsgraph", options={...})`` works without importing this
package (entry point). The public helpers live here; docs/ARCHITECTURE.md maps the package.
"""

from __future__ import annotations

from .version import __version__

from .logs import enable as enable_logging
from .errors import BudgetError, DsgraphBudgetWarning, DsgraphFallbackWarning, NotBuiltError, PassFailure
from .memory import MemoryProfile, memory_profile
from .runtime.pool import GradPool, grad_pool
from .runtime.replicate import ReplicaMismatchError, no_sync, replicate
from .pass_api import Options, Pipeline
from .compile.pipeline import check_options as validate_options, parse as parse_pipeline
from .report.reports import GraphReport, PassRecord, clear_reports, format_table as report_table, reports

__all__ = [
    "__version__",
    "BudgetError",
    "DsgraphBudgetWarning",
    "DsgraphFallbackWarning",
    "GradPool",
    "GraphReport",
    "MemoryProfile",
    "NotBuiltError",
    "Options",
    "PassFailure",
    "PassRecord",
    "Pipeline",
    "ReplicaMismatchError",
    "clear_reports",
    "enable_logging",
    "grad_pool",
    "memory_profile",
    "no_sync",
    "parse_pipeline",
    "report_table",
    "replicate",
    "reports",
    "validate_options",
]
