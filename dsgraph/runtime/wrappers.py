"""Compiled graphs at run time: the boxed calling convention and the switch between a
graph and its variants.

AOTAutograd calls a compiled graph with one list of inputs that the graph may clear (so a
backward frees saved activations as it goes): a "boxed" callable. Runtime wrappers take
and return boxed callables.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import compat

Boxed = Callable[[list], Any]


def boxed(fn: Callable[..., Any]) -> Boxed:
    """``fn`` with the boxed calling convention (unchanged when it already has it)."""
    if getattr(fn, "_boxed_call", False):
        return fn
    return compat.make_boxed(fn)


def variant_switch(main: Boxed, variants: Sequence[tuple[Callable[[], bool], Boxed]]) -> Boxed:
    """Run the first variant whose ``use_when()`` is true, else ``main``. Asked at every
    call, so one compile serves both (a backward with or without all-reduces)."""

    def run(args: list) -> Any:
        for use_when, compiled in variants:
            if use_when():
                return compiled(args)
        return main(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
