"""The reductions' entry points of a region's module: ``_Writer``'s reduction half.

``ReductionWriter`` writes a reduction kernel's two bodies (see ``codegen``'s docstring):
``reduction_tile``, the one-tile entry point (ROWS tiles of BLOCK_M whole rows per program,
the next tile's loads issued while the current one computes), and ``reduction``, the
general one (the one-tile body when N <= BLOCK_N, else ``looped``: one loop over the
columns per level of reductions, ``_levels``). It is a mixin of ``codegen._Writer``, whose
pieces (``emit``, ``load``, ``tile_load``, ``cast``, ``expr``, ``store``, ``row_offsets``) it
writes with.
"""

from __future__ import annotations

from .kernel_ir import KernelIR, Value
from .op_table import TL_DTYPE


def _levels(ir: KernelIR) -> dict[str, int]:
    """Loop pass in which each value can first be computed (reductions add one)."""
    level: dict[str, int] = {}
    for v in ir.values:
        deps = [level[a] for a in v.args if a in level]
        base = max(deps, default=0)
        level[v.name] = base + 1 if v.op in ("sum", "max") else base
    return level


class ReductionWriter:
    """The reduction entry points (a mixin of ``codegen._Writer``)."""

    def reduction_start(self) -> None:
        self.emit("pid = tl.program_id(0)")
        self.emit("rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
        self.emit("row_mask = rows < M")
        self.emit("cols0 = tl.arange(0, BLOCK_N)[None, :]")
        self.row_offsets(1)

    def reduction_tile(self) -> None:
        """The one-tile entry point: ROWS tiles of BLOCK_M whole rows per program, one after
        the other; the inputs the same for every row (``Load.cols_only``) loaded once per
        program, and each step's loads of the next tile issued before its own reductions
        (the loop keeps a tile's reads in flight while the previous one computes)."""
        ir = self.ir
        hoisted = [v for v in ir.values if v.op == "load" and self.loads[v.args[0]].cols_only]
        per_row = [v for v in ir.values if v.op == "load" and not self.loads[v.args[0]].cols_only]
        row_loads = [self.loads[v.args[0]] for v in per_row]
        self.emit('"""N <= BLOCK_N (a constexpr): ROWS tiles of BLOCK_M whole rows per program, inputs read once."""')
        self.emit("pid = tl.program_id(0)")
        self.emit("cols = tl.arange(0, BLOCK_N)[None, :]")
        self.emit("col_mask = cols < N  # folded away when N == BLOCK_N")
        self.emit("first = pid * (BLOCK_M * ROWS)  # the program's first row")
        if hoisted:
            self.emit("# the same for every row: read once per program")
            for v in hoisted:
                self.tile_load(v, 1, f"{v.name}_in", "", None)
                self.emit(f"{v.name} = {v.name}_in{self.cast(v)}  # {v.label}")
        self.emit("# the first tile; rows past M (the last program's) read row M - 1: no row mask, stores have it")
        self.emit("rows_first = first + tl.arange(0, BLOCK_M)[:, None]")
        self.row_offsets(1, rows="rows_first", clamp=True, args=row_loads, suffix="_first")
        for v in per_row:
            self.tile_load(v, 1, f"{v.name}_in", "_first", None)
        self.emit("for step in range(ROWS):")
        self.emit("rows = first + step * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]", 2)
        self.emit("row_mask = rows < M", 2)
        self.emit("mask = row_mask & col_mask", 2)
        for v in per_row:
            self.emit(f"{v.name}_now = {v.name}_in  # this tile's (read by the previous step)", 2)
        if per_row:
            self.emit("if ROWS > 1:", 2)
            self.emit("# the next tile's rows, read while this one computes (the compiler does not move a", 3)
            self.emit("# load across the barriers of a reduction); none after the program's last", 3)
            self.emit("rows_next = rows + BLOCK_M", 3)
            self.emit("next_mask = (rows_next < M) & (step + 1 < ROWS)", 3)
            self.row_offsets(3, rows="rows_next", args=row_loads, suffix="_next")
            for v in per_row:
                self.tile_load(v, 3, f"{v.name}_in", "_next", "next_mask")
        for v in per_row:
            self.emit(f"{v.name} = {v.name}_now{self.cast(v)}  # {v.label}", 2)
        self.row_offsets(2, args=list(ir.stores))
        for v in ir.values:
            if v.op == "load":
                continue
            elif v.op in ("sum", "max"):
                neutral = "0.0" if v.op == "sum" else 'float("-inf")'
                # masked columns only (none when N == BLOCK_N): what rows past M reduce to is never stored
                self.emit(f"t_{v.name} = tl.where(col_mask, {v.args[0]}, {neutral})", 2)
                self.reduce(v, f"t_{v.name}", 2)
            else:
                self.expr(v, 2)
        for st in ir.stores:
            self.store(st, 2)

    def reduction(self) -> None:
        self.emit('"""Any row width: one tile per row when N <= BLOCK_N, else a loop per level of reductions."""')
        self.reduction_start()
        self.emit("if N <= BLOCK_N:")
        self.emit("# the whole row in one tile: every input is read once", 2)
        self.one_tile(2)
        self.emit("else:")
        self.looped(2)

    def reduce(self, r: Value, tile: str, depth: int) -> None:
        """``r`` = the row-wise reduction of ``tile`` (masked lanes already neutral)."""
        if r.op == "sum":
            self.emit(f"{r.name} = tl.reduce({tile}, 1, _add)[:, None]  # {r.label}", depth)
        else:
            # _max propagates NaN, as torch.amax
            self.emit(f"{r.name} = tl.reduce({tile}, 1, _max)[:, None]  # {r.label}", depth)

    def one_tile(self, depth: int) -> None:
        """N <= BLOCK_N: the values in graph order, reductions inline."""
        self.emit("cols = cols0", depth)
        self.emit("col_mask = cols < N", depth)
        self.emit("mask = row_mask & col_mask", depth)
        # every load first: the compiler does not move a load across the barriers of a
        # reduction, so a load written after one would wait for it (layer norm's w and b)
        for v in self.ir.values:
            if v.op == "load":
                self.load(v, depth, None)
        for v in self.ir.values:
            if v.op == "load":
                continue
            elif v.op in ("sum", "max"):
                x = v.args[0]
                neutral = "0.0" if v.op == "sum" else 'float("-inf")'
                # masked columns only: what rows past M reduce to is never stored
                self.emit(f"t_{v.name} = tl.where(col_mask, {x}, {neutral})", depth)
                self.reduce(v, f"t_{v.name}", depth)
            else:
                self.expr(v, depth)
        for s in self.ir.stores:
            self.store(s, depth)

    def looped(self, depth: int) -> None:
        """N > BLOCK_N: one loop over the columns per level of reductions."""
        ir = self.ir
        level = _levels(ir)
        reductions = [v for v in ir.values if v.op in ("sum", "max")]
        full_stores = [s for s in ir.stores if s.space == "full"]
        passes = 1 + max([level[r.args[0]] for r in reductions] + [level[s.value] for s in full_stores])
        done: set[str] = set()
        for p in range(passes + 1):
            self.row_values(p, level, done, depth)
            if p == passes:
                break
            work = [r for r in reductions if level[r.args[0]] == p]
            stores = [s for s in full_stores if level[s.value] == p]
            what = [f"{r.op} -> {r.name} ({r.label})" for r in work] + [f"store {s.name}" for s in stores]
            self.emit(f"# loop {p + 1} of {passes}: {'; '.join(what)}", depth)
            accs = {}
            for r in work:
                acc = f"acc{len(accs)}_{r.name}"
                accs[r.name] = acc
                tl_type = TL_DTYPE[r.dtype]
                if r.op == "sum":
                    self.emit(f"{acc} = tl.full([BLOCK_M, BLOCK_N], 0, dtype={tl_type})", depth)
                else:
                    self.emit(f'{acc} = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype={tl_type})', depth)
            self.emit("for start in range(0, N, BLOCK_N):", depth)
            self.emit("cols = start + cols0", depth + 1)
            self.emit("col_mask = cols < N", depth + 1)
            self.emit("mask = row_mask & col_mask", depth + 1)
            eviction = "evict_first" if p == passes - 1 else "evict_last"
            needed = self.closure([r.args[0] for r in work] + [s.value for s in stores])
            for v in ir.values:
                if v.name in needed:
                    if v.op == "load":
                        self.load(v, depth + 1, eviction)
                    else:
                        self.expr(v, depth + 1)
            for r in work:
                x, acc = r.args[0], accs[r.name]
                if r.op == "sum":
                    self.emit(f"{acc} += tl.where(mask, {x}, 0.0)", depth + 1)
                else:
                    # NaN wins, as in torch.amax
                    self.emit(f"{acc} = tl.where(mask & (({x} > {acc}) | ({x} != {x})), {x}, {acc})", depth + 1)
            for s in stores:
                self.store(s, depth + 1)
            for r in work:
                self.reduce(r, accs[r.name], depth)
                done.add(r.name)

    def closure(self, roots: list[str]) -> set[str]:
        """Full (per element) values needed for ``roots`` inside a loop; row values are
        computed before the loop."""
        needed: set[str] = set()
        stack = list(roots)
        while stack:
            name = stack.pop()
            v = self.values[name]
            if name in needed or v.row:
                continue
            needed.add(name)
            stack.extend(a for a in v.args if a in self.values)
        return needed

    def row_values(self, p: int, level: dict[str, int], done: set[str], depth: int) -> None:
        """Row values that become computable once the reductions of loop ``p`` are done,
        then the row outputs that are ready."""
        for v in self.ir.values:
            if not v.row or v.name in done or v.op in ("sum", "max") or level[v.name] > p:
                continue
            if v.op == "load":
                self.load(v, depth, None)
            else:
                self.expr(v, depth)
            done.add(v.name)
        for s in self.ir.stores:
            if s.space != "full" and s.value in done and s.name not in done:
                self.store(s, depth)
                done.add(s.name)
