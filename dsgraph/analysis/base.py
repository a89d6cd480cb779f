"""Analyses: facts about a graph computed on demand and cached in the pass context.

An analysis is a class with ``compute(gm, ctx)``; passes ask for it with
``ctx.analysis(Cls)``. The manager drops cached analyses after a pass that changed the
graph unless the pass's spec lists them in ``preserves``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch


class Analysis:
    name: ClassVar[str] = ""

    @classmethod
    def compute(cls, gm: torch.fx.GraphModule, ctx: Any) -> "Analysis":
        raise NotImplementedError
