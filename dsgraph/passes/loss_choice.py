"""Chunked loss or not, whichever the checkpoint planner predicts faster.

With ``chunk_loss{choose=faster}`` (what the option ``chunk_loss="faster"`` gives; it needs
a memory budget) the step is planned both ways and the plan predicted faster is compiled.
Neither wins everywhere (H200, docs/BENCHMARKS.md "Session 20"): the chunked loss frees the
logits (GPT-2-small at 16 x 1024 tokens: 1.6 GB in bf16 and their fp32 softmax), so under a
tight budget the planner recomputes less elsewhere (GPT-2 at 4.9 GiB: 1.78 ms of predicted
recomputation chunked against 4.02 unchunked) or only the chunked step fits at all; where the
budget leaves room for the logits the two plans recompute about as much (the 24-layer GPT at
per-block checkpointing's memory: 10.10 against 9.89 ms) and the unchunked step ran 1.7 ms
faster in both calls that measured the two, its loss head being Inductor's own GEMMs.

The price: each plan's predicted recomputation time (``CheckpointPlan.recompute_seconds``).
The two loss heads do the same three GEMMs and their own time is not priced; a tie goes to
the unchunked loss, the faster of the two at equal recomputation in the profiles taken
(BENCHMARKS.md: the chunked head's five GEMMs of the 24-layer GPT).

Compiles, each from Dynamo's graph (``Recompile``, the loss as ``LossChoice`` says):
1. unchunked (the chunk_loss pass leaves the graph and records its sites in
   ``ctx.state.findings``). The stock partition (no segment recomputed) is the choice
   (recomputation cannot get below it, and a tie goes to the unchunked loss); a budget the
   unchunked step cannot meet goes to 2 with the choice made;
2. chunked: kept when its plan recomputes less than 1's, or 1 could not meet the budget;
3. otherwise unchunked again, the choice made (the same plan as 1: planning is
   deterministic).
The compiles the choice spends do not count against the budget check's ``MAX_COMPILES``.
Each traces the joint graph and plans it again: on the H200 the first step grew from 25 to
41 s on GPT-2-small (two compiles) and from 65 to 102 s on a 24-layer GPT (three), so the
choice is asked for (``chunk_loss="faster"``), not the default (docs/BENCHMARKS.md, session 21).
A graph that computes no gradient has no plan to price: its loss is chunked (the memory
without the logits, nothing recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsgraph.errors import BudgetError
from dsgraph.pass_api import PassContext, Recompile

FASTER = "faster"  # chunk_loss{choose=...}: plan both, compile the faster
ALWAYS = "always"  # the default: chunk whenever the pattern is found


@dataclass(frozen=True)
class LossChoice:
    """What the next compile does with the loss (carried as the chunk_loss pass's ``ctx.carry``)."""

    chunked: bool
    decided: bool = False  # no further compile for the choice
    spent: int = 0  # compiles the choice used before this one's variant (not the budget check's)
    budget: int | None = None  # chunks planned for this budget (the floor), else the step's
    unchunked_ms: float | None = None  # the unchunked plan's predicted recomputation (None: not planned)
    chunked_ms: float | None = None
    reason: str = ""


def choice_of(ctx: PassContext) -> LossChoice | None:
    carried = ctx.state.carry.get("chunk_loss")
    return carried if isinstance(carried, LossChoice) else None


def compiles_spent(ctx: PassContext) -> int:
    """Compiles spent on the choice before this one: the budget check's count starts after them."""
    choice = choice_of(ctx)
    return choice.spent if choice is not None else 0


def open_choice(ctx: PassContext) -> bool:
    """Did this compile's chunk_loss pass leave loss sites unchunked for the planner to price?"""
    return bool(ctx.state.findings.get("chunk_loss"))


def _ms(seconds: float) -> float:
    return seconds * 1e3  # compared unrounded; the reasons print 3 decimals


def _again(choice: LossChoice, why: str) -> Recompile:
    from dsgraph.passes.checkpoint import MAX_COMPILES  # here: checkpoint imports this module

    return Recompile("chunk_loss", choice, why, MAX_COMPILES + choice.spent)


def after_planning(ctx: PassContext, plan, error: BudgetError | None) -> None:
    """Called by the checkpoint pass with its plan (a ``CheckpointPlan``, or None and the
    BudgetError it got): raises ``Recompile`` for the other loss while the choice is open."""
    choice = choice_of(ctx)
    if choice is not None and choice.decided:
        record(ctx, choice)
        return
    if choice is None:  # compile 1: the loss unchunked
        if not open_choice(ctx):
            return  # no loss site in this graph: nothing to choose
        if error is not None:
            raise _again(LossChoice(True, decided=True, spent=1, reason=(
                f"the unchunked loss cannot meet the budget (smallest feasible {error.smallest_feasible} B)")),
                "the unchunked loss cannot meet the budget: compiling the chunked loss")
        if not plan.regions:
            record(ctx, LossChoice(False, decided=True, unchunked_ms=_ms(plan.recompute_seconds),
                                   reason="the unchunked step meets the budget with the stock partition"))
            return
        u = _ms(plan.recompute_seconds)
        raise _again(LossChoice(True, spent=1, unchunked_ms=u),
                     f"the unchunked plan recomputes {u:.3f} ms: planning the chunked loss to compare")
    # compile 2: the loss chunked, compared with compile 1's plan
    c = None if error is not None else _ms(plan.recompute_seconds)
    if c is not None and c < choice.unchunked_ms:
        record(ctx, replace(choice, decided=True, chunked_ms=c,
                            reason=f"the chunked plan recomputes less ({c:.3f} ms against {choice.unchunked_ms:.3f} ms)"))
        return
    why = ("the chunked loss cannot meet the budget" if c is None else
           f"the unchunked plan recomputes no more ({choice.unchunked_ms:.3f} ms against {c:.3f} ms chunked)")
    raise _again(LossChoice(False, decided=True, spent=2, unchunked_ms=choice.unchunked_ms, chunked_ms=c,
                            reason=why), why + ": compiling the unchunked loss")


def _show(ms: float | None) -> str:
    return "not planned or the budget not met" if ms is None else f"{ms:.3f} ms"


def record(ctx: PassContext, choice: LossChoice | None = None) -> None:
    """The choice in the joint graph's report and the checkpoint dump."""
    choice = choice if choice is not None else choice_of(ctx)
    if choice is None or not choice.reason:
        return
    ctx.dump_text("loss_choice.md", "# loss choice\n\n" + "\n".join([
        f"- loss {'chunked' if choice.chunked else 'unchunked'}: {choice.reason}",
        f"- predicted recomputation: unchunked {_show(choice.unchunked_ms)}, chunked {_show(choice.chunked_ms)}",
        f"- compiles for the choice: {choice.spent + 1}"]) + "\n")
    ctx.report(loss_chunked=choice.chunked, loss_choice=choice.reason,
               loss_unchunked_recompute_ms=choice.unchunked_ms, loss_chunked_recompute_ms=choice.chunked_ms,
               loss_choice_compiles=choice.spent + 1)
