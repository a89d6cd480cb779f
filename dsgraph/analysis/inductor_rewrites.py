"""Rewrites of the graph that change what Inductor's lowering sees, as the emulation
(``inductor_model.emulate``) applies them: Inductor's own post-grad ``addmm`` fusion, and
the gradient pool's (``dsgraph.passes.grad_pool``) writing of gradients into their slots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .inductor_ops import POINTWISE, REDUCTION, Rules

if TYPE_CHECKING:
    from .inductor_model import Buffer, EmulatedGraph


def into_slot(b: Buffer, o: int, g: EmulatedGraph, rules: Rules) -> None:
    """A pooled gradient's buffer, as the grad_pool pass rewrites the backward: a plain
    ``mm`` read by nothing else becomes ``mm_into_`` (the matmul writes the slot), and a
    pointwise or reduction kernel's result is added into the slot inside that kernel (its
    ``copy_`` fuses): neither allocates, except a reduction's result on a CPU, which stays a
    buffer (``inductor_scheduler``: a bias gradient's sum, freed after its kernel). Another
    kernel's own output (a fallback's, an extern kernel whose result is viewed) is copied
    into the slot: a buffer freed after the copy, which runs right after it.

    Its end is not set here: this runs before fusion places the kernels, when ``b.start``
    is an index among the unfused kernels, and an end set from it was never moved to the
    scheduled clock (each weight gradient of a convolution network's fallback was held as
    many steps past its kernel as fusion had removed before it; session 12). ``emulate``
    sets it to the kernel's step once the kernels are placed."""
    b.output = False
    kind = g.info[b.node].kind
    if kind == REDUCTION and rules.cpu:
        return
    if kind in (POINTWISE, REDUCTION) or (b.node == o and g.info[o].name == "mm" and g.users[o] == 1):
        b.nbytes = 0


def addmm_patterns(g: EmulatedGraph, rules: Rules) -> tuple[set[int], dict[int, tuple[int, int]]]:
    """Inductor's post-grad pass rewrites ``add(mm(a, b), c)`` into ``addmm(c, a, b)``
    (one extern kernel writes the sum; ``c`` must be in memory), when the mm has no other
    user, ``c`` has the mm's dtype, and not on a GPU where every user of the sum is
    pointwise (``is_valid_addmm_fusion``, ``should_prefer_unfused_addmm``).
    Returns (the folded mms, add -> (mm, c))."""
    info = g.info
    absorbed: set[int] = set()
    addmms: dict[int, tuple[int, int]] = {}
    for i in g.order:
        if info[i].name != "add" or len(g.ins[i]) != 2:
            continue
        if not rules.cpu and (not g.pointwise_users or g.pointwise_users[i]):
            continue
        a, b = g.ins[i]
        for mm, inp in ((a, b), (b, a)):
            if (info[mm].name == "mm" and mm not in absorbed and g.users[mm] == 1 and mm != inp
                    and info[inp].dtypes[:1] == info[mm].dtypes[:1] and info[inp].numel <= info[mm].numel):
                absorbed.add(mm)
                addmms[i] = (mm, inp)
                break
    return absorbed, addmms
