"""Inductor's horizontal fusion (kernels that do not depend on each other fused for a
buffer they share), on the emulated kernels of ``dsgraph.analysis.inductor_scheduler``.

Followed from ``Scheduler.fuse_nodes`` (torch 2.11 to 2.13, ``scheduler.py``,
``choices.py``, ``codegen/cpp.py``), as far as memory goes:

- candidates (``get_possible_fusions``): the kernels that use a buffer (read or write it),
  in order, each tried with the next ``max_fusion_buffer_group_pairwise_attempts`` of them;
  sorted by ``score_fusion`` (both reductions or neither, then the bytes they share, then
  how close they are), then fused in that order while each pair still can fuse;
  ``fuse_nodes`` repeats that up to 10 rounds while it fuses anything;
- ``can_fuse`` for two kernels neither of which needs the other: they share at least
  ``score_fusion_memory_threshold`` bytes of the same accesses (``score_fusion_memory``),
  their spans in the original order are at most 64 nodes apart
  (``are_long_distant_nodes``), at most ``max_fusion_size`` kernels together (on a CPU
  ``cpp.max_horizontal_fusion_size``), the fusion cannot raise the peak by keeping apart
  two single-use inputs the wrapper could have reused (``can_fusion_increase_peak_memory``),
  and the loops agree: on a CPU (``CppScheduling._why_fuse_nodes``) two pointwise kernels
  over the same loop sizes, two reductions of the same shape, or a pointwise kernel before
  a reduction over its elements, never a reduction before a pointwise kernel; elsewhere the
  same loop. A kernel's loop runs in the memory order of the buffer it writes
  (``simplify_and_reorder``, ``inductor_ops.loop_shape``), not in the order of its FX
  sizes: Llama's rotated q as the attention backward reads it, (batch, heads, positions,
  head size) with the heads inside the positions, iterates as a contiguous (batch,
  positions, heads, head size) does;
- the original order counts every scheduler node: a multi-output extern kernel is one node
  and one ``MultiOutput`` node per tensor it returns, a CPU concatenation one
  ``ConcatKernel`` node and one node per input (writing it into its slice); that node is
  also a user of the concatenation's buffer, which is then never a single-use input.

Fusing a later kernel into an earlier one runs it early (the scheduler places a fused
kernel where its first member was, after what every member needs): on Llama's smallest
plan another layer's recomputed k is computed in the kernel of this layer's, for their
common read of the rotary table, and lives until its own attention.
"""

from __future__ import annotations

from typing import Callable

from .inductor_ops import CAT, EXTERN, POINTWISE, REDUCTION, Rules

_ROUNDS = 10  # fuse_nodes: at most 10 rounds
_DISTANCE = 64  # are_long_distant_nodes
_PEAK_FACTOR = 32  # can_fusion_increase_peak_memory: the overhead against 32 x the shared bytes


def fuse_horizontal(run, reads: list[set], g, rules: Rules, find: Callable[[int], int], members: dict,
                    try_union: Callable[[int, int], bool]) -> int:
    buffers, kinds, info = run.buffers, run.kinds, g.info
    n = len(run.kernels)
    fusible = [kinds[k] in (POINTWISE, REDUCTION) for k in range(n)]
    # the scheduler's node order (min_order / max_order)
    order: list[int] = []
    at = 0
    for k in range(n):
        order.append(at)
        op = info[run.kernels[k]]
        at += 1 + (len(op.nbytes) if kinds[k] == EXTERN and op.multi else 0)
        if kinds[k] == CAT:  # a ConcatKernel node and one node writing each input into its slice
            at += len(g.ins[run.kernels[k]])
    # ancestors of each kernel, as bit sets
    anc = [0] * n
    for k in range(n):
        a = 0
        for b, _ in reads[k]:
            p = buffers[b].kernel
            if 0 <= p != k and not buffers[b].input:
                a |= anc[p] | (1 << p)
        anc[k] = a
    writes: list[list[int]] = [[] for _ in range(n)]
    for bi, b in enumerate(buffers):
        if not b.input and b.kernel >= 0:
            writes[b.kernel].append(bi)
    reader_count: dict[int, int] = {}
    for k in range(n):
        for b in {b for b, _ in reads[k]}:
            reader_count[b] = reader_count.get(b, 0) + 1
    for k in range(n):  # the ConcatKernel's own node is one of its buffer's users
        if kinds[k] == CAT:
            for b in writes[k]:
                reader_count[b] = reader_count.get(b, 0) + 1

    def nbytes(b: int, key) -> int:
        if key is not None:
            return info[key].bytes
        return buffers[b].planned_bytes if not buffers[b].input else buffers[b].nbytes

    class Group:
        __slots__ = ("mask", "anc", "reads", "writes", "low", "high", "count", "red", "numel", "shape", "single",
                     "trailing")

    groups: dict[int, Group] = {}

    def group(root: int) -> Group:
        got = groups.get(root)
        if got is not None:
            return got
        gr = Group()
        ms = members[root]
        gr.mask = 0
        gr.anc = 0
        gr.reads, gr.writes = set(), set()
        for m in ms:
            gr.mask |= 1 << m
            gr.anc |= anc[m]
            gr.reads |= reads[m]
            gr.writes.update(writes[m])
        gr.anc &= ~gr.mask
        gr.low = min(order[m] for m in ms)
        gr.high = max(order[m] for m in ms)
        gr.count = len(ms)
        red = [m for m in ms if kinds[m] == REDUCTION]
        first = info[run.kernels[red[0] if red else min(ms)]]
        gr.red = (first.numel, first.loop) if red else None
        gr.trailing = first.trailing
        gr.numel = first.numel
        gr.shape = first.shape
        # reused-buffer keys of the single-use buffers it reads (can_fusion_increase_peak_memory)
        gr.single = {(buffers[b].dtype, nbytes(b, None)) for b, _ in gr.reads
                     if reader_count.get(b) == 1 and not buffers[b].input and b not in gr.writes}
        groups[root] = gr
        return gr

    def deps(gr: Group) -> set:
        return {(b, k) for b, k in gr.reads if b not in gr.writes} | {(b, None) for b in gr.writes}

    def shared(g1: Group, g2: Group) -> int:
        return sum(nbytes(b, k) for b, k in deps(g1) & deps(g2))

    def loops_agree(g1: Group, g2: Group) -> bool:
        if not rules.cpu:
            return (g1.red[1] if g1.red else g1.numel) == (g2.red[1] if g2.red else g2.numel)
        if g1.red is None and g2.red is None:
            # the same loop (SAME_VARS_REDUCE), or as many elements in one dimension
            # against the same sizes (COMPATIBLE_RANGES_NO_REDUCTION: ``ranges1 ==
            # ranges2``): both need the loop sizes of the two kernels to agree, in the
            # order of the strides each writes. A k repeated for grouped attention (batch,
            # kv heads, repeats, positions, head size) and a rotated q laid out for the
            # attention (loop: batch, positions, heads, head size) do not fuse; two
            # layers' ks do, and that q with a contiguous (batch, positions, heads, head
            # size) (issue 12: Llama's smallest plan)
            return g1.numel == g2.numel and g1.shape == g2.shape
        if g1.red is not None and g2.red is not None:
            return g1.red == g2.red
        # a pointwise kernel before a reduction over its elements (COMPATIBLE_REDUCTION:
        # the reduction's loop, its output's variables then the reduced ones, is the
        # pointwise kernel's): only a reduction over the trailing dimensions; a column sum
        # (a LayerNorm's weight gradient) iterates the same elements in another order
        return g1.red is None and g1.numel == g2.red[1] and g2.trailing

    def can_fuse(r1: int, r2: int) -> int:
        """The shared bytes when the groups of ``r1`` (the earlier) and ``r2`` can fuse
        horizontally, else 0."""
        g1, g2 = group(r1), group(r2)
        if g1.anc & g2.mask or g2.anc & g1.mask:
            return 0  # one needs the other: vertical, decided by the vertical pass
        if g1.count + g2.count > min(rules.max_fusion, rules.horizontal_size):
            return 0
        if max(abs(g1.low - g2.high), abs(g2.low - g1.high)) > _DISTANCE:
            return 0
        if not loops_agree(g1, g2):
            return 0
        score = shared(g1, g2)
        if score < max(rules.fusion_score, 1):
            return 0
        overhead = sum(nb // max(getattr(dt, "itemsize", 1), 1) for dt, nb in g1.single & g2.single)
        if overhead > _PEAK_FACTOR * score:
            return 0
        return score

    for _ in range(_ROUNDS):
        roots = sorted({find(k) for k in range(n) if fusible[k]}, key=lambda r: group(r).low)
        by_buffer: dict[int, list[int]] = {}
        for r in roots:
            gr = group(r)
            for b in sorted({b for b, _ in gr.reads} | gr.writes):
                by_buffer.setdefault(b, []).append(r)
        candidates = []
        seen: set = set()
        for users in by_buffer.values():
            for x, r1 in enumerate(users):
                for r2 in users[x + 1:x + 1 + rules.fusion_pairs]:
                    if (r1, r2) in seen:
                        continue
                    seen.add((r1, r2))
                    score = can_fuse(r1, r2)
                    if score:
                        g1, g2 = group(r1), group(r2)
                        proximity = -max(abs(g1.low - g2.high), abs(g2.low - g1.high))
                        candidates.append(((g1.red is None) == (g2.red is None), score, proximity, r1, r2))
        candidates.sort(key=lambda c: c[:3], reverse=True)
        fused = False
        refused = 0
        for _, _, _, a, b in candidates:
            r1, r2 = find(a), find(b)
            if r1 == r2 or not can_fuse(r1, r2):
                continue
            g1, g2 = groups.pop(r1), groups.pop(r2)
            if not try_union(r1, r2):
                groups[r1], groups[r2] = g1, g2
                refused += 1
                continue
            fused = True
        if not fused:
            break
    return refused
