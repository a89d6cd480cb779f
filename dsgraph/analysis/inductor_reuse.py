"""Where Inductor's generated code reuses memory, replayed on an emulated run
(``inductor_model.emulate``): a kernel writing its output into a buffer it reads (in-place
updates) and the wrapper's pool of freed buffers. Both merge two buffers into one block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import compat
from .inductor_ops import CAT, POINTWISE, REDUCTION, SCATTER

if TYPE_CHECKING:
    from .inductor_model import EmulatedGraph, InductorRun

@dataclass
class PoolTrace:
    """What ``reuse_pool`` decided, for diagnostics (``benchmarks.planner_gap``): per emulated
    graph (by the run's id) its estimated peak (peak, the node of that step's kernel, the
    step, the steps), and every hand-over asked for (run id, taker node, root node, step
    freed after, step, taker bytes, live bytes holding it meanwhile would reach, the graph's
    estimated peak, taken), and per graph its estimate's curve before any hand-over (run id,
    live bytes per scheduled step, the nodes fused into each scheduled step, and each buffer
    as (node, element, bytes, (start, end, bytes) on the schedule's clock, input, output,
    freeable input))."""
    peaks: list = field(default_factory=list)
    decisions: list = field(default_factory=list)
    curves: list = field(default_factory=list)


# set to a PoolTrace to record; None (the default): nothing kept
POOL_TRACE: PoolTrace | None = None


def reuse_in_place(run: InductorRun, reads: list[set], g: EmulatedGraph, position: list[int]) -> None:
    """A pointwise or reduction kernel writes its output into a buffer it loads element
    for element, of the same bytes, whose last use it is (Inductor's in-place update;
    donated graph inputs included). The two are then one block of memory.

    Inductor's rule (``decide_inplace_update``): the buffer's users left once those that
    already ran and the writer's own ancestors are set aside must be the writer alone, and
    every access to the buffer inside the fused kernel must be at the writer's index. So the
    reductions that read the logits before the loss gradient overwrites them (amax, the sum
    of exponentials, fused into the same kernel, ancestors of the gradient) do not stop it;
    a sibling in the same kernel that is not an ancestor does. Only reductions are set aside
    so far (see ``only_writer_left``)."""
    buffers = run.buffers
    made_at: dict[int, list[int]] = {}
    for k, b in enumerate(buffers):
        if b.kernel >= 0:
            made_at.setdefault(b.kernel, []).append(k)
    root = list(range(len(buffers)))
    readers: dict[int, list[int]] = {}  # buffer -> the kernels that load it
    for s, loaded in enumerate(reads):
        for b in {b for b, _ in loaded}:
            readers.setdefault(b, []).append(s)

    def find(k: int) -> int:
        while root[k] != k:
            root[k] = root[root[k]]
            k = root[k]
        return k

    def is_ancestor(a: int, w: int) -> bool:
        """Is node ``a`` an ancestor of node ``w``? (node ids are in graph order)"""
        stack, seen = [w], {w}
        while stack:
            for j in g.ins[stack.pop()]:
                if j == a:
                    return True
                if j > a and j not in seen:
                    seen.add(j)
                    stack.append(j)
        return False

    def only_writer_left(r: int, step: int, at: int) -> bool:
        writer = run.kernels[step]
        for s in readers.get(r, ()):
            if s == step or position[s] < at:  # the writer, or a kernel that already ran
                continue
            if position[s] > at:
                return False
            # in the writer's fused kernel: a reduction the writer depends on, reading it at
            # the writer's index (the case checked against Inductor; other ancestors that
            # read it, pointwise ones, were emulated in place where Inductor was not, on a
            # gated network's backward: not yet traced, so not taken)
            # over its input's last dimensions (a reduction over others, BatchNorm's over N, H
            # and W, reads it at another index: Inductor's single-index check refuses it)
            if (run.kinds[s] != REDUCTION or not g.info[run.kernels[s]].trailing
                    or any(key is not None for b, key in reads[s] if b == r)
                    or not is_ancestor(run.kernels[s], writer)):
                return False
        return True

    for step in sorted(range(len(run.kernels)), key=position.__getitem__):
        if run.kinds[step] not in (POINTWISE, REDUCTION, SCATTER, CAT):
            continue
        direct = {find(b) for b, key in reads[step] if key is None}
        moved = {find(b) for b, key in reads[step] if key is not None}
        at = position[step]
        for k in made_at.get(step, ()):
            out = buffers[k]
            for r in sorted(direct - moved):
                cand = buffers[r]
                if cand.end != at or cand.output or cand.nbytes != out.nbytes or r == k or cand.removed:
                    continue
                if cand.reused_by < 0 and not only_writer_left(r, step, at):
                    continue
                if cand.input and (cand.slot or cand.node not in g.donated):
                    continue
                cand.reused_by = k
                cand.end, cand.output = out.end, out.output
                out.nbytes = 0
                root[k] = r
                direct.discard(r)
                break
    for node, k in list(run.output_buffers.items()):
        run.output_buffers[node] = find(k)


def peak_estimate(run: InductorRun, donated) -> tuple[int, list[int]]:
    """Inductor's ``memory.estimate_peak_memory`` of the emulated graph before fusion and
    reuse: (its peak, live bytes per step). It sees every scheduler buffer, those fusion
    later makes kernel-local and those written in place included; a freeable input (a
    donated or pooled-gradient one) is live from the start to its last reader; an output
    from its step on, and on torch < 2.13 it is also taken off from step 0
    (``compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START``). The running maximum starts at 0."""
    steps = len(run.kernels)
    delta = [0] * (steps + 2)
    for b in run.buffers:
        start, end, nbytes = b.planned
        if nbytes == 0:
            continue
        if b.input:
            if b.freeable_input(donated) and end >= 0:  # live until its last use
                delta[0] += nbytes
                delta[end + 1] -= nbytes
            continue
        delta[start] += nbytes
        if not b.output:
            delta[max(end, start) + 1] -= nbytes
        elif compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START:
            delta[0] -= nbytes
    curve, acc = [], 0
    for d in delta[:steps]:
        acc += d
        curve.append(acc)
    return max(0, *curve), curve


def reuse_pool(run: InductorRun, g: EmulatedGraph) -> None:
    """The wrapper's buffer pool (``MemoryPlanningState``): a freed buffer goes into a pool
    keyed by its bytes and dtype and is not released; a later allocation of the same key
    takes the most recently freed one if holding it meanwhile keeps the graph's live bytes
    (Inductor's own estimate: buffers and freeable inputs, ``EfficientPeakEstimate``; on
    torch < 2.13 lowered by the outputs not yet made, ``compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START``)
    within the graph's peak, or if it was freed by the step just before. The two are then
    one block, from the first allocation to the last use of the last holder. Only what the
    wrapper allocates takes a freed buffer: a fallback kernel's outputs (the attention ops,
    dsgraph's chunked loss) are allocated by the op, though they join the pool when freed,
    unless Inductor assumes them unaligned (``Buffer.unaligned``: the pool's key holds the
    alignment, and every buffer the wrapper allocates is aligned)."""
    buffers = run.buffers
    steps = len(run.kernels)
    if steps == 0:
        return
    overall, curve = peak_estimate(run, g.donated)
    if POOL_TRACE is not None:
        top = curve.index(overall)
        # the curve is on the schedule's clock (buffers' planned steps); its tail past the
        # schedule holds the last value, so the peak is always a scheduled step
        POOL_TRACE.peaks.append((id(run), overall, run.schedule[top], top, len(run.schedule)))
        POOL_TRACE.curves.append((id(run), list(curve[:len(run.schedule)]), [list(group) for group in run.groups],
                                  [(b.node, b.element, b.nbytes, b.planned, b.input,
                                    b.output, b.freeable_input(g.donated)) for b in run.buffers]))
    allocated_at: dict[int, list[int]] = {}
    ending_at: dict[int, list[int]] = {}
    for k, b in enumerate(buffers):
        if b.input or b.nbytes == 0:
            continue
        allocated_at.setdefault(b.start, []).append(k)
        if not b.output:
            ending_at.setdefault(max(b.end, b.start), []).append(k)
    pool: dict[tuple, list[tuple[int, int]]] = {}  # (bytes, dtype) -> [(block, step freed after)]
    moved: dict[int, int] = {}
    for step in range(steps):
        for k in allocated_at.get(step, ()):
            b = buffers[k]
            if b.self_allocated:
                continue  # the wrapper does not allocate it: no freed buffer is handed to it
            stack = pool.get((b.nbytes, b.dtype))
            if not stack:
                continue
            root, freed = stack.pop()
            need = b.nbytes + max(curve[freed + 1:step], default=0)
            taken = freed + 1 == step or need <= overall
            if POOL_TRACE is not None:
                POOL_TRACE.decisions.append((id(run), b.node, buffers[root].node, freed, step, b.nbytes, need, overall, taken))
            if taken:
                for t in range(freed + 1, step):
                    curve[t] += b.nbytes
                r = buffers[root]
                r.end, r.output = b.end, b.output
                moved[k] = root
                if not b.output:
                    ending_at.setdefault(max(b.end, b.start), []).append(root)
                b.nbytes = 0
            else:
                stack.append((root, freed))
        for k in ending_at.get(step, ()):
            b = buffers[k]
            if b.nbytes == 0 or b.output or max(b.end, b.start) != step:
                continue  # taken over by another buffer, or its block now ends elsewhere
            if b.unaligned:
                continue  # its key says unaligned: no allocation of the wrapper's takes it
            pool.setdefault((b.nbytes, b.dtype), []).append((k, step))
    if moved:
        for node, out in list(run.output_buffers.items()):
            while out in moved:
                out = moved[out]
            run.output_buffers[node] = out
