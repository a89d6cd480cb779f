"""The torch.compile entry point: ``torch.compile(model, backend="dsgraph", options={...})``.

Registered through the ``torch_dynamo_backends`` entry point, so a fresh interpreter finds
it without ``import dsgraph``. Reads the environment once per compile (the passes never do),
validates the options, and applies the failure policy: with ``fallback="inductor"`` a pass
failure in any stage warns once and the whole graph (forward and backward together) is
compiled with the empty pipeline, which is stock Inductor (or plain FX code with
``inductor=False``); with ``fallback="error"`` the failure is raised.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import warnings
from typing import Any, Mapping, Sequence

import torch

from . import compat, compile_reports, dumps, profiling
from .context import CompileConfig
from .errors import BudgetMiss, PassFailure, find_cause
from .options import Options, validate_options
from .pipeline import Pipeline, resolve
from .session import CompileSession

_ids = itertools.count()
_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


class DsgraphFallbackWarning(UserWarning):
    """A pass failed and dsgraph compiled the graph without its passes."""


def make_config(options: Options, env: Mapping[str, str]) -> CompileConfig:
    pipeline = resolve(options, env)
    return CompileConfig(
        options=options,
        pipeline=pipeline,
        dump_dir=env.get("DSGRAPH_DUMP") or options.dump_dir,
        debug=options.debug or env.get("DSGRAPH_DEBUG", "") not in ("", "0"),
        test_fail_pass=env.get("DSGRAPH_TEST_FAIL_PASS") or None,
    )


def _warn_once(failure: PassFailure) -> None:
    key = (failure.pass_name, f"{type(failure.cause).__name__}: {failure.cause}")
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(
        f"{failure}. dsgraph compiled this graph without its passes (forward and backward "
        f"together); set options={{'fallback': 'error'}} to raise instead.",
        DsgraphFallbackWarning,
        stacklevel=2,
    )


def dsgraph_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    **unexpected: Any,
):
    if unexpected:
        raise ValueError(f"dsgraph backend got unexpected arguments {sorted(unexpected)}; use options={{...}}")
    compat.check_version()
    opts = validate_options(options)
    config = make_config(opts, os.environ)
    if mode not in (None, "default") and not opts.inductor:
        raise ValueError(f"torch.compile(mode={mode!r}) configures Inductor, but dsgraph option inductor=False")
    patches = compat.inductor_mode_options(mode) if opts.inductor else {}
    if opts.inductor and opts.arena:
        patches.update(compat.arena_inductor_patches())  # only inside dsgraph's compile_fx
    compile_id = f"c{next(_ids):03d}"
    fallback_copy = compat.copy_graph_module(gm) if opts.fallback == "inductor" and len(config.pipeline) else None
    # under a memory budget, Inductor's plan is checked against it after compiling; an
    # overrun compiles again from this copy with the overrun reserved (session.py)
    retry_copy = compat.copy_graph_module(gm) if opts.inductor and config.pipeline.get("checkpoint") else None
    session = CompileSession(config, compile_id, patches)
    try:
        while True:
            try:
                compiled = session.compile(gm, example_inputs)
                break
            except Exception as e:
                miss = find_cause(e, BudgetMiss)
                if miss is None or retry_copy is None:
                    raise
            _discard(session, config, compile_id)
            session = CompileSession(config, compile_id, patches, margin=miss.margin, attempt=session.attempt + 1)
            gm = compat.copy_graph_module(retry_copy)
    except Exception as e:
        failure = _find_pass_failure(e)
        if failure is None or fallback_copy is None:
            raise
        if session.captured is not None:
            session.captured.fallback = str(failure)
        _warn_once(failure)
        return _compile_stock(fallback_copy, example_inputs, config, compile_id, patches, failure)
    _publish(session, config)
    return compiled


def _discard(session: CompileSession, config: CompileConfig, compile_id: str) -> None:
    """Forget a compile that will be redone: its capture entry and dumps."""
    capture = profiling.current()
    if capture is not None and session.captured in capture.compiles:
        capture.compiles.remove(session.captured)
    if config.dump_dir:
        dumps.remove_graph_dirs(config.dump_dir, compile_id)


def _find_pass_failure(e: BaseException) -> PassFailure | None:
    """torch may wrap the exception an inner compiler raised; look through the chain."""
    return find_cause(e, PassFailure)


def _compile_stock(gm, example_inputs, config: CompileConfig, compile_id: str, patches, failure: PassFailure):
    stock = CompileConfig(
        options=dataclasses.replace(config.options, arena=False),  # stock: no dsgraph rewrite
        pipeline=Pipeline(()),
        dump_dir=config.dump_dir,
        debug=config.debug,
    )
    if config.dump_dir:
        dumps.remove_graph_dirs(config.dump_dir, compile_id)
    session = CompileSession(stock, compile_id, patches)
    compiled = session.compile(gm, example_inputs)
    for r in session.reports:
        r.fallback = str(failure)
    _publish(session, stock)
    return compiled


def _publish(session: CompileSession, config: CompileConfig) -> None:
    for r in session.reports:
        compile_reports.record(r)
        if config.dump_dir:
            dumps.add_report(config.dump_dir, r, str(config.pipeline))
