"""The pipeline string: parsing, printing, and which pipeline a compile uses.

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
from dataclasses import dataclass
from typing import Mapping

from . import registry
from .options import Options

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class PassInvocation:
    name: str
    args: tuple[tuple[str, str], ...] = ()  # raw strings, so the pipeline prints back as written

    def __str__(self) -> str:
        if not self.args:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.args) + "}"

    def arg(self, key: str) -> str | None:
        return dict(self.args).get(key)

    def parsed_args(self) -> dict[str, object]:
        parsers = registry.spec(self.name).args
        return {k: parsers[k](v) for k, v in self.args}


@dataclass(frozen=True)
class Pipeline:
    passes: tuple[PassInvocation, ...] = ()

    def __str__(self) -> str:
        return ",".join(str(p) for p in self.passes)

    def __iter__(self):
        return iter(self.passes)

    def __len__(self) -> int:
        return len(self.passes)

    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def get(self, name: str) -> PassInvocation | None:
        return next((p for p in self.passes if p.name == name), None)

    def for_stage(self, stage: str) -> list[PassInvocation]:
        return [p for p in self.passes if stage in registry.spec(p.name).stages]


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
            raise ValueError(f"dsgraph pass '{name}' has no argument '{key}'; accepted: {accepted}")
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
    return Pipeline(passes)


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
    "grad_pool": ("grad_pool", None),
    "data_parallel": ("allreduce", None),
    "bucket_mb": ("allreduce", "bucket_mb"),
    "compress": ("allreduce", "compress"),
    "lower_triton": ("lower_triton", None),
}


def default_pipeline(options: Options) -> Pipeline:
    """The pipeline implied by the options: only built passes, in canonical order."""
    wanted: dict[str, list[tuple[str, str]]] = {"lifetimes": []}
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
    return Pipeline(
        tuple(PassInvocation(n, tuple(wanted[n])) for n in registry.CANONICAL_ORDER if n in wanted)
    )


def _check_consistent(pipeline: Pipeline, options: Options, source: str) -> None:
    for key in sorted(options.explicit):
        if key not in OPTION_TO_PASS:
            continue
        value = getattr(options, key)
        if value in (False, None) or (key == "compress" and value == "none"):
            continue  # an option switched off never contradicts a pipeline
        pass_name, arg = OPTION_TO_PASS[key]
        inv = pipeline.get(pass_name)
        if inv is None:
            raise ValueError(
                f"dsgraph option '{key}' needs the pass '{pass_name}', but the pipeline from {source} "
                f"({str(pipeline)!r}) does not contain it; add it or drop the option "
                f"(DSGRAPH_DISABLE={pass_name} removes it explicitly)"
            )
        if arg is not None and inv.arg(arg) is not None:
            ours = registry.spec(pass_name).args[arg](inv.arg(arg))
            if ours != value:
                raise ValueError(
                    f"dsgraph option '{key}'={value!r} contradicts '{inv}' in the pipeline from {source}"
                )


def _fill_from_options(pipeline: Pipeline, options: Options) -> Pipeline:
    """Give explicit-pipeline passes the arguments the options specify and they omit."""
    out = []
    for inv in pipeline:
        args = list(inv.args)
        for key, (pass_name, arg) in OPTION_TO_PASS.items():
            if pass_name == inv.name and arg and key in options.explicit and inv.arg(arg) is None:
                args.append((arg, str(getattr(options, key))))
        out.append(PassInvocation(inv.name, tuple(args)))
    return Pipeline(tuple(out))


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
                f"DSGRAPH_DISABLE names unknown pass '{name}'; known passes: {', '.join(registry.known_passes())}"
            )
    return Pipeline(tuple(p for p in pipeline if p.name not in disabled))
