"""TensorLifetimes on small graphs with hand-computed bytes."""

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dsgraph.analysis.lifetimes import TensorLifetimes, default_held

F32 = 4


def trace(fn, *shapes, dtype=torch.float32):
    return make_fx(fn, tracing_mode="fake")(*[torch.randn(s, dtype=dtype) for s in shapes])


def by_name(lt, name):
    return next(n for n in lt.nodes if n.name == name)


def test_views_share_storage_and_inplace_allocates_nothing():
    def f(x, w):
        y = torch.mm(x, w)  # 5x7 fp32 = 140 B
        z = y.view(-1)
        z.add_(1)
        return y.t() * 2

    gm = trace(f, (5, 3), (3, 7))
    lt = TensorLifetimes(gm)
    mm, view, add_, t = (by_name(lt, n) for n in ("mm", "view", "add_", "t"))
    assert lt.storage_of[view] is lt.storage_of[mm] is lt.storage_of[add_] is lt.storage_of[t]
    assert lt.storage_of[mm].nbytes == 5 * 7 * F32
    assert lt.allocated_by(view) == lt.allocated_by(add_) == lt.allocated_by(t) == 0
    assert lt.allocated_by(mm) == 140
    # x and w are inputs held by the caller: live at every node
    inputs = 5 * 3 * F32 + 3 * 7 * F32
    mul = by_name(lt, "mul")
    assert lt.live_at(mm) == inputs + 140
    assert lt.live_at(mul) == inputs + 140 + 140  # mm is still read by mul, output allocated
    # the view's bytes are what it shows, the storage's are the allocation
    assert lt.node_bytes(view) == 140


def test_outputs_live_to_the_end_and_intermediates_die_at_last_use():
    def f(x):
        a = x * 2  # 44 B (11 floats)
        b = a + 1  # last use of a
        c = b.exp()  # last use of b
        return c, a.sum()

    gm = trace(f, (11,))
    lt = TensorLifetimes(gm)
    a, b, c = (lt.storage_of[by_name(lt, n)] for n in ("mul", "add", "exp"))
    n = len(lt.nodes)
    assert c.last == n and c.is_output
    assert b.last == lt.index[by_name(lt, "exp")]
    assert a.last == lt.index[by_name(lt, "sum_1")]
    assert lt.live[lt.index[by_name(lt, "exp")]] == 44 * 4  # x, a, b, c


def test_multi_output_ops_and_list_views():
    def f(x):
        mean_var = torch.var_mean(x, dim=1)  # two fresh [4] tensors
        pieces = torch.split(x, 2)  # views of x
        return mean_var[0] + pieces[1].sum()

    gm = trace(f, (4, 6))
    lt = TensorLifetimes(gm)
    getitems = [n for n in lt.nodes if n.target is operator.getitem]
    var, mean = getitems[0], getitems[1]
    assert lt.storage_of[var] is not lt.storage_of[mean]
    assert lt.storage_of[var].nbytes == 4 * F32
    x = next(n for n in lt.nodes if n.op == "placeholder")
    split_items = [g for g in getitems if g.args[0].name.startswith("split")]
    assert split_items and all(lt.storage_of[g] is lt.storage_of[x] for g in split_items)
    assert all(lt.allocated_by(g) == 0 for g in getitems)


def test_unused_output_of_multi_output_op_still_allocates():
    def f(x):
        return torch.var_mean(x, dim=0)[0] * 3

    gm = trace(f, (5, 9))
    lt = TensorLifetimes(gm)
    vm = next(n for n in lt.nodes if n.op == "call_function" and "var_mean" in str(n.target))
    assert lt.allocated_by(vm) == 2 * 9 * F32


def test_backward_inputs_other_than_primals_die_at_last_use():
    def bw(primals_1, saved, tangents_1):
        g = tangents_1 * saved
        return torch.mm(g.t(), primals_1)

    gm = make_fx(bw, tracing_mode="fake")(torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5))
    # make_fx names placeholders after the function's parameters with a suffix
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert names[0].startswith("primals_1") and names[2].startswith("tangents_1")
    lt = TensorLifetimes(gm, default_held("backward"))
    primal, saved, tangent = (lt.storage_of[by_name(lt, n)] for n in names)
    assert primal.held and primal.last == len(lt.nodes)
    assert not saved.held and saved.last == lt.index[by_name(lt, "mul")]
    assert not tangent.held and tangent.last == lt.index[by_name(lt, "mul")]
    mm = by_name(lt, "mm")
    # at mm: primal (48) + g (60, read through its transpose) + output 5x4 (80)
    assert lt.live_at(mm) == 3 * 4 * F32 + 3 * 5 * F32 + 5 * 4 * F32


def test_strided_allocation_bytes():
    def f(x):
        return torch.empty_strided((3, 4), (8, 1)) + x.sum()

    gm = trace(f, (2,))
    lt = TensorLifetimes(gm)
    es = next(n for n in lt.nodes if "empty_strided" in str(n.target))
    # rows 8 floats apart: (3-1)*8 + (4-1)*1 + 1 = 20 elements
    assert lt.storage_of[es].nbytes == 20 * F32


def test_symbolic_sizes_give_hints_and_expressions():
    def f(x):
        return (x * 2).sum(0)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6, 10))
    lt = TensorLifetimes(gm)
    mul = lt.storage_of[by_name(lt, "mul")]
    assert mul.nbytes == 6 * 10 * F32
    expr = mul.nbytes_expr()
    assert len(expr.free_symbols) == 2
    subs = {s: v for s, v in zip(sorted(expr.free_symbols, key=str), (6, 10))}
    assert int(expr.subs(subs)) == 240


def test_peak():
    def f(x):
        a = x.exp()
        b = a.exp()
        return b.sum()

    gm = trace(f, (100,))
    lt = TensorLifetimes(gm)
    peak, node = lt.peak()
    assert peak == 3 * 400 and node.name == "exp_1"


@pytest.mark.parametrize("dtype, size", [(torch.bfloat16, 2), (torch.float64, 8), (torch.int64, 8)])
def test_dtypes(dtype, size):
    def f(x):
        return x * 3

    gm = make_fx(f, tracing_mode="fake")(torch.ones(7, dtype=dtype))
    lt = TensorLifetimes(gm)
    assert lt.storage_of[by_name(lt, "mul")].nbytes == 7 * size
