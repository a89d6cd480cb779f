"""Exceptions dsgraph raises on purpose, and helpers for their messages.

Option and pipeline mistakes are ``ValueError`` (or ``NotImplementedError`` for features
that are registered but not built); they are never swallowed by the fallback policy. A
pass that finds the user asked for something impossible (a memory budget below what the
graph needs) raises a ``UsageError``, which the pass manager lets through as well.
A pass that fails on a graph raises ``PassFailure``, which the backend either turns into
a warning plus a stock compile (``fallback="inductor"``) or re-raises (``fallback="error"``).
"""

from __future__ import annotations

import difflib
from typing import Iterable, TypeVar

E = TypeVar("E", bound=BaseException)


class NotBuiltError(NotImplementedError):
    """A registered pass or option whose feature is not implemented yet."""


class PassFailure(RuntimeError):
    """A pass raised while rewriting a graph.

    The message names the pass, the graph it ran on and the passes that ran before it,
    so a user can reproduce the failure with ``DSGRAPH_PIPELINE`` set to that prefix.
    """

    def __init__(self, pass_name: str, graph: str, passes_before: list[str], cause: BaseException):
        self.pass_name = pass_name
        self.graph = graph
        self.passes_before = list(passes_before)
        self.cause = cause
        before = ", ".join(self.passes_before) if self.passes_before else "none"
        super().__init__(
            f"dsgraph pass '{pass_name}' failed on graph {graph} "
            f"(passes before it: {before}): {type(cause).__name__}: {cause}"
        )


class UsageError(ValueError):
    """The user asked for something that cannot be done (raised by a pass): a mistake in the
    options, not a failing pass, so the fallback policy never swallows it."""


class BudgetError(UsageError):
    """A memory budget no partition of the graph can meet.

    ``smallest_feasible`` is the least budget, in bytes,
    that the planner can meet for this graph (asking for it gives that plan);
    ``lower_bound`` a peak no partition of the graph goes below, and ``dominated_by`` what
    sets that bound ("gradients", "random" or "kernel").
    """

    def __init__(self, message: str, smallest_feasible: int, lower_bound: int | None = None,
                 dominated_by: str | None = None):
        super().__init__(message)
        self.smallest_feasible = smallest_feasible
        self.lower_bound = lower_bound
        self.dominated_by = dominated_by


def find_cause(e: BaseException | None, cls: type[E]) -> E | None:
    """The first exception of type ``cls`` in ``e``'s cause/context chain: torch wraps what a
    backend raises (``BackendCompilerFailed``), so callers look through the chain."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, cls):
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


class DsgraphFallbackWarning(UserWarning):
    """A pass failed and dsgraph compiled the graph without its passes."""


class DsgraphBudgetWarning(UserWarning):
    """Inductor's plan of the compiled graphs peaks above the memory budget even after the
    second, more conservative plan (the step may use more memory than the budget)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for a close match among ``choices``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
