"""Benchmark configurations written as strings, so a command line reads like the table.

    eager                                  the model as written
    inductor                               torch.compile(backend="inductor")
    inductor:budget=0.5                    ... with torch._functorch.config.activation_memory_budget
    dsgraph                                torch.compile(backend="dsgraph"), default options
    dsgraph:pipeline=;inductor=true        dsgraph options, separated by ';' (values: true/false,
                                           numbers, or text such as 6GiB or a pipeline string)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class Config:
    text: str
    backend: str  # "eager", "inductor" or "dsgraph"
    options: dict[str, Any] = field(default_factory=dict)

    def compile(self, model: torch.nn.Module):
        if self.backend == "eager":
            return model
        if self.backend == "inductor":
            return torch.compile(model, backend="inductor")
        return torch.compile(model, backend="dsgraph", options=dict(self.options))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Settings that must hold while compiling (the budget is read at compile time)."""
        if self.backend == "inductor" and "budget" in self.options:
            import torch._functorch.config as fconfig

            with fconfig.patch(activation_memory_budget=float(self.options["budget"])):
                yield
        else:
            yield


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse(text: str) -> Config:
    backend, _, rest = text.partition(":")
    if backend not in ("eager", "inductor", "dsgraph"):
        raise ValueError(f"config {text!r}: backend must be eager, inductor or dsgraph")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(";")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"config {text!r}: {item!r} is not key=value")
        # a pipeline is text even when it looks like something else (the empty pipeline)
        options[key.strip()] = value if key.strip() == "pipeline" else _value(value.strip())
    if backend == "inductor" and set(options) - {"budget"}:
        raise ValueError(f"config {text!r}: inductor takes only budget=<fraction>")
    if backend == "eager" and options:
        raise ValueError(f"config {text!r}: eager takes no options")
    if backend == "dsgraph":
        import dsgraph

        dsgraph.validate_options(options)  # fail before any model is built
    return Config(text, backend, options)
