"""Where the Inductor emulation's live set differs from Inductor's own plan, buffer by
buffer, on a zoo model (a diagnostic for the zoo prediction test,
tests/e2e/test_checkpoint_zoo_inductor.py).

    python -m benchmarks.planner_gap llama --plan smallest [--step K]

``gap(model, inputs, joint, budget, ...)`` does the same for any model (bf16 autocast, a
pre_grad rewrite such as chunk_loss: ``benchmarks.budget_gap`` uses it).

Compiles the partition the planner makes at a budget (``stock``, ``halfway``,
``smallest``) through Inductor (stopped after code generation), evaluates the emulation on
the same saved set, and at Inductor's peak step (or clock step ``K`` of Inductor's plan)
finds the emulated kernel lowered from the same FX node; then lists the buffers live in
one and not the other, each named by the FX node it holds (Inductor's ``origin_node``),
and the steps each starts and ends at on both clocks.
"""

from __future__ import annotations

import argparse
import contextlib

from dsgraph.analysis.step_model import StepModel
from dsgraph.recompute import truth
from dsgraph.recompute.joint import JointGraph
from dsgraph.recompute.planner import external_bytes, plan_checkpoint


def run(name: str, plan_label: str = "smallest", step: int | None = None, every: bool = False) -> dict:
    from tests import zoo
    from tests.e2e.test_checkpoint_zoo import captured, smallest, stock_peak

    j = captured(name)
    low = smallest(j, "inductor").smallest_feasible
    budget = {"stock": 1 << 50, "smallest": low}.get(plan_label)
    if budget is None:
        budget = (low + stock_peak(j, "inductor")) // 2
    model, inputs = zoo.build(name)
    return gap(model, inputs, j, budget, f"{name} {plan_label}", step, every)


@contextlib.contextmanager
def inductor_pool_decisions():
    """Inductor's own pool decisions while it compiles (``AllocateLine.should_reuse_buffer``,
    wrapped): per graph compiled, the estimate's peak and its curve over scheduler nodes
    (``memory.estimate_peak_memory``), and (buffer, freed buffer, freed at, allocated at,
    bytes, peak in between, taken) for each decision. Read, not changed: a diagnostic."""
    from torch._inductor import memory
    from torch._inductor.codegen import wrapper

    graphs: list[dict] = []
    estimate, decide = memory.estimate_peak_memory, wrapper.AllocateLine.should_reuse_buffer

    def recording_estimate(*args, **kwargs):
        overall, curve = estimate(*args, **kwargs)
        graphs.append({"overall": overall, "curve": list(curve), "decisions": [],
                       "nodes": [], "buffers": []})
        try:  # each scheduler node's kind and buffers, each buffer's bytes and steps
            nodes = args[0] if args else kwargs["nodes"]
            graphs[-1]["nodes"] = [(type(n).__name__, n.get_name()) for n in nodes]
            timeline, _, _ = memory.compute_memory_timeline(*args, **kwargs)
            graphs[-1]["buffers"] = [(b.buffer.get_name(), type(b.buffer).__name__, b.size_alloc, b.size_free,
                                      b.start_step, b.end_step) for b in timeline]
        except AttributeError:  # a torch without compute_memory_timeline: the buffers are not recorded
            pass
        return overall, curve

    def recording_decide(self, free_line, size):
        taken = decide(self, free_line, size)
        try:
            between = self.wrapper.estimate_peak.peak_between(free_line, self)
            graphs[-1]["decisions"].append((self.node.get_name(), free_line.node.get_name(),
                                            free_line.scheduler_node_index, self.scheduler_node_index,
                                            size, between, bool(taken)))
        except Exception:  # another torch's wrapper: the decisions are not recorded
            pass
        return taken

    memory.estimate_peak_memory, wrapper.AllocateLine.should_reuse_buffer = recording_estimate, recording_decide
    try:
        yield graphs
    finally:
        memory.estimate_peak_memory, wrapper.AllocateLine.should_reuse_buffer = estimate, decide


def gap(model, inputs, j, budget: int, title: str, step: int | None = None, every: bool = False,
        autocast=None, pre_grad=None, verbose: bool = True, extra_external: int = 0) -> dict:
    """``run`` on any model: ``j`` its captured joint graph (``truth.capture_joint`` with the
    same ``autocast`` and ``pre_grad``), the partition the planner makes at ``budget``
    (with ``extra_external`` bytes beside the graphs, as the session plans: the CUDA BLAS
    workspaces; the truth does not hold them, so the printed error leaves them out)."""
    static = j.kwargs.get("static_lifetime_input_indices") or []
    joint = JointGraph.build(j.gm, j.kwargs["num_fwd_outputs"], static)
    sm = StepModel(j.gm, j.kwargs["num_fwd_outputs"], static, external=external_bytes(joint))
    made = {}

    def choose(gm, ji, kw):
        made["plan"] = plan_checkpoint(gm, ji, kw, budget, executor="inductor", extra_external=extra_external)
        return made["plan"].forward, made["plan"].backward

    with inductor_pool_decisions() as inductor_decisions:
        real = truth.compiled_peaks(model, inputs, choose, inductor=True, autocast=autocast, pre_grad=pre_grad)
    tl = real.inductor
    by = {n.name: n for n in j.gm.graph.nodes}
    saved = [sm.index[by[n]] for n in real.saved_names if n in by]
    from dsgraph.analysis import inductor_reuse

    trace = inductor_reuse.POOL_TRACE = inductor_reuse.PoolTrace()
    try:
        pred = sm.evaluate(saved, "inductor", explain=True)
    finally:
        inductor_reuse.POOL_TRACE = None
    predicted = made["plan"].predicted_peak - extra_external
    print(f"{title}: predicted {predicted} model {pred.peak} truth {tl.peak_bytes} "
          f"error {predicted / tl.peak_bytes - 1:+.2%}")
    print("  model peaks at", pred.steps[pred.peak_step][0], sm.nodes[pred.steps[pred.peak_step][1]].name,
          "truth at", tl.entries[tl.peak_index()])
    f = len(real.plans["forward"].steps)

    def truth_origins(k: int) -> tuple[str, list[str]]:
        if 1 <= k <= f:
            return "forward", real.step_origins["forward"][k - 1]
        if f < k <= f + len(real.plans["backward"].steps):
            return "backward", real.step_origins["backward"][k - 1 - f]
        return "", []

    from dsgraph.analysis.inductor_ops import EXTERN

    position = {n.name: k for k, n in enumerate(sm.nodes)}

    def model_step(k: int) -> int | None:
        """The emulated kernel of the same FX node: an extern kernel's if the step has one,
        else the one of the latest node among the step's origins."""
        graph, names = truth_origins(k)
        hits = [s for s, (g, i) in enumerate(pred.steps) if g == graph and i >= 0 and sm.nodes[i].name in names]
        if not hits:
            return None
        extern = [s for s in hits if sm.info[pred.steps[s][1]].kind == EXTERN]
        return max(extern or hits, key=lambda s: position[sm.nodes[pred.steps[s][1]].name])

    def tname(label: str) -> str:
        """An Inductor buffer by the FX node it holds (else the latest of its origins)."""
        stage, _, buf = label.partition(":")
        node = real.origin_node.get(stage, {}).get(buf)
        if not node:
            origins = [o for o in real.origins.get(stage, {}).get(buf, ()) if o in position]
            node = max(origins, key=position.__getitem__) if origins else None
        return f"{stage}:{node}" if node else label

    # the emulation's buffers of a multi-output node, by the getitem that takes each element
    element_names: dict[str, list[str]] = {}
    for n in sm.nodes:
        if n.op == "call_function" and sm.is_getitem[sm.index[n]] and isinstance(n.args[0], type(n)):
            element_names.setdefault(n.args[0].name, []).append(n.name)

    def pname(label: str) -> str:
        stage, _, node = label.partition(":")
        node = node.replace(":workspace", "")
        return label if node not in element_names else f"{stage}:{node}[{'|'.join(element_names[node])}]"

    external = real.external
    bw0 = next((s for s, (g, _) in enumerate(pred.steps) if g == "backward"), 0)

    def reuse_chain(stage: str, buf: str) -> None:
        """The largest truth-only buffer's block as Inductor's wrapper reuses it (each buffer
        that takes it over, at its scheduler step, and the FX node it holds), then the
        emulation's buffers of those nodes and the pool decisions on them (steps on the
        emulated graph's own clock; the step model's clock adds the backward's start)."""
        allocs = real.allocations.get(stage, [])
        root = {}
        for _, name, _, _, reuses in allocs:
            if reuses is not None:
                root[name] = root.get(reuses, reuses)
        chain = [a for a in allocs if a[1] == buf or root.get(a[1]) == buf]
        nodes = []
        for step_, name, node, nbytes, reuses in chain:
            print(f"       truth chain: step {step_} {name} holds {node} ({nbytes} B)"
                  + (f", reusing {reuses}" if reuses else ""))
            if node:
                nodes.append(node)
        for node in nodes:
            for a, b, nbytes, label in pred.intervals or ():
                if label == f"{stage}:{node}":
                    print(f"       model: {label} {nbytes} B [{a}, {b}] (own clock {a - bw0 if stage == 'backward' else a})")
        names = {a[1] for a in chain}
        stage_graph = [g for g in inductor_decisions if any(d[0] in names for d in g["decisions"])]
        for g in stage_graph[-1:]:
            curve = g["curve"]
            top = max(range(len(curve)), key=curve.__getitem__)
            origins = real.step_origins.get(stage, [])
            where = " ".join(origins[top])[:120] if top < len(origins) else "the end"
            print(f"       inductor's estimate: peak {g['overall']} at scheduler node {top} of {len(curve)} ({where})")
            for name, freed_name, freed, at, nbytes, between, taken in g["decisions"]:
                if name in names or freed_name in names:
                    print(f"       inductor pool: {name} asks at {at} for {freed_name} (freed at {freed}): "
                          f"{nbytes} + {between} = {nbytes + between} against {g['overall']}: "
                          f"{'taken' if taken else 'refused'}")
        ids = {sm.index[by[n]] for n in nodes if n in by}
        runs = [p[0] for p in trace.peaks]  # the emulated graphs in the order they ran
        for run_id, overall, node, at, steps in trace.peaks:
            print(f"       model's estimate (graph {runs.index(run_id) + 1} of {len(runs)}): peak {overall} at "
                  f"step {at} of {steps} ({sm.nodes[node].name})")
        for run_id, taker, r, freed, at, nbytes, need, overall, taken in trace.decisions:
            if taker in ids or r in ids:
                print(f"       pool (graph {runs.index(run_id) + 1} of {len(runs)}): {sm.nodes[taker].name} asks at "
                      f"{at} for {sm.nodes[r].name}'s block "
                      f"(freed after {freed}): live {need} against the estimated peak {overall}: "
                      f"{'taken' if taken else 'refused'}")

    def compare(k: int, verbose: bool = True) -> int:
        m = model_step(k)
        t_live = [iv for iv in tl.live_at(k) if not iv.label.startswith("input:")]
        t_sum = sum(iv.nbytes for iv in t_live) + external
        if m is None:
            if verbose:
                print(f"  truth step {k} ({truth_origins(k)}): no emulated kernel of those nodes")
            return 0
        p_live = pred.live_at(m)
        p_sum = pred.live[m]
        if not verbose:
            return p_sum - t_sum
        print(f"  truth step {k} {tl.entries[k].node} ({' '.join(truth_origins(k)[1])}) live {t_sum}; "
              f"model step {m} live {p_sum}: {p_sum - t_sum:+d}")
        # pair each Inductor buffer with an emulated one of the same bytes whose node is
        # among its origins (an element of a multi-output node: by its getitem)
        t_items = [(iv, set(real.origins.get(iv.label.partition(":")[0], {}).get(iv.label.partition(":")[2], ()))
                    | {tname(iv.label).partition(":")[2]}) for iv in t_live]
        p_items = list(p_live)
        matched_t, matched_p = set(), set()
        for strict in (True, False):
            for a, (iv, origins) in enumerate(t_items):
                if a in matched_t:
                    continue
                stage = iv.label.partition(":")[0]
                for b, (_, _, nbytes, label) in enumerate(p_items):
                    if b in matched_p or nbytes != iv.nbytes or not label.startswith(stage):
                        continue
                    node = label.partition(":")[2].replace(":workspace", "")
                    names = {node} | set(element_names.get(node, ()))
                    if (names & origins) if strict else True:
                        matched_t.add(a)
                        matched_p.add(b)
                        break
        only_t = [t_items[a][0] for a in range(len(t_items)) if a not in matched_t]
        only_p = [p_items[b] for b in range(len(p_items)) if b not in matched_p]
        print(f"   only in truth ({sum(iv.nbytes for iv in only_t)} B):")
        for n_shown, iv in enumerate(sorted(only_t, key=lambda iv: -iv.nbytes)):
            stage, _, buf = iv.label.partition(":")
            print(f"     {iv.label} {iv.nbytes} [{iv.start}, {iv.end}] origins "
                  f"{' '.join(real.origins.get(stage, {}).get(buf, ()))[:150]}")
            if n_shown == 0:
                reuse_chain(stage, buf)
        print(f"   only in model ({sum(x[2] for x in only_p)} B):")
        for a, b, nbytes, label in sorted(only_p, key=lambda x: -x[2]):
            print(f"     {pname(label)} {nbytes} [{a}, {b}]")
        print("   same bytes, other names:", sum(1 for a in matched_t) - sum(
            1 for a in matched_t if a in matched_t), "(pairs by bytes alone follow the strict pairs)")
        return p_sum - t_sum

    if every:
        for k in range(len(tl.entries)):
            d = compare(k, verbose=False)
            graph, names = truth_origins(k)
            print(f"  {k:4d} {graph:8s} {tl.entries[k].live_bytes:9d} {d:+8d} {' '.join(names)[:80]}")
    if verbose:
        compare(tl.peak_index() if step is None else step)
    return {"compare": compare, "real": real, "pred": pred, "sm": sm, "plan": made["plan"],
            "inductor_estimates": inductor_decisions, "trace": trace}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("--plan", default="smallest", choices=["stock", "halfway", "smallest"])
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--every", action="store_true", help="the live-bytes difference at every truth step")
    args = p.parse_args(argv)
    run(args.name, args.plan, args.step, args.every)


if __name__ == "__main__":
    main()
