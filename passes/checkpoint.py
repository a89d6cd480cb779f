"""checkpoint: save fewer activations and recompute the rest in backward, under a budget.

Runs in the joint stage (Inductor's partitioner). ``plan_checkpoint``
(``dsgraph.recompute.planner``) decides what to save at the least recomputation time such
that the step's predicted peak stays within ``budget`` bytes; this pass hands the
partition it chose to the session's partitioner. The joint graph itself is not changed
(besides Inductor-style CSE, which the stock partitioner does too), so gradients are
bitwise those of the stock partition: recomputing an op gives the same bits, and random
ops are never recomputed (their outputs are saved).
"""

from __future__ import annotations

from dsgraph.analysis.lifetimes import bytes_of
from dsgraph.context import PassContext, PassResult
from dsgraph.recompute.planner import CheckpointPlan, plan_checkpoint
from dsgraph.registry import PassSpec
from dsgraph.units import parse_bytes


def _budget(raw: str) -> int:
    return parse_bytes(raw, "checkpoint{budget=...}")


SPEC = PassSpec(
    name="checkpoint",
    stages=("joint",),
    args={"budget": _budget},
    doc="activation checkpointing under a memory budget in bytes",
)


def apply_checkpoint(plan: CheckpointPlan, ctx: PassContext) -> None:
    """The session's partitioner returns the planned forward and backward."""
    forward, backward = plan.forward, plan.backward

    def planned_partition(gm, joint_inputs, **kwargs):
        return forward, backward

    ctx.shared["partition_fn"] = planned_partition
    ctx.shared["checkpoint_plan"] = plan


def _gradient_bytes(gm, num_fwd_outputs: int) -> int:
    out = gm.graph.output_node().args[0]
    grads = [o for o in list(out)[num_fwd_outputs:] if o is not None]
    return bytes_of(grads)


def run(gm, ctx: PassContext) -> PassResult:
    budget = ctx.args.get("budget")
    if budget is None:
        raise ValueError("the checkpoint pass needs a budget: checkpoint{budget=6GiB} or options={'memory_budget': ...}")
    kwargs = ctx.shared.get("partition_kwargs")
    if kwargs is None:
        raise RuntimeError("checkpoint runs in the joint stage only (no partition arguments found)")
    from torch._functorch.compile_utils import fx_graph_cse

    gm.graph = fx_graph_cse(gm.graph)  # what the stock partitioner does first
    gm.recompile()
    # with the gradient pool, the gradients' bytes exist from the start of the step (the
    # pool is allocated once); the simulation still counts each gradient where the
    # backward makes it, so this errs high by at most the pool's size
    extra = _gradient_bytes(gm, kwargs["num_fwd_outputs"]) if ctx.config.pipeline.get("grad_pool") else 0
    # a second compile after Inductor's plan overran the budget plans with the overrun
    # reserved (the session checks Inductor's plan against the budget, see session.py)
    plan = plan_checkpoint(gm, ctx.example_inputs, kwargs, budget, extra_external=extra,
                           margin=ctx.shared.get("checkpoint_margin", 0), executor="inductor" if ctx.config.options.inductor else "fx")
    apply_checkpoint(plan, ctx)
    return PassResult(gm, changed=plan.predicted_peak < plan.stock_peak or bool(plan.regions), stats=plan.stats())
