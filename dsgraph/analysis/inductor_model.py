"""inductor_model: Inductor's buffer plan of a graph, emulated from the FX graph alone.

The checkpoint planner weighs thousands of partitions that Inductor has not compiled; it
needs Inductor's plan of each in milliseconds. This module replays the decisions Inductor's
graph lowering makes node by node (torch/_inductor/graph.py ``run_node``, ir.py
``StorageBox``, lowering.py; torch 2.11 to 2.13), on integer ids:

- a pointwise op is an unrealized expression: a set of loads (buffer, index) and of ops;
  a consumer inlines it. Views stay views of what they view;
- an expression is *realized* (written to a buffer) when a kernel Inductor does not
  generate reads it (matmuls, convolutions, attention, fallback kernels:
  ``needs_realized_inputs`` and ``fallbacks``), when it is a graph output, when a reduction
  or a scatter is made of it (the op itself is a buffer; its inputs are fused into it),
  and by the store-or-recompute rules for reuse: with more than one user,
  ``should_realize_on_reuse`` (on CPU any of exp, log, sigmoid, tanh among its ops; more
  than ``realize_opcount_threshold`` ops; more than ``realize_reads_threshold`` loads),
  ``has_exceeded_max_reads`` (more than ``realize_acc_reads_threshold`` loads), and more
  than 100 ops. An expression realized because a later node needs it is computed there,
  right before that node: its loads keep their buffers alive until then;
- a buffer lives from the kernel that writes it to the last kernel that loads it (an
  expression inlined into several kernels is read by each); graph outputs outlive the
  graph; a pointwise or reduction kernel writes into a buffer of the same size that it
  loads element for element and whose last use it is (Inductor's in-place reuse), a
  donated graph input included;
- ``cat`` on CPU is a concat kernel: its unrealized inputs are computed into the output.

- the scheduler (``dsgraph.analysis.inductor_scheduler``): vertical and horizontal fusion
  groups (buffers a group both writes and reads alone become kernel-local, never
  allocated) and its ``reorder_for_peak_memory`` over the fused kernels.

What each node is to the lowering (its kind, the thresholds): ``dsgraph.analysis.inductor_ops``.

Held against Inductor's real plans on the zoo (``dsgraph.recompute.truth``,
tests/e2e/test_checkpoint_zoo.py).

``emulate(graph)`` takes an ``EmulatedGraph`` (node ids in execution order, their inputs,
user counts, outputs) and returns the plan's steps and buffers as ``InductorRun``.
"""

from __future__ import annotations

from typing import Sequence

from .inductor_graph import Buffer, EmulatedGraph, InductorRun  # noqa: F401  (re-exported)
from .inductor_index import IndexMaps
from .inductor_reuse import reuse_in_place, reuse_pool
from .inductor_rewrites import addmm_patterns, into_slot
from .inductor_ops import CAT, EXTERN, GETITEM, MUTATE, POINTWISE, REDUCTION, SCATTER, VIEW, Rules
from .inductor_scheduler import _fuse_local


class _Expr:
    """An unrealized pointwise expression, as Inductor's op counter (``OpCounterCSE``) sees
    it: its loads ((buffer, index map, scheduler key): one per distinct (buffer, map)), its
    terms ((node, index map): each node's ops counted once per index it is evaluated at),
    its constants (one each, whichever node made them), whether any op is "heavy" (the CPU
    realize-on-reuse rule), loads with a non-constant index. The scheduler key is the
    moving view a buffer is read through (None: element for element), what fusion asks."""

    __slots__ = ("loads", "terms", "consts", "ops", "nloads", "heavy", "nontrivial")

    def __init__(self, loads: frozenset, terms: frozenset, consts: frozenset, ops: int, heavy: bool,
                 nontrivial: int, nloads: int):
        self.loads, self.terms, self.consts, self.ops, self.heavy = loads, terms, consts, ops, heavy
        self.nontrivial, self.nloads = nontrivial, nloads

    def copy_at(self, loads: frozenset, terms: frozenset, ops: int, nontrivial: int, nloads: int) -> "_Expr":
        """The same expression read at another index (a copy, not a node's expression: no
        ``__init__``, which the op-count test records)."""
        e = _Expr.__new__(_Expr)
        e.loads, e.terms, e.consts, e.ops, e.heavy, e.nontrivial = loads, terms, self.consts, ops, self.heavy, nontrivial
        e.nloads = nloads
        return e


# views whose lowering stores an unrealized input before viewing it
_REALIZING_VIEWS = frozenset({"as_strided"})


def emulate(g: EmulatedGraph, rules: Rules) -> InductorRun:
    info = g.info
    run = InductorRun([])
    buffers = run.buffers
    reads: list[set] = []  # per kernel step: (buffer, key) it loads
    state: dict[int, tuple] = {}
    maps = g.maps if g.maps is not None else IndexMaps()
    compose = maps.compose
    moved_cache: dict = {}

    def view_step(i: int):
        return info[i].maps[0][0] if info[i].maps else None

    def new_buffer(node: int, nbytes: int, step: int, element: int = 0) -> int:
        dtypes = info[node].dtypes
        buffers.append(Buffer(nbytes, dtypes[element] if element < len(dtypes) else None, step, -1, node, kernel=step,
                              element=element))
        return len(buffers) - 1

    def multi_buffers(node: int, op, step: int) -> tuple:
        """A multi-output op's element buffers (those its lighter form returns, if it runs so)."""
        kept = g.light.get(node)
        return ("multi", {op.elements[k]: new_buffer(node, nb, step, k) for k, nb in enumerate(op.nbytes)
                          if kept is None or op.elements[k] in kept})

    for i in g.inputs:
        b = new_buffer(i, info[i].bytes, -1)
        buffers[b].input = True
        state[i] = ("buf", b)

    def resolve(i: int) -> tuple:
        """("buf", b) | ("view", b, key, map) | ("expr", expr, owner) | ("multi", ...) | ("none",)"""
        st = state.get(i)
        if st is None:
            return ("none",)
        if st[0] == "vexpr":
            r = resolve(st[1])
            if r[0] == "buf":
                return ("view", r[1], i, compose(view_step(i), None))
            if r[0] == "view":
                return ("view", r[1], i, compose(view_step(i), r[3]))
            if r[0] == "expr":
                return ("expr", moved(r[1], view_step(i)), r[2])
            return r
        if st[0] == "expr":
            return ("expr", st[1], i)
        return st

    def moved(e: _Expr, step) -> _Expr:
        """Expression ``e`` read through ``step``: every term and load at the composed index."""
        if step is None:
            return e
        key = (id(e), step)
        hit = moved_cache.get(key)
        if hit is not None and hit[0] is e:
            return hit[1]
        loads = frozenset((b, compose(step, m), k) for b, m, k in e.loads)
        terms = frozenset((n, compose(step, m)) for n, m in e.terms)
        out = e.copy_at(loads, terms, count(terms, loads, e.consts), nontrivial_of(loads), distinct_loads(loads))
        moved_cache[key] = (e, out)
        return out

    # Inductor's counter CSEs an op by its arguments, not by the index it is evaluated at: a
    # node's ops evaluated at two indices are one if every leaf of its expression (a load,
    # an op that reads the index itself) is read at one index from both. Llama's rotary
    # backward reads its sine table at j - 8 and j + 8, both (j mod 8) at the table's
    # leaves: one sine, not two (issue 12, session 28). A term is counted by its node and
    # the composed maps of its leaves, in a fixed order (a - b is not b - a)
    leaves: dict[int, tuple] = {}
    term_keys: dict = {}

    def register(i: int, e: _Expr) -> _Expr:
        if not info[i].reads_index:
            found = {(0, b, m) for b, m, _ in e.loads} | {(1, t, m) for t, m in e.terms if info[t].reads_index}
            leaves[i] = tuple(sorted(found, key=lambda x: (x[0], x[1], -1 if x[2] is None else x[2])))
        return e

    def term_key(n: int, m) -> tuple:
        key = (n, m)
        got = term_keys.get(key)
        if got is None:
            own = leaves.get(n)
            got = key if own is None else (n, tuple((kind, x, maps.then(m, lm)) for kind, x, lm in own))
            term_keys[key] = got
        return got

    # Inductor's counter takes a load once per (buffer, index expression), the index over
    # the buffer's memory: two reads at two elements of a fixed layout can be one address.
    # Llama's grouped-attention gradient, read for the second head of a group at j - 8 and
    # for the first at j + 8, is one load where heads lie 16 apart (issue 12, session 28)
    load_keys: dict = {}

    def load_key(b: int, m) -> tuple:
        key = (b, m)
        got = load_keys.get(key)
        if got is None:
            buf = buffers[b]
            layouts = info[buf.node].layouts
            got = key
            if buf.element < len(layouts):
                shape, strides = layouts[buf.element]
                got = (b, maps.address(m, shape, strides))
            load_keys[key] = got
        return got

    def distinct_loads(loads) -> int:
        return len({load_key(b, m) for b, m, _ in loads})

    def count(terms, loads, consts) -> int:
        return sum(info[k[0]].own_ops for k in {term_key(n, m) for n, m in terms}) + distinct_loads(loads) + len(consts)

    def nontrivial_of(loads) -> int:
        return sum(1 for b, _ in {(b, m) for b, m, _ in loads} if info[buffers[b].node].nontrivial)

    def loads_of(j: int) -> frozenset:
        """What a kernel reads of node j: (buffer, scheduler key)."""
        r = resolve(j)
        if r[0] == "buf":
            return frozenset({(r[1], None)})
        if r[0] == "view":
            return frozenset({(r[1], r[2])})
        if r[0] == "expr":
            return frozenset((b, k) for b, _, k in r[1].loads)
        return frozenset()

    def kernel(node: int, loaded, kind: int | None = None) -> int:
        run.kernels.append(node)
        run.kinds.append(info[node].kind if kind is None else kind)
        reads.append(set(loaded))
        return len(run.kernels) - 1

    def realize(owner: int) -> None:
        st = state.get(owner)
        if st is None or st[0] != "expr":
            return
        step = kernel(owner, {(b, k) for b, _, k in st[1].loads}, POINTWISE)
        state[owner] = ("buf", new_buffer(owner, info[owner].bytes, step))

    def realize_input(j: int) -> None:
        r = resolve(j)
        if r[0] == "expr":
            realize(r[2])

    def combine(i: int, args: Sequence[int]) -> _Expr:
        """Node i's expression: its own op and constants, and each input read at each index
        map the lowering reads it at (``OpInfo.maps``)."""
        loads: set = set()
        terms = {(i, None)}
        consts = set(info[i].consts)
        heavy = info[i].heavy
        arg_maps = info[i].maps
        for p, j in enumerate(args):
            r = resolve(j)
            for step in (arg_maps[p] if p < len(arg_maps) else (None,)):
                if r[0] == "expr":
                    e = moved(r[1], step)
                    loads |= e.loads
                    terms |= e.terms
                    consts |= e.consts
                    heavy = heavy or e.heavy
                elif r[0] == "buf":
                    loads.add((r[1], compose(step, None), None))
                elif r[0] == "view":
                    loads.add((r[1], compose(step, r[3]), r[2]))
        loads_f, terms_f, consts_f = frozenset(loads), frozenset(terms), frozenset(consts)
        return register(i, _Expr(loads_f, terms_f, consts_f, count(terms_f, loads_f, consts_f), heavy,
                                 nontrivial_of(loads_f), distinct_loads(loads_f)))

    # placeholders are lowered first
    for i in g.channels_last_inputs:  # run_node's require_exact_strides on the placeholder
        step = kernel(i, {(state[i][1], None)}, POINTWISE)
        state[i] = ("buf", new_buffer(i, info[i].bytes, step))
    output_set = set(g.outputs)
    absorbed, addmms = addmm_patterns(g, rules)

    def epilogue(i: int, b: int) -> None:
        """A reduction's result that Inductor's lowering computes pointwise from the
        reduction's buffer (mean = sum / n): an expression its users inline, with the op
        count Inductor's counter gives it (the load and ``own_ops``)."""
        nontrivial = int(info[buffers[b].node].nontrivial)
        consts = info[i].consts
        state[i] = ("expr", register(i, _Expr(frozenset({(b, None, None)}), frozenset({(i, None)}), consts,
                                              info[i].own_ops + 1 + len(consts), False, nontrivial, 1)))
        after_lowering(i)

    def after_lowering(i: int) -> None:
        """``GraphLowering.run_node``'s store-or-recompute rules for node i's result."""
        r = resolve(i)
        if r[0] != "expr":
            return
        e, owner = r[1], r[2]
        users = g.users[i]
        if users > 1:
            if g.realizing_users[i] and e.nontrivial > 1:  # realize_hint
                return realize(owner)
            if i in output_set and not (e.nloads == 0 and e.ops <= rules.opcount):
                return realize(owner)
            if (rules.cpu and e.heavy) or e.ops > rules.opcount or e.nloads > rules.reads:
                return realize(owner)  # should_realize_on_reuse
        if (e.nloads > rules.acc_reads or e.ops > rules.opcount) and e.nontrivial > 1:
            return realize(owner)  # has_exceeded_max_reads, then realize_hint
        if e.ops > 100:
            realize(owner)

    def lower(i: int) -> None:
        """Node i as ``GraphLowering.run_node`` lowers it."""
        op = info[i]
        args = g.ins[i]
        kind = op.kind
        if kind == GETITEM:
            st = state.get(args[0], ("none",)) if args else ("none",)
            if st[0] == "multi":
                b = st[1].get(g.getitem_index.get(i, 0))
                state[i] = ("buf", b) if b is not None else ("none",)
                if b is not None and op.own_ops:  # var_mean's variance: an expression over m2
                    epilogue(i, b)
            elif args and info[args[0]].kind == POINTWISE and info[args[0]].multi and resolve(args[0])[0] == "expr":
                # an element of a multi-output pointwise lowering (the low-memory max pool's
                # values and int8 offsets: two expressions Inductor stores apart): its own
                # expression, stored at its own size (as a view of the op's, both elements
                # were one buffer of the values' bytes, and the offsets a saved value never held)
                state[i] = ("expr", combine(i, args))
                after_lowering(i)
            elif args:
                state[i] = ("vexpr", args[0]) if resolve(args[0])[0] == "expr" else _view_state(resolve(args[0]), i,
                                                                                                  None, compose)
            return
        if kind == VIEW:
            r = resolve(args[0]) if args else ("none",)
            if r[0] == "expr" and op.name in _REALIZING_VIEWS:
                # ``lowering.as_strided`` stores its input first (``x.realize()``): a view
                # needs a storage (GroupNorm's per-channel scale and shift, made per group
                # and read through as_strided, are buffers)
                realize(r[2])
                r = resolve(args[0])
            if r[0] == "expr":
                state[i] = ("vexpr", args[0])
                after_lowering(i)
            else:
                state[i] = _view_state(r, i if op.moves else None, view_step(i), compose)
            return
        if i in absorbed:  # an mm the post-grad pass folds into the add after it (addmm)
            state[i] = ("none",)
            return
        if i in addmms:
            mm, inp = addmms[i]
            args = list(g.ins[mm]) + [inp]
            kind = EXTERN
        if kind == POINTWISE:
            state[i] = ("expr", combine(i, args))
            if op.realized:
                realize(i)
            else:
                after_lowering(i)
            return
        if kind in (REDUCTION, SCATTER, CAT, MUTATE):
            loaded: set = set()
            for j in args:
                loaded |= loads_of(j)
            step = kernel(i, loaded)
            if kind == MUTATE:  # written into its first argument: no buffer of its own
                r = resolve(args[0]) if args else ("none",)
                state[i] = _view_state(r, None, None, compose)
            elif op.multi:
                state[i] = multi_buffers(i, op, step)
            else:
                state[i] = ("buf", new_buffer(i, op.bytes, step))
                if kind == REDUCTION and op.own_ops:  # mean: the sum's buffer divided by the count
                    epilogue(i, state[i][1])
            return
        # extern and fallback kernels: their inputs are stored first, their outputs are buffers.
        # A stride constraint (``require_stride_order``) copies an input that is not in
        # memory (an expression, or a view of one) into a buffer of this kernel's own
        # (``copy_input``: the view's elements; the expression stays unrealized, and
        # another kernel that reads it makes its own copy); the fallback's
        # ``realize_input`` then stores what is left (a view's base, an expression)
        loaded = set()
        rest = []
        # a convolution_backward copies a handled weight to channels last when its input
        # arrived so, or when this graph computes the input (recomputed in the backward)
        wanted = op.channels_last_args if g.conv_copied_inputs else ()
        if wanted and not g.layout_opt and not (0 <= op.conv_input < len(args)
                                                and (args[op.conv_input] in g.channels_last_arrivals
                                                     or args[op.conv_input] not in g.inputs)):
            wanted = ()
        if wanted:
            for p, j in enumerate(args):
                r = resolve(j)
                if p in wanted and j in g.conv_copied_inputs and r[0] == "buf" and buffers[r[1]].input:
                    copy = kernel(j, {(r[1], None)}, POINTWISE)
                    loaded.add((new_buffer(j, info[j].bytes, copy), None))
                else:
                    rest.append(j)
            args = rest
            rest = []
        if op.constraint == "strides" or (op.constraint == "conv" and not g.layout_opt):
            for j in args:
                r = resolve(j)
                if r[0] == "expr" and info[j].bytes:
                    copy = kernel(j, {(b, k) for b, _, k in r[1].loads}, POINTWISE)
                    loaded.add((new_buffer(j, info[j].bytes, copy), None))
                else:
                    rest.append(j)
        else:
            rest = list(args)
        for j in rest:
            realize_input(j)
        for j in rest:
            loaded |= loads_of(j)
        step = kernel(i, loaded, EXTERN)
        first = len(buffers)
        if op.multi:
            state[i] = multi_buffers(i, op, step)
        elif op.nbytes:
            state[i] = ("buf", new_buffer(i, op.bytes, step))
        else:
            state[i] = ("none",)
        if op.self_allocating:
            # ``FallbackKernel.create``: its outputs are unaligned when an input is
            # (``has_unaligned_input``); ``GraphLowering.placeholder`` marks every graph input
            # unaligned off the GPU (``should_assume_input_aligned``), and a fallback's
            # unaligned output makes the next fallback reading it unaligned (a kernel writing
            # in place into one is too, ``make_inplace``: the block keeps its root's flag).
            # The pool's key holds the alignment (``buffer_reuse_key``) and what the wrapper
            # allocates is aligned, so such an output is never reused: on a CPU Llama's
            # attention backward reading a saved output keeps its gradients out of the pool
            # (its halfway plan, issue 12)
            unaligned = any((buffers[b].input and rules.cpu) or buffers[b].unaligned for b, _ in loaded)
            for b in buffers[first:]:
                b.self_allocated = True
                b.unaligned = unaligned

    for i in g.order:
        lower(i)
        # ``run_node`` fixes the strides of a graph output that has dimensions as soon as
        # it is lowered (``require_exact_strides``), which stores an expression there: a
        # gradient cast to its parameter's dtype (bf16 autocast) is computed at its matmul,
        # not at the end, and the matmul's bf16 result is freed then
        if i in output_set and info[i].dims:
            realize_input(i)

    # the other graph outputs (0-d: the loss) are stored at the end of lowering, in order
    for o in g.outputs:
        realize_input(o)
    for o in g.outputs:
        r = resolve(o)
        if r[0] in ("buf", "view") and r[1] is not None:
            buffers[r[1]].output = True
            run.output_buffers[o] = r[1]
    slotted = set()  # buffers copied into a slot: read by the copy, right after their kernel
    for o in g.pooled:
        k = run.output_buffers.get(o)
        if k is None:
            continue
        written = buffers[k]
        into_slot(written, o, g, rules)
        slotted.add(k)
        if written.kernel >= 0:
            slot = new_buffer(o, info[o].bytes, -1)
            buffers[slot].input = buffers[slot].slot = True
            reads[written.kernel].add((slot, None))
    position = list(range(len(run.kernels)))  # where each kernel runs once fused groups are placed
    original = [b.nbytes for b in buffers]
    for b in buffers:
        b.planned_bytes = b.nbytes
    _fuse_local(run, reads, g, position, rules)
    schedule: dict[int, int] = {}
    for k, at in enumerate(position):
        schedule[at] = run.kernels[k]
    run.schedule = [schedule[at] for at in sorted(schedule)]
    for k, b in enumerate(buffers):
        if b.start >= 0:
            b.start = position[b.start]
    for step, loaded in enumerate(reads):
        at = position[step]
        for b, _ in loaded:
            if buffers[b].end < at:
                buffers[b].end = at
    for k, b in enumerate(buffers):
        if b.start >= 0 and b.end < b.start and (b.end >= 0 or k in slotted):
            b.end = b.start
    for b, nbytes in zip(buffers, original):
        b.planned = (b.start, b.end, nbytes)
    reuse_in_place(run, reads, g, position)
    reuse_pool(run, g)
    for b in buffers:
        if b.input and not b.slot:
            run.input_last[b.node] = b.end
    return run


def _view_state(r: tuple, key, step, compose) -> tuple:
    """A view of a buffer: (buffer, scheduler key, index map through ``step``)."""
    if r[0] == "buf":
        mid = compose(step, None)
        return ("view", r[1], key, mid) if key is not None or mid is not None else ("buf", r[1])
    if r[0] == "view":
        return ("view", r[1], key if key is not None else r[2], compose(step, r[3]))
    return ("none",)
