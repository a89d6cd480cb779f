"""The pipeline as data: which passes run, in order, with their raw arguments.

Parsing, printing back and choosing the pipeline for a compile live in the compile
driver (``dsgraph.compile.pipeline``); passes only read a ``Pipeline`` (``ctx.config.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass


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
