"""The orders ``StepModel.partition`` emulates: getitems raised to their producer, the
backward reordered as AOTAutograd's ``reordering_to_mimic_autograd_engine`` does, and
recomputation sunk to its first user as ``dsgraph.recompute.partition`` does. Each takes
the ``StepModel`` whose index arrays (``ins``, ``users``, ``tangents``, ...) it reads."""

from __future__ import annotations

import torch


def raise_getitems(model, order: list[int], members: set[int]) -> list[int]:
    out = []
    is_getitem = model.is_getitem
    for i in order:
        if is_getitem[i]:
            continue
        out.append(i)
        for u in model.users[i]:
            if is_getitem[u] and u in members:
                out.append(u)
    return out


def mimic_autograd(model, order: list[int], members: set[int]) -> list[int]:
    """``reordering_to_mimic_autograd_engine``: from the first node that reads a
    tangent, each node is preceded by the nodes it needs that are not placed yet."""
    first = None
    for t in model.tangents:
        for u in model.users[t]:
            if u in members and (first is None or u < first):
                first = u
    if first is None:
        return order
    placed: set[int] = set()
    out: list[int] = []
    ins = model.ins

    def insert(i: int) -> None:
        stack, found = [i], []
        seen = set()
        while stack:
            j = stack.pop()
            if j in seen or j in placed or j not in members:
                continue
            seen.add(j)
            found.append(j)
            stack.extend(ins[j])
        found.sort()
        for j in found:
            placed.add(j)
            out.append(j)

    for i in order:
        if i < first and model.nodes[i].target is torch.ops.aten.copy_.default:
            insert(i)
    for i in order:
        if i >= first:
            insert(i)
    return out


def sink_recomputation(model, order: list[int], members: set[int]) -> list[int]:
    """``dsgraph.recompute.partition.sink_recomputation``: each node that reads no
    tangent moves to just before its first user, in reverse order."""
    tangent_side = set(model.tangents)
    for i in order:
        if any(a in tangent_side for a in model.ins[i]):
            tangent_side.add(i)
    out_id = model.output_id
    bw_outputs = set(model.bwd_outputs)
    gap = 1 << 20
    prev: dict[int, int | None] = {}
    nxt: dict[int, int | None] = {}
    pos: dict[int, int] = {}
    last = None
    for k, i in enumerate(order):
        prev[i], pos[i] = last, k * gap
        if last is not None:
            nxt[last] = i
        last = i
    if last is not None:
        nxt[last] = None
    head = order[0] if order else None
    end_pos = len(order) * gap

    def users_of(i: int) -> list[int]:
        us = [u for u in model.users[i] if u in members]
        if i in bw_outputs:
            us.append(out_id)
        return us

    for i in reversed(order):
        if i in tangent_side or model.impure[i]:
            continue
        us = users_of(i)
        if not us:
            continue
        first = min(us, key=lambda u: pos[u] if u != out_id else end_pos)
        if first == out_id or prev[first] == i:
            continue
        # unlink i
        p, q = prev[i], nxt[i]
        if p is not None:
            nxt[p] = q
        else:
            head = q
        if q is not None:
            prev[q] = p
        # link before first
        before = prev[first]
        prev[i], nxt[i] = before, first
        prev[first] = i
        if before is not None:
            nxt[before] = i
        else:
            head = i
        low = pos[before] if before is not None else pos[first] - gap
        if pos[first] - low < 2:
            k, j = 0, head
            while j is not None:
                pos[j] = k * gap
                k, j = k + 1, nxt[j]
        else:
            pos[i] = (low + pos[first]) // 2
    out, j = [], head
    while j is not None:
        out.append(j)
        j = nxt[j]
    return out
