"""``PassSpec``: what a pass declares about itself (stages, analyses, mutation, arguments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

# "pre_grad": Dynamo's graph before AOTAutograd traces it (Python-level calls such as
# F.cross_entropy, autocast visible only in dtypes, no backward yet); the others are
# AOTAutograd's joint graph and the partitioned graphs Inductor compiles
STAGES = ("pre_grad", "joint", "forward", "backward", "inference")
EXECUTORS = ("inductor", "fx")  # what runs the graphs: Inductor's code, or the FX graph itself


@dataclass(frozen=True)
class PassSpec:
    name: str  # also the file name and the dump name
    stages: tuple[str, ...]  # of STAGES
    reads: tuple[str, ...] = ()  # analyses it needs, by class name
    preserves: tuple[str, ...] = ()  # analyses still valid after it changed the graph
    mutates: bool = False  # adds in-place ops / aliasing: runs after functional passes
    # Changes the graph it is given (False: reads it, and at most annotates node.meta under
    # "dsgraph_" keys): a backward whose passes rewrite nothing is the partition's graph,
    # which the session can send to be compiled ahead (compile/ahead.py)
    rewrites: bool = True
    handles_mutation: bool = False  # may run after a pass that ``mutates``
    # The step is wrong without it (the all-reduce): when any pass of a pipeline holding it
    # fails, the failure is raised instead of compiling the graph without dsgraph's passes.
    required: bool = False
    # Passes that must run before it when a pipeline holds both (allreduce reduces the slots
    # grad_pool made: after it, allreduce would find no slots and reduce nothing).
    after: tuple[str, ...] = ()
    # Pipeline arguments it accepts: name -> parser of the raw string in "pass{key=value}".
    args: Mapping[str, Callable[[str], object]] = field(default_factory=dict)
    # The executors whose graphs it can rewrite; naming it for another is an error at
    # pipeline resolution (an option is honoured for the executor that runs, or refused).
    executors: tuple[str, ...] = EXECUTORS
    doc: str = ""
