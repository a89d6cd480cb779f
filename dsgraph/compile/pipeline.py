"""The pipeline string: parsing, printing, and which pipeline a compile uses.

``Pipeline`` and ``PassInvocation`` (the data) live in ``dsgraph.pass_api``; this module
knows the passes (through the registry), so it parses, checks and resolves.

Grammar: ``name{key=value,...},name,...``; whitespace around items is ignored and the
empty string is the empty pipeline (stock Inductor). ``str(parse(s)) == s`` for any
string written without spaces.

Precedence (``resolve``): ``DSGRAPH_PIPELINE`` replaces the pipeline, else
``options["pipeline"]``, else the default built from the options. An explicit pipeline
that contradicts an option the user passed is an error; ``DSGRAPH_DISABLE`` removes passes
last.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import did_you_mean
from ..pass_api import Options, PassInvocation, Pipeline, validate_options
from . import registry

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside {...}."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if depth > 1:
                raise ValueError(f"dsgraph pipeline {text!r}: nested '{{' at position {i}")
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"dsgraph pipeline {text!r}: unmatched '}}' at position {i}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"dsgraph pipeline {text!r}: unclosed '{{'")
    items.append(text[start:])
    return items


def _parse_item(item: str, text: str) -> PassInvocation:
    item = item.strip()
    if not item:
        raise ValueError(f"dsgraph pipeline {text!r}: empty pass name (stray comma?)")
    name, args = item, ()
    if "{" in item:
        if not item.endswith("}"):
            raise ValueError(f"dsgraph pipeline {text!r}: text after '}}' in {item!r}")
        name, body = item[:-1].split("{", 1)
        name = name.strip()
        pairs = []
        for raw in body.split(","):
            if "=" not in raw:
                raise ValueError(f"dsgraph pipeline {text!r}: argument {raw.strip()!r} of '{name}' is not key=value")
            key, value = (s.strip() for s in raw.split("=", 1))
            pairs.append((key, value))
        args = tuple(pairs)
    if not _NAME_RE.match(name):
        raise ValueError(f"dsgraph pipeline {text!r}: {name!r} is not a pass name")
    spec = registry.spec(name)  # unknown -> ValueError listing known; planned -> NotBuiltError
    seen = set()
    for key, value in args:
        if key not in spec.args:
            accepted = ", ".join(sorted(spec.args)) or "none"
            raise ValueError(f"dsgraph pass '{name}' has no argument '{key}'{did_you_mean(key, spec.args)}; "
                             f"accepted: {accepted}")
        if key in seen:
            raise ValueError(f"dsgraph pass '{name}': argument '{key}' given twice")
        seen.add(key)
        try:
            spec.args[key](value)  # validate now, so errors come at parse time
        except (TypeError, ValueError) as e:
            raise ValueError(f"dsgraph pass '{name}': bad value {value!r} for argument '{key}': {e}") from e
    return PassInvocation(name, args)


def parse(text: str) -> Pipeline:
    if not isinstance(text, str):
        raise ValueError(f"dsgraph pipeline must be a str, got {type(text).__name__}")
    if not text.strip():
        return Pipeline(())
    passes = tuple(_parse_item(item, text) for item in _split_top(text))
    names = [p.name for p in passes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"dsgraph pipeline {text!r}: pass(es) named twice: {', '.join(duplicates)}")
    _check_mutation_order(passes, text)
    _check_after(passes, text)
    return Pipeline(passes)


def _check_after(passes: tuple[PassInvocation, ...], text: str) -> None:
    """A pass runs after the passes its spec names in ``after`` (when the pipeline holds them)."""
    names = [p.name for p in passes]
    for i, inv in enumerate(passes):
        for earlier in registry.spec(inv.name).after:
            if earlier in names[i + 1:]:
                raise ValueError(f"dsgraph pipeline {text!r}: '{inv.name}' must run after '{earlier}' "
                                 f"(it works on what '{earlier}' made); put '{earlier}' first")


def _check_mutation_order(passes: tuple[PassInvocation, ...], text: str) -> None:
    """A pass that adds mutation runs after every pass that assumes a functional graph."""
    mutating: dict[str, str] = {}  # stage -> first mutating pass seen
    for inv in passes:
        spec = registry.spec(inv.name)
        for stage in spec.stages:
            if stage in mutating and not spec.handles_mutation:
                raise ValueError(
                    f"dsgraph pipeline {text!r}: '{inv.name}' assumes a functional graph but runs after "
                    f"'{mutating[stage]}', which adds mutation on the {stage} graph; put it earlier"
                )
        if spec.mutates:
            for stage in spec.stages:
                mutating.setdefault(stage, inv.name)


# option -> (pass it configures, argument of that pass or None when the option only
# switches the pass on). Used to build the default pipeline and to find contradictions.
OPTION_TO_PASS: dict[str, tuple[str, str | None]] = {
    "memory_budget": ("checkpoint", "budget"),
    "chunk_loss": ("chunk_loss", "chunks"),  # True: on, chunk count planned; an int: that many chunks
    "grad_pool": ("grad_pool", None),
    "data_parallel": ("allreduce", None),
    "bucket_mb": ("allreduce", "bucket_mb"),
    "compress": ("allreduce", "compress"),
    "lower_triton": ("lower_triton", None),
    # with inductor=False; through Inductor the option turns on Inductor's own memory
    # planning instead (a config patch of the backend, no pass)
    "arena": ("arena", None),
}


def _executor(options: Options) -> str:
    return "inductor" if options.inductor else "fx"


def _serves(pass_name: str, options: Options) -> bool:
    """Does the pass rewrite graphs for the executor these options choose?"""
    return _executor(options) in registry.spec(pass_name).executors


def _pass_arg(key: str, value: object) -> tuple[str, str | None]:
    """The pass and argument an option sets (chunk_loss='faster' sets chunk_loss's ``choose``)."""
    pass_name, arg = OPTION_TO_PASS[key]
    return (pass_name, "choose") if key == "chunk_loss" and value == "faster" else (pass_name, arg)


def default_pipeline(options: Options) -> Pipeline:
    """The pipeline implied by the options: only built passes, in canonical order."""
    wanted: dict[str, list[tuple[str, str]]] = {"lifetimes": []}
    chunk_loss = options.chunk_loss
    if chunk_loss is True or (chunk_loss == "auto" and options.memory_budget is not None):
        wanted["chunk_loss"] = []  # the pass reads the budget from the checkpoint entry
    elif chunk_loss == "faster":  # without a budget, resolve() refuses it (no checkpoint pass)
        # chunked or not, whichever the checkpoint planner predicts faster (passes/loss_choice.py)
        wanted["chunk_loss"] = [("choose", "faster")]
    elif chunk_loss not in (False, "auto"):
        wanted["chunk_loss"] = [("chunks", str(chunk_loss))]
    if not options.data_parallel and (options.bucket_mb is not None or options.compress != "none"):
        raise ValueError("dsgraph options 'bucket_mb' and 'compress' configure the data-parallel all-reduce: "
                         "set 'data_parallel' too (or name the 'allreduce' pass in the pipeline)")
    if options.memory_budget is not None:
        wanted.setdefault("checkpoint", []).append(("budget", str(options.memory_budget)))
    if options.grad_pool_enabled:
        wanted.setdefault("grad_pool", [])
    if options.data_parallel:
        args = wanted.setdefault("allreduce", [])
        if options.bucket_mb is not None:
            args.append(("bucket_mb", str(options.bucket_mb)))
        if "compress" in options.explicit:
            args.append(("compress", options.compress))
    if options.lower_triton:
        wanted.setdefault("lower_triton", [])
    if options.arena and _serves("arena", options):
        wanted.setdefault("arena", [])
    return Pipeline(
        tuple(PassInvocation(n, tuple(wanted[n])) for n in registry.CANONICAL_ORDER if n in wanted)
    )


def _check_consistent(pipeline: Pipeline, options: Options, source: str) -> None:
    for key in sorted(options.explicit):
        if key not in OPTION_TO_PASS:
            continue
        value = getattr(options, key)
        if value in (False, None, "auto") or (key == "compress" and value == "none"):
            continue  # an option switched off (or left to dsgraph) never contradicts a pipeline
        pass_name, arg = _pass_arg(key, value)
        if pass_name in registry.known_passes() and not _check_built_and_serves(pass_name, options):
            continue  # for this executor the option is not a pass (arena through Inductor)
        inv = pipeline.get(pass_name)
        if inv is None:
            raise ValueError(
                f"dsgraph option '{key}' needs the pass '{pass_name}', but the pipeline from {source} "
                f"({str(pipeline)!r}) does not contain it; add it or drop the option "
                f"(DSGRAPH_DISABLE={pass_name} removes it explicitly)"
            )
        if arg is not None and inv.arg(arg) is not None and not isinstance(value, bool):
            ours = registry.spec(pass_name).args[arg](inv.arg(arg))
            if ours != value:
                raise ValueError(
                    f"dsgraph option '{key}'={value!r} contradicts '{inv}' in the pipeline from {source}"
                )


def _check_built_and_serves(pass_name: str, options: Options) -> bool:
    try:
        return _serves(pass_name, options)
    except NotImplementedError:
        return True  # a planned pass: the pipeline's parse reports it


def _check_executor(pipeline: Pipeline, options: Options) -> None:
    for inv in pipeline:
        spec = registry.spec(inv.name)
        if _executor(options) not in spec.executors:
            served = " or ".join("Inductor (inductor=True)" if e == "inductor" else "FX code (inductor=False)"
                                 for e in spec.executors)
            runs = "Inductor (inductor=True)" if options.inductor else "FX code (inductor=False)"
            raise ValueError(f"dsgraph pass '{inv.name}' rewrites graphs that run as {served}; "
                             f"this compile runs them as {runs}")


def _fill_from_options(pipeline: Pipeline, options: Options) -> Pipeline:
    """Give explicit-pipeline passes the arguments the options specify and they omit."""
    out = []
    for inv in pipeline:
        args = list(inv.args)
        for key in OPTION_TO_PASS:
            pass_name, arg = _pass_arg(key, getattr(options, key))
            switch = isinstance(getattr(options, key), bool)  # True switches the pass on: no argument
            if pass_name == inv.name and arg and key in options.explicit and inv.arg(arg) is None and not switch:
                args.append((arg, str(getattr(options, key))))
        out.append(PassInvocation(inv.name, tuple(args)))
    return Pipeline(tuple(out))


def check_options(options) -> Options:
    """``dsgraph.validate_options``: the options' values (``pass_api.validate_options``) and
    the pipeline they make, as the first compile would check them without ``DSGRAPH_*``
    variables: the pipeline string parses, options that need another option have it, an
    explicit pipeline does not contradict an option, every pass serves the executor."""
    opts = validate_options(options)
    resolve(opts, {})
    return opts


def resolve(options: Options, env: Mapping[str, str]) -> Pipeline:
    if "DSGRAPH_PIPELINE" in env:
        pipeline = parse(env["DSGRAPH_PIPELINE"])
        _check_consistent(pipeline, options, "DSGRAPH_PIPELINE")
        pipeline = _fill_from_options(pipeline, options)
    elif options.pipeline is not None:
        pipeline = parse(options.pipeline)
        _check_consistent(pipeline, options, "options['pipeline']")
        pipeline = _fill_from_options(pipeline, options)
    else:
        pipeline = default_pipeline(options)
    disabled = [n.strip() for n in env.get("DSGRAPH_DISABLE", "").split(",") if n.strip()]
    for name in disabled:
        if name not in registry.known_passes():
            raise ValueError(
                f"DSGRAPH_DISABLE names unknown pass '{name}'{did_you_mean(name, registry.known_passes())}; "
                f"known passes: {', '.join(registry.known_passes())}"
            )
    pipeline = Pipeline(tuple(p for p in pipeline if p.name not in disabled))
    _check_executor(pipeline, options)
    chunk_loss = pipeline.get("chunk_loss")
    if chunk_loss is not None and chunk_loss.arg("choose") == "faster" and pipeline.get("checkpoint") is None:
        raise ValueError(f"dsgraph chunk_loss='faster' (the pass 'chunk_loss{{choose=faster}}') compiles the step "
                         f"with or without the chunked loss, whichever the checkpoint planner predicts to recompute "
                         f"less: it needs memory_budget, and so needs the checkpoint pass in the pipeline, which is "
                         f"{str(pipeline)!r}")
    if options.compile_ahead and not options.inductor:
        raise ValueError("dsgraph option 'compile_ahead' compiles the backward with Inductor in a worker "
                         "process; with inductor=False the graphs run as FX code and nothing is compiled")
    return pipeline
