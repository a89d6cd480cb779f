"""The API a pass is written against: its spec, its context and result, the driver's hooks,
the options and pipeline it may read. Passes import from here, never from the driver."""

from .context import CompileConfig, CompileState, PassContext, PassResult
from .hooks import CompiledStep, GraphVariant, Partitioner, PostCompileCheck, Recompile, RuntimeWrapper
from .options import Options, validate_options
from .pipeline import PassInvocation, Pipeline
from .spec import EXECUTORS, STAGES, PassSpec

__all__ = [
    "EXECUTORS", "STAGES", "CompileConfig", "CompileState", "CompiledStep", "GraphVariant", "Options",
    "Partitioner", "PassContext", "PassInvocation", "PassResult", "PassSpec", "Pipeline", "PostCompileCheck",
    "Recompile", "RuntimeWrapper", "validate_options",
]
