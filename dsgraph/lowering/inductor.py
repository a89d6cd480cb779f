"""Hand lowered regions to Inductor as user-defined Triton kernels.

After AOTAutograd a ``torch.library.triton_op`` is an opaque op: Inductor would call it as
a Python fallback (``buf1 = torch.ops.dsgraph_triton.dsg_pw_....default(...)``, one
dispatch and one launch from Python per call), because the op is decomposed into its
kernel only while AOTAutograd functionalizes, which is over when dsgraph's passes run.
``to_user_kernels`` does that decomposition itself: it traces each op's launch code
(``kernels.launch``) with ``make_fx`` under the graph's fake mode and shape environment,
which records ``wrap_triton``'s ``triton_kernel_wrapper_mutation`` node, and splices the
traced nodes in place of the op::

    dsg = dsgraph_triton.dsg_pw_1a2b(x, w)            empty = empty_strided([s0, 768], [768, 1], ...)
    y = getitem(dsg, 0)                        ->     triton_kernel_wrapper_mutation(kernel_idx=3,
                                                          grid=[...], kwargs={in0_ptr: x, ..., out0_ptr: empty, ...})
                                                      (users of y read empty)

Inductor then compiles the kernel into its own output code like any user-defined Triton
kernel (its autotuner runs at compile time, launches have no per-call Python dispatch).
Sizes stay symbolic: they are read from the tensors by ``sym_size`` nodes of the trace.

Under TRITON_INTERPRET ``wrap_triton`` returns interpreted kernels unwrapped (nothing to
trace), so this runs only where Triton compiles for a GPU.
"""

from __future__ import annotations

import operator

from torch.fx import GraphModule, Node

from dsgraph import compat

from . import kernels


def lowered_ops(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and kernels.compiled_for_op(n.target) is not None]


def _trace(compiled: kernels.CompiledKernel, node: Node) -> GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    n_tensors = len(compiled.ir.params)

    def body(*args):
        return tuple(kernels.launch(compiled, list(args[:n_tensors]), list(args[n_tensors:])))

    vals = [a.meta["val"] for a in node.args]
    fake_mode = compat.detect_fake_mode(vals)
    mode = "symbolic" if fake_mode is not None and fake_mode.shape_env is not None else "fake"
    return make_fx(body, tracing_mode=mode)(*vals)


def _unused_view(node: Node) -> bool:
    """A view of the trace whose result nothing reads: the launcher's ``expand`` calls (it
    reads the broadcast strides from them). Left out of the splice: Inductor drops them
    anyway, the graph dumps need not show them."""
    return (node.op == "call_function" and not node.users and compat.returns_alias(node)
            and not compat.has_side_effects(node))


def _splice(gm: GraphModule, node: Node, sub: GraphModule) -> None:
    graph = gm.graph
    env: dict[Node, object] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for p, a in zip(placeholders, node.args):
        env[p] = a
    results: list = []
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder" or _unused_view(n):
                continue
            if n.op == "output":
                results = [env[x] if isinstance(x, Node) else x for x in n.args[0]]
                continue
            env[n] = graph.node_copy(n, lambda x: env[x])
    users = list(node.users)
    if len(results) == 1 and not all(u.target is operator.getitem for u in users):
        node.replace_all_uses_with(results[0])
    else:
        for u in users:
            assert u.target is operator.getitem, u.format_node()
            u.replace_all_uses_with(results[u.args[1]])
            graph.erase_node(u)
    graph.erase_node(node)


def to_user_kernels(gm: GraphModule) -> int:
    """Replace every dsgraph_triton op in ``gm`` by its traced kernel launch; returns how many."""
    count = 0
    for node in lowered_ops(gm):
        compiled = kernels.compiled_for_op(node.target)
        _splice(gm, node, _trace(compiled, node))
        count += 1
    if count:
        # no dead-code elimination here: the kernel launch has no users and FX does not
        # know that it writes its outputs
        gm.graph.lint()
        gm.recompile()
    return count
