"""checkpoint: save fewer activations and recompute the rest in backward, under a budget.

Runs in the joint stage (Inductor's partitioner). ``plan_checkpoint``
(``dsgraph.recompute.planner``) decides what to save at the least recomputation time such
that the step's predicted peak stays within ``budget`` bytes; the pass hands the partition
it chose to the driver (``ctx.set_partitioner``). The joint graph itself is not changed
(besides Inductor-style CSE, which the stock partitioner does too), so gradients are
bitwise those of the stock partition: recomputing an op gives the same bits, and random
ops are never recomputed (their outputs are saved). Before/after (what the backward
receives)::

    saved: ln_1, mm_1, gelu_1, mm_2, ...   ->   saved: add_3 (the block's input)
                                                 backward recomputes ln_1 ... gelu_1 before use

Once the forward and backward are compiled, a post-compile check holds the step peak of
the buffer plans that will execute (Inductor's own, or the FX code's with
``inductor=False``) against the budget. The planner predicts those plans
(``dsgraph.analysis.step_model``) and can err; on an overrun the check asks for another
compile (``Recompile``) that plans the observed error below the budget, up to
``MAX_COMPILES`` compiles, then warns (``DsgraphBudgetWarning``).
"""

from __future__ import annotations

import warnings

from dsgraph import compat
from dsgraph.analysis.cost_model import RATES
from dsgraph.analysis.lifetimes import bytes_of
from dsgraph.analysis.library_memory import blas_workspace_bytes
from dsgraph.analysis.step import inductor_timeline, inputs_external
from dsgraph.analysis.timeline import Interval
from dsgraph.errors import BudgetError, DsgraphBudgetWarning
from dsgraph.pass_api import CompiledStep, PassContext, PassResult, PassSpec, Recompile
from dsgraph.passes import loss_choice
from dsgraph.passes.allreduce import inflight_bytes
from dsgraph.recompute.planner import CheckpointPlan, plan_checkpoint
from dsgraph.units import parse_bytes

# compiles of one graph under a memory budget whose Inductor plan overruns it (each one
# plans the overruns so far below the budget): the prediction errs by a few percent, so
# one more compile usually fits
MAX_COMPILES = 3


def _budget(raw: str) -> int:
    return parse_bytes(raw, "checkpoint{budget=...}")


def _rates(raw: str) -> str:
    if raw not in RATES:
        raise ValueError(f"checkpoint{{rates=...}} must be one of {list(RATES)}, got {raw!r}")
    return raw


def _flag(name: str):
    def parse(raw: str) -> bool:
        if raw not in ("0", "1"):
            raise ValueError(f"checkpoint{{{name}=...}} must be 0 or 1, got {raw!r}")
        return raw == "1"
    return parse


_mixes = _flag("mixes")


def _chunks_asked(ctx: PassContext) -> bool:
    """Did the user ask for a chunk count (``chunk_loss=N``)? Then it is kept."""
    chunk_loss = ctx.config.pipeline.get("chunk_loss")
    return chunk_loss is not None and chunk_loss.arg("chunks") is not None


def _refit(ctx: PassContext) -> bool:
    """Fewer, larger loss chunks where the plan's peak allows (``recompute.workspace_fit``):
    not for a chunk count the user asked for, nor with ``refit=0``."""
    return ctx.args.get("refit", True) and not _chunks_asked(ctx)


SPEC = PassSpec(
    name="checkpoint",
    stages=("joint",),
    args={"budget": _budget, "rates": _rates, "mixes": _mixes, "refit": _flag("refit")},
    doc="activation checkpointing under a memory budget in bytes; rates=bandwidth|profile prices recomputation; "
        "mixes=0 leaves out the recompute-then-cheap candidates; refit=0 keeps the loss chunks chunk_loss sized "
        "(by default fewer, larger chunks where the plan's peak allows)",
)


def apply_checkpoint(plan: CheckpointPlan, ctx: PassContext) -> None:
    """The driver partitions with the planned forward and backward."""
    forward, backward = plan.forward, plan.backward

    def planned_partition(gm, joint_inputs, **kwargs):
        return forward, backward

    ctx.set_partitioner(planned_partition)


def _gradients(gm, num_fwd_outputs: int) -> list:
    out = gm.graph.output_node().args[0]
    return [o for o in list(out)[num_fwd_outputs:] if o is not None]


def _parameter_gradients(gm, num_fwd_outputs: int, params: list) -> frozenset[str]:
    """Names of the backward outputs that are parameters' gradients (the pool's)."""
    out = list(gm.graph.output_node().args[0])[num_fwd_outputs:]
    return frozenset(o.name for o, p in zip(out, params) if o is not None and p is not None)


def _parameter_inputs(gm, params: list) -> frozenset[str]:
    """Names of the joint graph's primals that are parameters: with the pool the backward
    receives a handle on each (``ctx.pass_to_backward``), which keeps it out of Inductor's
    channels-last copies (``compile.partition_edit``)."""
    primals = [n for n in gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    return frozenset(n.name for n, p in zip(primals, params) if p is not None)


def _gradient_bytes(gm, num_fwd_outputs: int) -> int:
    return bytes_of(_gradients(gm, num_fwd_outputs))


def check_compiled(plan: CheckpointPlan, step: CompiledStep, external_bytes: int | None = None,
                   library_bytes: int = 0, spent: int = 0) -> None:
    """Hold the step peak of the compiled graphs' own buffer plans against the budget.

    An overrun asks for another compile that keeps below the budget what this plan's
    prediction erred by (its prediction was within the budget, so that is at least the
    overrun), or the overruns so far, whichever is more, plus 1% of the budget (the error
    changes from plan to plan); at the last compile, or when the margin already left no
    plan, it warns. ``external_bytes``: what exists beside the graphs' own buffers (default:
    what the planner counted); ``library_bytes``: the CUDA BLAS libraries' workspaces
    (``analysis.library_memory``), counted apart so the plan's figures name them; ``spent``:
    compiles spent before on choosing the loss (``loss_choice``), not counted here."""
    extra = plan.extra_external if external_bytes is None else external_bytes
    external = inputs_external(step.forward) + [Interval("gradient pool", extra, 0, 0)]
    if library_bytes:
        external.append(Interval("CUDA BLAS workspaces", library_bytes, 0, 0))
    peak = inductor_timeline(step.forward_plan, step.backward_plan, step.backward_fx_plan, external,
                             step.saved_names).peak_bytes
    plan.inductor_peak = peak
    step.figures["checkpoint_inductor_peak"] = peak
    if peak <= plan.budget:
        return
    who = "Inductor" if step.executor == "inductor" else "the FX code"
    # a plan already the smallest the planner found (a capped margin's plan is) gets no
    # smaller by planning again: a second compile would give the same peak and cost the
    # first step a compile (the 24-layer GPT's chunked plan on an H200, session 27: 50 s
    # against 23 s)
    if step.attempt - spent < MAX_COMPILES and not plan.smallest:
        error = peak - (plan.predicted_peak - plan.margin)
        margin = max(error, plan.margin + peak - plan.budget) + plan.budget // 100
        raise Recompile(SPEC.name, margin, f"{who}'s plan peaks at {peak} bytes, over the budget "
                        f"{plan.budget}; planning again {margin} bytes below it", MAX_COMPILES + spent)
    if plan.margin_capped:
        last = "the last with the smallest plan (a larger margin leaves none)"
    elif plan.smallest:
        last = "with the smallest plan the planner found (planning again below the budget gives none smaller)"
    else:
        last = f"the last planning {plan.margin} bytes below the budget"
    warnings.warn(
        f"dsgraph memory budget {plan.budget} bytes: {who}'s plan of the compiled graphs peaks at "
        f"{peak} bytes after {step.attempt} compiles, {last}",
        DsgraphBudgetWarning, stacklevel=2)


def lowers_recomputation(lower_triton, executor: str) -> bool:
    """Will ``lower_triton`` run the recomputed chains as dsgraph's own kernels inside
    Inductor's code (so recomputation costs what those kernels measured)? Its selections
    ``tagged`` (the default: the partition tags recomputed nodes), ``recomputed`` and ``all``
    take them; FX execution launches the kernels from Python and ``opaque=1`` keeps them
    out of Inductor's wrapper, slower (docs/BENCHMARKS.md), so those keep the generated
    kernels' price."""
    if lower_triton is None or executor != "inductor" or lower_triton.arg("opaque") == "1":
        return False
    return (lower_triton.arg("select") or "tagged") in ("tagged", "recomputed", "all")


def _chunks_for_the_floor(ctx: PassContext, error: BudgetError) -> None:
    """A budget below the floor, with ``chunk_loss`` in the pipeline: its chunks were
    planned for the budget asked, and asking for the floor would plan them for the floor
    (larger chunks, another graph, another floor: a reported budget refused when asked).
    Compile again with the chunks planned for the floor until the floor they give is the
    one they were planned for; then the BudgetError reports a budget that is honoured."""
    floor = error.smallest_feasible
    chunk_loss = ctx.config.pipeline.get("chunk_loss")
    choice = loss_choice.choice_of(ctx)
    if chunk_loss is None or _chunks_asked(ctx) or (choice is not None and choice.budget == floor):
        return
    if choice is not None and not choice.chunked:
        return  # this compile's loss is not chunked (loss_choice): no chunks to plan
    spent = loss_choice.compiles_spent(ctx)
    if ctx.state.attempt - spent >= MAX_COMPILES:
        return  # the last compile: the floor is reported as found
    again = loss_choice.LossChoice(True, decided=True, spent=spent, budget=floor,
                                   reason=choice.reason if choice is not None else "")
    raise Recompile("chunk_loss", again, f"the budget is below the smallest feasible one ({floor} bytes): "
                    "planning the loss chunks for that budget", MAX_COMPILES + spent)


def run(gm, ctx: PassContext) -> PassResult:
    budget = ctx.args.get("budget")
    if budget is None:
        raise ValueError("the checkpoint pass needs a budget: checkpoint{budget=6GiB} or options={'memory_budget': ...}")
    kwargs = ctx.state.partition_kwargs
    if kwargs is None:
        raise RuntimeError("checkpoint runs in the joint stage only (no partition arguments found)")
    gm.graph = compat.fx_graph_cse(gm)  # what the stock partitioner does first
    gm.recompile()
    # with the gradient pool, the gradients' bytes exist from the start of the step (the
    # pool is allocated once), and the parameters' gradients the backward makes go into it:
    # their buffers live only to their last use in the graph (``pooled``). Until session 10
    # they were held to the end of the step too, counted twice (the H200's vit_b_16:
    # predicted 1.10 GB against a compiled plan of 0.80 GB)
    pooling = bool(ctx.config.pipeline.get("grad_pool"))
    pool = _gradient_bytes(gm, kwargs["num_fwd_outputs"]) if pooling else 0
    pooled = _parameter_gradients(gm, kwargs["num_fwd_outputs"], ctx.state.graph_params) if pooling else frozenset()
    handled = _parameter_inputs(gm, ctx.state.graph_params) if pooling else frozenset()
    # compressed all-reduce buckets are copies in flight until the end of the backward: counted
    # as if they lived through the step (high by their size before the backward makes them);
    # Inductor's plan, which the check reads, holds them as the buffers they are
    allreduce = ctx.config.pipeline.get("allreduce")
    inflight = 0 if allreduce is None else inflight_bytes(_gradients(gm, kwargs["num_fwd_outputs"]),
                                                          allreduce.arg("compress") or "none")
    # the BLAS libraries' workspaces are allocated once per thread and stay: in every measured
    # peak, in no graph's plan
    library = blas_workspace_bytes(gm)
    # a compile after Inductor's plan overran the budget plans with the overrun reserved
    try:
        plan = plan_checkpoint(gm, ctx.example_inputs, kwargs, budget, extra_external=pool + inflight + library,
                               margin=ctx.carry or 0, executor=ctx.config.executor, pooled=pooled,
                               handled=handled,
                               lowered=lowers_recomputation(ctx.config.pipeline.get("lower_triton"),
                                                            ctx.config.executor),
                               rates_source=ctx.args.get("rates") or "bandwidth",
                               mixes=ctx.args.get("mixes", True), refit=_refit(ctx))
    except BudgetError as e:
        loss_choice.after_planning(ctx, None, e)  # the other loss, while the choice is open
        _chunks_for_the_floor(ctx, e)
        raise
    loss_choice.after_planning(ctx, plan, None)
    apply_checkpoint(plan, ctx)
    ctx.dump_text("checkpoint.md", plan.text())
    ctx.report(**{f"checkpoint_{k}": v for k, v in plan.stats().items()})
    # the planner predicts the plans of the executor that runs (Inductor's or FX's); the
    # check holds those plans, as compiled, against the budget
    spent = loss_choice.compiles_spent(ctx)
    ctx.add_post_compile_check(lambda step: check_compiled(plan, step, pool, library, spent))
    return PassResult(gm, changed=plan.predicted_peak < plan.stock_peak or bool(plan.regions),
                      stats={**plan.stats(), "pool_bytes": pool, "inflight_bytes": inflight,
                             "blas_workspace_bytes": library})
