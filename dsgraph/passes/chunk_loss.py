"""chunk_loss: the output projection and its cross-entropy over chunks of tokens.

For a language model the largest tensors of a training step are the logits and their
gradient (GPT-2-small at 16 x 1024 tokens: 16384 x 50304 values, 1.6 GB in bf16). This pass
finds ``F.linear`` (or a matmul) whose output reaches ``F.cross_entropy`` through
row-preserving ops only (flatten, view/reshape keeping the vocabulary last, slicing the
token dimensions such as a causal LM's shift, ``.contiguous()``, dtype casts such as the
fp32 upcast) and nothing else reads the logits. It replaces that chain by one call of
``dsgraph.runtime.linear_cross_entropy``, which walks the tokens in chunks and computes the
gradients of the projection's input, weight and bias in the forward, chunk by chunk (the
backward scales them by the loss's gradient), so the full logits and their gradient never
exist (see that module for the arithmetic). Before/after (Dynamo's graph; GPT-2-small under
autocast, no budget: 7 chunks)::

    logits = linear(h, wte, None)                 flatten_rows = h.flatten(0, 1)
    flatten = logits.flatten(0, 1)          ->    loss = linear_cross_entropy(flatten_rows, wte, None, t,
    float_1 = flatten.float()                         ignore_index=-100, reduction='mean',
    loss = cross_entropy(float_1, t)                  label_smoothing=0.0, mm_dtype=torch.bfloat16,
                                                      loss_dtype=torch.float32, chunk_tokens=2341)

Stage "pre_grad" (Dynamo's graph, before AOTAutograd): there the loss is still the call the
user wrote, with its keyword arguments, and there is no backward yet, so the replacement
brings its own autograd formula. The joint graph would show the same loss decomposed
(log_softmax, nll, label smoothing, masks) with its backward interleaved, and the
partitioner would save every chunk's logits (matmuls are not recomputed) unless the pass
also owned the partition, which the checkpoint pass does.

Tied embeddings need nothing special: the projection weight is the embedding's graph input,
and autograd adds the two gradients. Dynamic token counts: chunks have a fixed token count
(``chunk_tokens``, from the size hint at compile time) and the op loops over
``ceil(N / chunk_tokens)`` of them at run time, the last one the remainder; nothing is
specialised.

Chunk count (``plan_chunk_loss``), in this order:

- ``chunk_loss{chunks=N}`` (or the option ``chunk_loss=N``): N chunks;
- a memory budget (``budget`` argument, else the pipeline's checkpoint budget): the
  smallest count whose chunk buffers (``workspace`` of one chunk: logits, their working
  copy or gradient, see ``linear_cross_entropy.workspace_bytes``) fit ``BUDGET_SHARE`` of
  the budget; the checkpoint planner, which runs after, sees the op and its workspace in
  its memory model;
- otherwise the smallest count whose chunk buffers fit ``DEFAULT_CHUNK_BYTES``.

Chunks are balanced (``chunk_tokens = ceil(N / count)``). A graph without the pattern is
left as it is; the stats and the dump say why (``reason``).

Chunked or not (``choose``): ``always`` (the default) chunks whenever the pattern is found;
``faster`` (the option ``chunk_loss="faster"``; needs the checkpoint pass)
leaves the loss unchunked in the first compile, recording its sites in
``ctx.state.findings``, and the checkpoint planner compares the step's plans with and
without the chunked loss over up to two more compiles (``loss_choice``); a graph that
computes no gradient is chunked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from dsgraph import compat
from dsgraph.pass_api import PassContext, PassResult, PassSpec
from dsgraph.passes import loss_choice
from dsgraph.passes.chunk_loss_sites import LossSite, find_loss_sites, method_name, value
from dsgraph.runtime import linear_cross_entropy as lce
from dsgraph.units import format_bytes, parse_bytes

# share of the memory budget one chunk's buffers may take (the rest of the step's peak is
# the checkpoint planner's: activations, parameters, gradients)
BUDGET_SHARE = 1 / 16
# without a budget: chunk buffers of at most this size (on an H200 a GPT-2 chunk of this
# size is about 2700 tokens: matmuls of that height run at full speed)
DEFAULT_CHUNK_BYTES = 256 * 2**20


def _chunks(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"chunks must be an int >= 1, got {raw!r}")
    return value


def _budget(raw: str) -> int:
    return parse_bytes(raw, "chunk_loss{budget=...}")


def _choose(raw: str) -> str:
    if raw not in (loss_choice.ALWAYS, loss_choice.FASTER):
        raise ValueError(f"chunk_loss{{choose=...}} must be {loss_choice.ALWAYS!r} or {loss_choice.FASTER!r}, got {raw!r}")
    return raw


SPEC = PassSpec(
    name="chunk_loss",
    stages=("pre_grad",),
    args={"chunks": _chunks, "budget": _budget, "choose": _choose},
    doc="output projection + cross-entropy over chunks of tokens (no full logits)",
)


# -- the plan ------------------------------------------------------------------------------------

@dataclass
class SitePlan:
    site: LossSite
    chunk_tokens: int
    chunks: int  # at the size hint
    chunks_expr: str  # over the graph's size symbols
    logits_bytes: int  # the full logits in mm_dtype
    unchunked_bytes: int  # full-size tensors of the unchunked loss: logits, their upcast, their gradient
    workspace_bytes: int  # what the chunked op allocates for itself at its peak (outputs excluded)
    rule: str

    @property
    def avoided_bytes(self) -> int:
        return max(self.unchunked_bytes - self.workspace_bytes, 0)


@dataclass
class ChunkLossPlan:
    sites: list[SitePlan] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # cross_entropy calls left alone, and why

    @property
    def found(self) -> bool:
        return bool(self.sites)

    def stats(self) -> dict[str, Any]:
        if not self.sites:
            return {"sites": 0, "reason": "; ".join(self.reasons)}
        out: dict[str, Any] = {
            "sites": len(self.sites),
            "chunks": ",".join(str(s.chunks) for s in self.sites),
            "chunk_tokens": ",".join(str(s.chunk_tokens) for s in self.sites),
            "logits_bytes": sum(s.logits_bytes for s in self.sites),
            "workspace_bytes": sum(s.workspace_bytes for s in self.sites),
            "avoided_bytes": sum(s.avoided_bytes for s in self.sites),
        }
        if self.reasons:
            out["reason"] = "; ".join(self.reasons)
        return out

    def text(self) -> str:
        lines = ["# chunk_loss", ""]
        if not self.sites:
            lines += ["pattern not found: " + "; ".join(self.reasons), ""]
            return "\n".join(lines)
        for s in self.sites:
            site = s.site
            chain = " -> ".join([site.projection] + [f"{name} ({method})" for name, _, method in site.chain]
                                + [site.loss])
            lines += [
                f"## {site.loss}", "",
                f"- pattern: {chain}",
                f"- projection: {site.kind}({site.x}, {site.weight}{', ' + site.bias if site.bias else ''})"
                f"{' (tied: the weight is also read elsewhere)' if site.tied else ''}",
                f"- tokens {site.tokens} (hint {site.tokens_hint}), D {site.dim}, V {site.vocab}; "
                f"matmul in {site.mm_dtype}, loss in {site.loss_dtype}",
                f"- cross_entropy: reduction {site.reduction}, ignore_index {site.ignore_index}, "
                f"label_smoothing {site.label_smoothing}",
                f"- chunks: {s.chunks} of {s.chunk_tokens} tokens (count {s.chunks_expr}); {s.rule}",
                f"- full logits {format_bytes(s.logits_bytes)}; unchunked loss tensors (logits, upcast, "
                f"gradient) {format_bytes(s.unchunked_bytes)}; chunked op workspace "
                f"{format_bytes(s.workspace_bytes)}; avoided {format_bytes(s.avoided_bytes)}",
                "",
            ]
        if self.reasons:
            lines += ["left alone: " + "; ".join(self.reasons), ""]
        return "\n".join(lines)


def _workspace(site: LossSite, chunk_tokens: int) -> int:
    return lce.workspace_bytes(
        site.tokens_hint, site.dim, site.vocab, x_dtype=site.x_dtype, w_dtype=site.w_dtype, mm_dtype=site.mm_dtype,
        loss_dtype=site.loss_dtype, has_bias=site.bias is not None, chunk_tokens=chunk_tokens, grads=True,
        triton=lce.use_triton(site.device), fp32_gemm=lce.fp32_out_gemm(site.device.type))


def _chunk_part(site: LossSite, chunk_tokens: int) -> int:
    """Bytes of one chunk's buffers (the workspace less what does not depend on the chunk)."""
    return _workspace(site, chunk_tokens) - _workspace(site, 0)


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def plan_site(site: LossSite, chunks: int | None = None, budget: int | None = None) -> SitePlan:
    n = max(site.tokens_hint, 1)
    if chunks is not None:
        count, rule = min(chunks, n), f"chunks={chunks} asked for"
    else:
        # at least one byte: a tiny budget (the 1-byte probe for the smallest feasible budget)
        # gives one token per chunk, and the checkpoint planner then says what is feasible
        limit = max(1, int(budget * BUDGET_SHARE)) if budget is not None else DEFAULT_CHUNK_BYTES
        per_token = max(_chunk_part(site, 1), 1)
        count = min(max(math.ceil(_chunk_part(site, n) / limit), 1), n)
        while count < n and _chunk_part(site, math.ceil(n / count)) > limit:
            count += 1
        rule = (f"the smallest count whose chunk buffers fit {BUDGET_SHARE:g} of the budget "
                f"{format_bytes(budget)} ({format_bytes(limit)}; {format_bytes(per_token)} per token)"
                if budget is not None else
                f"the smallest count whose chunk buffers fit {format_bytes(limit)} (no budget)")
    chunk_tokens = math.ceil(n / count)
    count = math.ceil(n / chunk_tokens)
    expr = compat.sym_expr(site.tokens)
    chunks_expr = str(count) if expr.is_Integer else f"ceiling(({expr})/{chunk_tokens})"
    logits = site.tokens_hint * site.vocab * _size(site.mm_dtype)
    upcast = site.tokens_hint * site.vocab * _size(site.loss_dtype) if site.loss_dtype != site.mm_dtype else 0
    return SitePlan(site, chunk_tokens, count, chunks_expr, logits, 2 * logits + upcast,
                    _workspace(site, chunk_tokens), rule)


def plan_chunk_loss(gm: GraphModule, chunks: int | None = None, budget: int | None = None) -> ChunkLossPlan:
    sites, reasons = find_loss_sites(gm)
    return ChunkLossPlan([plan_site(s, chunks, budget) for s in sites], reasons)


# -- the rewrite ----------------------------------------------------------------------------------


def _values(a: Any) -> Any:
    """``a`` with every node replaced by its fake value (inside tuples, lists, dicts, slices)."""
    if isinstance(a, Node):
        return value(a)
    if isinstance(a, (tuple, list)):
        return type(a)(_values(x) for x in a)
    if isinstance(a, dict):
        return {k: _values(v) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_values(a.start), _values(a.stop), _values(a.step))
    return a


def _fake_run(node: Node) -> None:
    """Set Dynamo's ``example_value`` on a new node by running it on its inputs' fake values."""
    args, kwargs = _values(node.args), _values(node.kwargs)
    # the mode of the values themselves (the compile's tracing context may hold another)
    fake_mode = next((a.fake_mode for a in [*args, *kwargs.values()] if hasattr(a, "fake_mode")), None)
    with fake_mode if fake_mode is not None else _null():
        if node.op == "call_method":
            out = getattr(args[0], node.target)(*args[1:], **kwargs)
        else:
            out = node.target(*args, **kwargs)
    node.meta["example_value"] = out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _x_row_op(graph, node: Node, x: Node, vocab: int, dim: int) -> Node:
    """``node``'s op applied to the projection's input instead of the logits."""
    args = list(node.args)
    args[0] = x
    method = method_name(node)
    if method in ("view", "reshape"):
        shape_args = args[1:]
        packed = len(shape_args) == 1 and isinstance(shape_args[0], (tuple, list))
        shape = list(shape_args[0]) if packed else shape_args
        last = value(shape[-1]) if isinstance(shape[-1], Node) else shape[-1]
        if last != -1:
            shape[-1] = dim  # the vocabulary, given explicitly, becomes D
        args = [x, tuple(shape)] if packed else [x, *shape]
    # ``view`` becomes ``reshape``: the projection's input need not be contiguous where the
    # logits were (a .contiguous() between a slice and the view is not copied over)
    target = "reshape" if node.op == "call_method" and node.target == "view" else node.target
    new = graph.create_node(node.op, target, tuple(args), dict(node.kwargs), name=f"{node.name}_rows")
    new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    _fake_run(new)
    return new


def apply_chunk_loss(gm: GraphModule, plan: ChunkLossPlan) -> GraphModule:
    graph = gm.graph
    for sp in plan.sites:
        site = sp.site
        by_name = {n.name: n for n in graph.nodes}
        ce, projection = by_name[site.loss], by_name[site.projection]
        chain = [by_name[name] for name, _, _ in site.chain]
        with graph.inserting_before(ce):
            x = by_name[site.x]
            for node, (_, kind, _) in zip(chain, site.chain):
                if kind == "rows":
                    x = _x_row_op(graph, node, x, site.vocab, site.dim)
            weight = by_name[site.weight]
            if site.kind == "matmul":  # x @ M with M (D, V): the weight is M.t()
                weight = graph.call_method("t", (weight,))
                _fake_run(weight)
            bias = by_name[site.bias] if site.bias else None
            loss = graph.call_function(lce.linear_cross_entropy, (x, weight, bias, by_name[site.targets]), {
                "ignore_index": site.ignore_index, "reduction": site.reduction,
                "label_smoothing": site.label_smoothing, "mm_dtype": site.mm_dtype, "loss_dtype": site.loss_dtype,
                "chunk_tokens": sp.chunk_tokens})
        loss.meta.update({k: v for k, v in ce.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
        loss.meta["example_value"] = value(ce)  # the same scalar loss
        ce.replace_all_uses_with(loss)
        for node in [ce, *reversed(chain), projection]:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


# -- the pass -------------------------------------------------------------------------------------


def _budget_of(ctx: PassContext) -> int | None:
    """The budget the chunks are planned for: what the checkpoint pass carried back (the
    smallest feasible budget, when the step's budget was below it: see ``checkpoint.run``),
    else this pass's budget argument, else the checkpoint pass's budget, else the option."""
    carried = loss_choice.choice_of(ctx)
    if carried is not None and carried.budget is not None:
        return carried.budget
    if ctx.args.get("budget") is not None:
        return ctx.args["budget"]
    checkpoint = ctx.config.pipeline.get("checkpoint")
    if checkpoint is not None and checkpoint.arg("budget") is not None:
        return parse_bytes(checkpoint.arg("budget"), "checkpoint{budget=...}")
    return ctx.config.options.memory_budget


def _wants_gradients(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs)


def run(gm: GraphModule, ctx: PassContext) -> PassResult:
    plan = plan_chunk_loss(gm, chunks=ctx.args.get("chunks"), budget=_budget_of(ctx))
    ctx.dump_text("chunk_loss.md", plan.text())
    ctx.report(**{f"chunk_loss_{k}": v for k, v in plan.stats().items()})
    if not plan.found:
        return PassResult(gm, changed=False, stats=plan.stats())
    # choose=faster (the pipeline holds the checkpoint pass: compile/pipeline.resolve checks it)
    if ctx.args.get("choose") == loss_choice.FASTER and _wants_gradients(ctx.example_inputs):
        carried = loss_choice.choice_of(ctx)
        if carried is None:  # the first compile: the unchunked step, for the checkpoint planner to price
            ctx.state.findings["chunk_loss"] = [s.site.loss for s in plan.sites]
        if carried is None or not carried.chunked:
            ctx.report(chunk_loss_chunked=False)
            return PassResult(gm, changed=False, stats={**plan.stats(), "chunked": False})
    return PassResult(apply_chunk_loss(gm, plan), changed=True, stats=plan.stats())
