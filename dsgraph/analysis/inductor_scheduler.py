"""Inductor's scheduler as far as memory goes, on the emulated kernels of
``dsgraph.analysis.inductor_model``: vertical and horizontal fusion groups (buffers a
group writes and reads alone become kernel-local, never allocated) and
``reorder_for_peak_memory`` over the fused kernels (its lpmf, bfs and dfs orders, the
least peak kept). Checked against torch 2.11 to 2.13 (``torch/_inductor/scheduler.py``,
``memory.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import compat
from .inductor_horizontal import fuse_horizontal
from .inductor_ops import POINTWISE, REDUCTION, OpInfo, Rules

if TYPE_CHECKING:
    from .inductor_model import EmulatedGraph, InductorRun

_FUSIBLE = (POINTWISE, REDUCTION)


MAX_FUSION = 64  # config.max_fusion_size


def _fuse_local(run: InductorRun, reads: list[set], g: EmulatedGraph, position: list[int], rules: Rules) -> None:
    """The scheduler's fusion, as far as memory goes. Pointwise and reduction kernels fuse
    with a producer they read element for element over a compatible loop (the same
    elements; a reduction's input or output for its epilogue), and then with kernels that
    share a buffer with them and do not need them (horizontal fusion, Inductor's pair
    rule: ``inductor_horizontal``), as long as the group stays acyclic (no member depends
    on another through a kernel outside it: ``will_fusion_create_cycle``) and within
    ``MAX_FUSION`` kernels. A group runs once everything its members read from outside is
    ready (``position``). A stored result only its own group reads is kernel-local: never
    allocated (``remove_kernel_local_buffers``), except a reduction's on a CPU."""
    buffers = run.buffers
    info = g.info
    kinds = run.kinds
    n = len(run.kernels)
    readers: dict[int, list[tuple[int, object]]] = {}
    for step, loaded in enumerate(reads):
        for b, key in loaded:
            readers.setdefault(b, []).append((step, key))
    deps = [{buffers[b].start for b, _ in reads[k] if buffers[b].start >= 0 and buffers[b].start != k} for k in range(n)]
    parent = list(range(n))
    members: dict[int, list[int]] = {k: [k] for k in range(n)}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def group_acyclic(ra: int, rb: int) -> bool:
        """Would the merged group depend on itself through another group?"""
        low = min(min(members[ra]), min(members[rb]))
        start = {find(d) for r in (ra, rb) for m in members[r] for d in deps[m]} - {ra, rb}
        seen: set[int] = set()
        stack = [q for q in start if max(members[q]) > low]
        while stack:
            q = stack.pop()
            if q in seen:
                continue
            seen.add(q)
            if len(seen) > 4 * MAX_FUSION:
                return False  # too far to tell cheaply: do not fuse
            for d in {find(d) for m in members[q] for d in deps[m]}:
                if d in (ra, rb):
                    return False
                if d != q and d not in seen and max(members[d]) > low:
                    stack.append(d)
        return True

    def try_union(a: int, b: int) -> bool:
        ra, rb = find(a), find(b)
        if ra == rb:
            return True
        merged = members[ra] + members[rb]
        if len(merged) > MAX_FUSION or not group_acyclic(ra, rb):
            return False
        if len(members[ra]) < len(members[rb]):
            ra, rb = rb, ra
        parent[rb] = ra
        members[ra] = merged
        del members[rb]
        return True

    # static ancestors of each kernel, as bit sets (kernels are numbered in lowering order)
    anc = [0] * n
    for k in range(n):
        for d in deps[k]:
            if d < k:
                anc[k] |= anc[d] | (1 << d)

    def through_another(rp: int, rr: int) -> bool:
        """Does the reader group need the producer group through a third group? Then
        ``can_fuse_vertical`` refuses the pair outright ("intermediate nodes between node1
        & node2"): it never becomes a candidate."""
        mask = 0
        for m in members[rp]:
            mask |= 1 << m
        for m in members[rr]:
            for d in deps[m]:
                rd = find(d)
                if rd not in (rp, rr) and any(anc[x] & mask for x in members[rd]):
                    return True
        return False

    refused: list = []  # vertical pairs a cycle through fused groups refused

    def vertical(pairs, defer: list | None) -> None:
        """A producer with the readers that can take its result element for element. On a
        CPU a group holding a reduction takes a reader only by outer-loop fusion, which
        ``CppScheduling.get_fusion_pair_priority`` ranks below every other fusion
        (``defer`` collects those pairs)."""
        for b_start, step in pairs:
            if not (rules.cpu and _other_outer_loop(step, members[find(b_start)], run, info)):
                if defer is not None and rules.cpu and any(kinds[m] == REDUCTION for m in members[find(b_start)]):
                    defer.append((b_start, step))
                elif not try_union(b_start, step):
                    refused.append((b_start, step))

    def still_blocked(pair) -> bool:
        """A refused pair the scheduler keeps as a candidate: it can fuse (size, no third
        group between) but ``will_fusion_create_cycle`` refuses it in every round."""
        rp, rr = find(pair[0]), find(pair[1])
        return (rp != rr and len(members[rp]) + len(members[rr]) <= MAX_FUSION
                and not through_another(rp, rr))

    pairs = []
    for b_index, b in enumerate(buffers):
        if b.input or b.start < 0 or kinds[b.start] not in _FUSIBLE:
            continue
        producer = info[run.kernels[b.start]]
        for step, key in readers.get(b_index, ()):
            reader = info[run.kernels[step]]
            if (key is None and kinds[step] in _FUSIBLE and step != b.start
                    and _compatible(producer, reader, kinds[b.start], kinds[step])
                    # on a CPU a pointwise kernel fuses into a reduction over its elements only
                    # when the reduction's loop is its own (``_why_fuse_nodes``,
                    # COMPATIBLE_REDUCTION): a reduction over trailing dimensions; a column
                    # sum iterates them in another order (a patch encoder's LayerNorm
                    # backward: 256 B low with it fused)
                    and not (rules.cpu and kinds[b.start] == POINTWISE and kinds[step] == REDUCTION
                             and not reader.trailing)):
                pairs.append((b.start, step))
    outer_loop: list = []
    vertical(pairs, outer_loop)
    # horizontal: kernels that share a buffer and do not need each other (inductor_horizontal)
    blocked = fuse_horizontal(run, reads, g, rules, find, members, try_union)
    # The scheduler's rounds take only the candidates of the highest priority
    # (``get_possible_fusions_with_highest_priority``), and ``fuse_nodes`` stops at the
    # first round that fuses nothing: outer-loop fusions run only in a round with no other
    # candidate left. A candidate a cycle refuses stays one in every round, so then none
    # runs (the dropout GPT's smallest plan, tests/e2e/test_checkpoint_dropout_inductor.py:
    # the recomputed final LayerNorm stays a kernel of its own at the end of the backward,
    # where the head's weight gradient reads it, instead of running with the statistics).
    # Made earlier, they also fused two layers' softmax too far apart to fuse horizontally.
    # No horizontal pass follows: an outer-loop group fuses with nothing but by outer loop
    # (``CppScheduling._can_fuse_horizontal_impl`` refuses an ``OuterLoopFusedSchedulerNode``),
    # and the other groups are as the horizontal pass left them (a patch encoder's two
    # LayerNorm backwards were one group, 256 B over Inductor's peak)
    if outer_loop and not blocked and not any(still_blocked(p) for p in refused):
        vertical(outer_loop, None)
    # kernel-local buffers. On a CPU a reduction's result stays a buffer: its readers fuse
    # with it only through outer-loop fusion (``CppScheduling.can_fuse_vertical``: never
    # after a reduction otherwise), whose kernels each remove only their own buffers and
    # whose local buffers leave reductions out (``codegen_outer_loop_node``); Llama's
    # RMSNorm backward keeps ``sum_8``
    for b_index, b in enumerate(buffers):
        if b.input or b.output or b.start < 0 or b.nbytes == 0 or kinds[b.start] not in _FUSIBLE:
            continue
        if rules.cpu and kinds[b.start] == REDUCTION:
            continue
        rs = readers.get(b_index)
        if rs and all(key is None and find(step) == find(b.start) for step, key in rs):
            b.nbytes = 0
            b.removed = True
    # where each group runs: the scheduler's topological sort visits kernels in order and
    # places a group where it meets its first member, after the groups it needs
    placed: set[int] = set()
    order: list[int] = []
    for k in range(n):
        root = find(k)
        if root in placed:
            continue
        stack = [(root, False)]
        visiting: set[int] = set()
        while stack:
            r, ready = stack.pop()
            if r in placed:
                continue
            if ready:
                placed.add(r)
                order.append(r)
                continue
            if r in visiting:
                continue  # a cycle the fusion checks missed: place it where it is met
            visiting.add(r)
            stack.append((r, True))
            needed = sorted({find(d) for m in members[r] for d in deps[m]} - placed - {r} - visiting, reverse=True)
            stack.extend((q, False) for q in needed)
    order = _reorder_for_peak_memory(order, members, find, reads, run, g)
    run.groups = [[run.kernels[m] for m in sorted(members[root])] for root in order]
    for at, root in enumerate(order):
        for m in members[root]:
            position[m] = at


def _reorder_for_peak_memory(order: list[int], members: dict, find, reads: list[set], run: InductorRun,
                             g: EmulatedGraph) -> list[int]:
    """Inductor's ``reorder_for_peak_memory`` on the fused kernels: the scheduler's order,
    a least-peak-memory-first greedy order, a breadth-first and a depth-first one; the
    order of least estimated peak wins (the first of equals). The estimate counts every
    buffer a fused kernel writes (before fusion removes any) and the freeable inputs; on
    torch < 2.13 it is lowered by the outputs not yet made
    (``compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START``)."""
    buffers = run.buffers
    index = {root: k for k, root in enumerate(order)}
    size = {root: 0 for root in order}
    writes: dict[int, int] = {}  # buffer -> its group
    for k, b in enumerate(buffers):
        if b.input or b.kernel < 0:
            continue
        root = find(b.kernel)
        writes[k] = root
        size[root] += b.planned_bytes
    preds: dict[int, set[int]] = {root: set() for root in order}
    succs: dict[int, set[int]] = {root: set() for root in order}
    pred_buffers: dict[int, set[int]] = {root: set() for root in order}
    buffer_succs: dict[int, set[int]] = {}
    for root in order:
        for m in members[root]:
            for b, _ in reads[m]:
                src = writes.get(b)
                if src == root:
                    continue
                if src is None and not buffers[b].freeable_input(g.donated):
                    continue  # not freeable: no memory to track
                pred_buffers[root].add(b)
                buffer_succs.setdefault(b, set()).add(root)
                if src is not None:
                    preds[root].add(src)
                    succs[src].add(root)
    outputs = {k for k, b in enumerate(buffers) if b.output and k in writes}
    freeable = {b for b in buffer_succs if writes.get(b) is None}
    bsize = {k: buffers[k].planned_bytes for k in list(writes) + list(freeable)}

    def estimate(candidate: list[int]) -> int:
        at = {root: k for k, root in enumerate(candidate)}
        delta = [0] * (len(candidate) + 1)
        for b in freeable:
            delta[0] += bsize[b]
            delta[max(at[r] for r in buffer_succs[b]) + 1] -= bsize[b]
        for b, root in writes.items():
            start = at[root]
            delta[start] += bsize[b]
            if b in outputs:
                if compat.PEAK_ESTIMATE_FREES_OUTPUTS_AT_START:
                    delta[0] -= bsize[b]  # torch < 2.13: an output is freed at step 0 (compat)
                continue
            end = max((at[r] for r in buffer_succs.get(b, ())), default=start)
            delta[end + 1] -= bsize[b]
        peak = acc = 0
        for d in delta[:-1]:
            acc += d
            peak = max(peak, acc)
        return peak

    candidates = [order]
    for method in (_lpmf, _bfs, _dfs):
        candidates.append(method(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, outputs,
                                 freeable, writes))
    peaks = [estimate(c) for c in candidates]
    return candidates[peaks.index(min(peaks))]


def _lpmf(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, outputs, freeable, writes):
    """``topological_sort_lpmf``: among the kernels ready to run, one whose outputs fit
    under the peak so far, freeing the most; else the smallest."""
    indegree = {r: len(preds[r]) for r in order}
    outdegree = {b: len(buffer_succs.get(b, ())) + (1 if b in outputs else 0) for b in bsize}
    to_free = {r: 0 for r in order}
    for r in order:
        for b in pred_buffers[r]:
            if outdegree.get(b) == 1:
                to_free[r] += bsize[b]
    for b, root in writes.items():
        if outdegree.get(b, 0) == 0:
            to_free[root] += bsize[b]
    live = sum(bsize[b] for b in freeable)
    out_memory = sum(bsize[b] for b in outputs)
    peak = max(live, out_memory)
    gap = peak - live
    ready = {r for r in order if indegree[r] == 0}
    schedule = []
    while ready:
        pick = min(ready, key=lambda r: (size[r] if size[r] > gap else 0, size[r] - to_free[r], index[r]))
        ready.remove(pick)
        schedule.append(pick)
        live += size[pick]
        peak = max(peak, live)
        live -= to_free[pick]
        gap = peak - live
        for s in succs[pick]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.add(s)
        for b in pred_buffers[pick]:
            outdegree[b] -= 1
            if outdegree[b] == 1:
                for s in buffer_succs.get(b, ()):
                    to_free[s] += bsize[b]
    return schedule if len(schedule) == len(order) else order


def _bfs(order, index, size, preds, succs, *_):
    """``topological_sort_bfs``: the ready kernel whose inputs were made earliest."""
    import heapq

    indegree = {r: len(preds[r]) for r in order}
    done: dict[int, int] = {}
    heap = [([], index[r], r) for r in order if indegree[r] == 0]
    heapq.heapify(heap)
    schedule = []
    while heap:
        _, _, pick = heapq.heappop(heap)
        done[pick] = len(schedule)
        schedule.append(pick)
        for s in succs[pick]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(heap, (sorted({done[p] for p in preds[s]}), index[s], s))
    return schedule if len(schedule) == len(order) else order


def _dfs(order, index, size, preds, succs, pred_buffers, buffer_succs, bsize, *_):
    """``topological_sort_dfs``: kernels visited by the bytes they touch, each after what it needs."""
    weight = {r: size[r] + sum(bsize[b] for b in pred_buffers[r]) for r in order}
    seen: set[int] = set()
    schedule = []
    for start in sorted(order, key=lambda r: (weight[r], index[r])):
        stack = [(start, False)]
        while stack:
            r, ready = stack.pop()
            if ready:
                schedule.append(r)
                continue
            if r in seen:
                continue
            seen.add(r)
            stack.append((r, True))
            for p in sorted(preds[r], key=lambda q: (weight[q], index[q]), reverse=True):
                if p not in seen:
                    stack.append((p, False))
    return schedule if len(schedule) == len(order) else order


def _other_outer_loop(step: int, group: list[int], run: InductorRun, info) -> bool:
    """On a CPU a group with a reduction takes a reader only through outer-loop fusion
    (``CppScheduling.can_fuse_vertical``: ``not node1.is_reduction()`` of the whole group,
    else ``can_fuse_vertical_outer_loop``): a reduction reader whose outer loop is not the
    group's reductions' (another output size) is left out. A ViT's FFN bias gradient (a sum
    over the batch) is not fused into the LayerNorm backward's sums over the features that
    wrote its input."""
    if run.kinds[step] != REDUCTION:
        return False
    numel = info[run.kernels[step]].numel
    return any(run.kinds[m] == REDUCTION and info[run.kernels[m]].numel != numel for m in group)


def _compatible(producer: OpInfo, reader: OpInfo, producer_kind: int, reader_kind: int) -> bool:
    p_loop = producer.loop if producer_kind == REDUCTION else producer.numel
    r_loop = reader.loop if reader_kind == REDUCTION else reader.numel
    if p_loop == r_loop:
        return True
    # a reduction's result read by a pointwise epilogue over the reduction's input or output
    return producer_kind == REDUCTION and reader_kind == POINTWISE and r_loop in (producer.loop, producer.numel)
