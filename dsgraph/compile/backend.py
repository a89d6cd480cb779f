"""The torch.compile entry point: ``torch.compile(model, backend="dsgraph", options={...})``.

Registered through the ``torch_dynamo_backends`` entry point, so a fresh interpreter finds
it without ``import dsgraph``. Reads the environment once per compile (the passes never do),
validates the options, and applies the failure policy: with ``fallback="inductor"`` a pass
failure in any stage warns once and the whole graph (forward and backward together) is
compiled with the empty pipeline, which is stock Inductor (or plain FX code with
``inductor=False``); with ``fallback="error"`` the failure is raised. A post-compile check
that asks for another compile (``Recompile``) gets one, from Dynamo's graph, up to the
number of compiles it allows.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
import warnings
from typing import Any, Mapping, Sequence

import torch

from .. import compat, logs
from ..errors import DsgraphFallbackWarning, PassFailure, find_cause
from ..pass_api import CompileConfig, CompileState, Options, Pipeline, Recompile, validate_options
from ..report import capture, dumps, reports
from ..units import format_bytes
from . import registry
from .pipeline import resolve
from .session import CompileSession

log = logging.getLogger("dsgraph")

_ids = itertools.count()
_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()
MAX_WARNED = 1000  # distinct fallback warnings remembered (each is shown once per process)


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
        if len(_warned) >= MAX_WARNED:
            _warned.clear()
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
    logs.configure_from_env(os.environ)
    opts = validate_options(options)
    config = make_config(opts, os.environ)
    if mode not in (None, "default") and not opts.inductor:
        raise ValueError(f"torch.compile(mode={mode!r}) configures Inductor, but dsgraph option inductor=False")
    patches = compat.inductor_mode_options(mode) if opts.inductor else {}
    if opts.inductor and opts.arena:
        patches.update(compat.arena_inductor_patches())  # only inside dsgraph's compile_fx
    if opts.inductor and any(registry.spec(p.name).required for p in config.pipeline):
        # graphs with dsgraph's collectives: Inductor keeps the order the pass planned
        patches.update(compat.collective_order_patches())
    compile_id = f"c{next(_ids):03d}"
    start = time.perf_counter()
    log.info("%s: dsgraph compiling a graph of %d nodes; pipeline '%s' (%s)", compile_id, len(gm.graph.nodes),
             config.pipeline, "Inductor" if opts.inductor else "FX code")
    # Dynamo's graph as it came: compile_fx rewrites the graph it is given, and a fallback
    # or another compile starts over from this copy
    pristine = compat.copy_graph_module(gm) if len(config.pipeline) else None
    session = CompileSession(config, compile_id, patches)
    try:
        while True:
            try:
                compiled = session.compile(gm, example_inputs)
                break
            except Exception as e:
                again = find_cause(e, Recompile)
                if again is None or pristine is None:
                    raise
                if session.attempt >= again.max_compiles:
                    raise PassFailure(again.pass_name, compile_id, [], RuntimeError(
                        f"asked for compile {session.attempt + 1} of at most {again.max_compiles}")) from e
                # keep what the next compile needs, not the exception: its traceback holds this
                # frame and session.compile's, whose example_inputs are the model's real
                # parameters; kept as a local, it made a cycle that outlived the compile and
                # took two gc.collect() passes to free (the model stayed allocated after
                # del + torch._dynamo.reset() + gc.collect())
                pass_name, carry, reason = again.pass_name, again.carry, str(again)
                del again
            log.info("%s: %s; compile %d", compile_id, reason, session.attempt + 1)
            _discard(session, config, compile_id)
            state = CompileState(attempt=session.attempt + 1, carry={**session.state.carry, pass_name: carry})
            session = CompileSession(config, compile_id, patches, state)
            gm = compat.copy_graph_module(pristine)
    except Exception as e:
        failure = find_cause(e, PassFailure)
        if failure is None or pristine is None or opts.fallback != "inductor":
            raise
        required = [p.name for p in config.pipeline if registry.spec(p.name).required]
        if required:
            # without these passes the step computes something else (gradients not averaged
            # over the replicas): no stock fallback, whatever `fallback` says
            log.error("%s: pass '%s' failed; not compiling without dsgraph's passes because the pipeline "
                      "holds %s, which the step needs", compile_id, failure.pass_name, required)
            raise
        reason = str(failure)
        if session.captured is not None:
            session.captured.fallback = reason
        _warn_once(failure)
        log.warning("%s: pass '%s' failed; compiling this graph without dsgraph's passes", compile_id,
                    failure.pass_name)
        del failure  # its traceback holds this frame: not kept as a local (see the Recompile handler)
        return _compile_stock(pristine, example_inputs, config, compile_id, patches, reason)
    _publish(session, config)
    log.info("%s: dsgraph compiled in %.1f s%s", compile_id, time.perf_counter() - start, _summary(session))
    return compiled


def _summary(session: CompileSession) -> str:
    """The figures every compile has: what the forward saves, each graph's FX peak (the
    passes' own figures are in their log lines and in ``dsgraph.reports()``)."""
    parts = []
    for r in session.reports:
        if r.memory.get("saved_activation_bytes") is not None:
            parts.append(f"saved for backward {format_bytes(r.memory['saved_activation_bytes'])}")
        if r.memory.get("peak_bytes") is not None:
            parts.append(f"{r.kind} FX peak {format_bytes(r.memory['peak_bytes'])}")
    return "; " + ", ".join(parts) if parts else ""


def _discard(session: CompileSession, config: CompileConfig, compile_id: str) -> None:
    """Forget a compile that will be redone: its capture entry and dumps."""
    current = capture.current()
    if current is not None and session.captured in current.compiles:
        current.compiles.remove(session.captured)
    if config.dump_dir:
        dumps.remove_graph_dirs(config.dump_dir, compile_id)


def _compile_stock(gm, example_inputs, config: CompileConfig, compile_id: str, patches, reason: str):
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
        r.fallback = reason
    _publish(session, stock)
    return compiled


def _publish(session: CompileSession, config: CompileConfig) -> None:
    for r in session.reports:
        reports.record(r)
        if config.dump_dir:
            dumps.add_report(config.dump_dir, r, str(config.pipeline))
