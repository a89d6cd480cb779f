"""MemoryTimeline: live bytes at every step of a whole training step.

The clock: step 0 is the start of the step, then every step of the forward plan, then
every step of the backward plan, then one last step where autograd hands the gradients to
``.grad`` (or accumulates them into kept ones). What is live (DESIGN.md, ``peak_bytes``):

- ``external``: what exists when the step starts and outlives it: parameters, buffers,
  inputs, gradients kept from earlier steps, a gradient pool: live at every step;
- forward blocks: from their allocation to their last use; a forward output the backward
  receives (a saved activation) lives until its last use in the backward; other forward
  outputs (the loss) until the end;
- backward inputs that are not forward blocks or external (the tangents): from the start
  of the backward to their last use;
- backward blocks: from allocation to last use; its outputs (the gradients) to the end.

``peak_expr`` is the sympy sum of the bytes live at the peak step (an Integer when shapes
are static).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import sympy

from .plan import GraphPlan
from .sweep import live_per_step


@dataclass
class Interval:
    label: str
    nbytes: int
    start: int
    end: int
    expr: Callable[[], sympy.Expr] | None = None

    def bytes_expr(self) -> sympy.Expr:
        return self.expr() if self.expr is not None else sympy.Integer(self.nbytes)


@dataclass
class TimelineEntry:
    graph: str  # "start", "forward", "backward" or "end"
    node: str
    live_bytes: int


@dataclass
class MemoryTimeline:
    entries: list[TimelineEntry] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)

    @property
    def live(self) -> list[int]:
        return [e.live_bytes for e in self.entries]

    def peak_index(self) -> int:
        live = self.live
        return max(range(len(live)), key=live.__getitem__) if live else 0

    @property
    def peak_bytes(self) -> int:
        return self.entries[self.peak_index()].live_bytes if self.entries else 0

    @property
    def peak_entry(self) -> TimelineEntry:
        return self.entries[self.peak_index()]

    def peak_expr(self) -> sympy.Expr:
        i = self.peak_index()
        return sympy.expand(sum((iv.bytes_expr() for iv in self.intervals if iv.start <= i <= iv.end),
                                sympy.Integer(0)))

    def live_at(self, i: int) -> list[Interval]:
        return [iv for iv in self.intervals if iv.start <= i <= iv.end]


def _sweep(labels: list[tuple[str, str]], intervals: Iterable[Interval]) -> list[TimelineEntry]:
    live = live_per_step(len(labels), ((iv.start, iv.end, iv.nbytes) for iv in intervals))
    return [TimelineEntry(graph, node, nbytes) for (graph, node), nbytes in zip(labels, live)]


def stitch(
    forward: GraphPlan,
    backward: GraphPlan | None,
    external: list[Interval],
    saved_names: Iterable[str],
    held_backward_inputs: Callable[[str], bool] = lambda name: name.startswith(("primals", "dsgraph_")),
) -> MemoryTimeline:
    """The whole step from a forward plan, a backward plan (None: forward only) and the
    external intervals (their start/end are ignored: external lives throughout)."""
    saved = set(saved_names)
    f, b = len(forward.steps), len(backward.steps) if backward is not None else 0
    fw0, bw0, end = 1, 1 + f, 1 + f + b  # clock of forward step 0, backward step 0, the end
    labels = [("start", "start")] + [("forward", s) for s in forward.steps]
    if backward is not None:
        labels += [("backward", s) for s in backward.steps]
    labels.append(("end", "grads to .grad" if backward is not None else "outputs"))
    intervals = [Interval(iv.label, iv.nbytes, 0, end, iv.expr) for iv in external]

    bw_last = backward.input_last_use if backward is not None else {}
    for block in forward.blocks:
        start = fw0 + block.start
        if block.end is not None:
            stop = fw0 + block.end
        else:
            uses = [bw_last[name] for name in block.outputs if name in saved and name in bw_last]
            # a last use at len(backward.steps) means the backward wrote an output into it
            stop = min(bw0 + max(max(uses), 0), end) if uses and backward is not None else end
            if uses and any(name not in saved for name in block.outputs):
                stop = end  # also a user output: the caller holds it
        intervals.append(Interval(f"forward:{block.name}", block.nbytes, start, stop, block.expr))

    if backward is not None:
        fw_outputs = {name for block in forward.blocks for name in block.outputs}
        for name, last in backward.input_last_use.items():
            if name in saved or name in fw_outputs or held_backward_inputs(name):
                continue  # forward blocks or external memory, counted already
            nbytes = backward.input_bytes.get(name, 0)
            intervals.append(Interval(f"backward input:{name}", nbytes, bw0, bw0 + max(last, 0),
                                      backward.input_expr.get(name)))
        for block in backward.blocks:
            stop = end if block.end is None else bw0 + block.end
            intervals.append(Interval(f"backward:{block.name}", block.nbytes, bw0 + block.start, stop, block.expr))
    return MemoryTimeline(_sweep(labels, intervals), intervals)
