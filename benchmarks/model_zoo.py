"""The model zoo (issue 16): each model's training step through Inductor and through
dsgraph's full pipeline, on one GPU.

    python -m benchmarks.model_zoo $OUT/zoo.json                      # H200: every model
    python -m benchmarks.model_zoo zoo.json --models gpt2_style,mlp   # some of them
    python -m benchmarks.model_zoo zoo.json --device cpu --models mlp # a smoke run (tiny sizes)

Models (tiny random-initialised configurations built from config objects: nothing is
downloaded; a model whose library is missing is skipped with the reason in the JSON):
``gpt2_style`` (dsgraph.models.GPT), ``mlp`` (dsgraph.models.MLP), from transformers a
decoder LM (``llama``: LlamaForCausalLM, ``gpt2_hf``: GPT2LMHeadModel), an encoder
(``bert``: BertModel), an encoder-decoder (``t5``: T5ForConditionalGeneration), from
torchvision a CNN (``resnet18``) and a vision transformer (``vit_b_16`` on 64x64 images).
Language models compute their loss outside the library's model (``labels=`` breaks
Dynamo's graph), as ``F.cross_entropy`` on the logits, so chunk_loss can find it.
The GPU machine's image has transformers and torchvision (device KINDS.md: transformers
5.17, torchvision 0.26); the CPU machines of CI have transformers but not torchvision.

The full pipeline: ``memory_budget`` at half of the stock step's predicted peak
(``dsgraph.memory_profile(..., pipeline="")``; raised to the smallest feasible budget when
half is below it), ``grad_pool=True``, ``lower_triton=True`` (chunk_loss is on with the
budget). Per model, in this order so each finishes quickly: Inductor compiled and timed,
the stock prediction (the same graphs: Inductor's FX cache serves them), dsgraph compiled
and timed; then the parity figure of dsgraph's first step: per gradient and the loss,
RMSE(dsgraph, fp64) / (2 * RMSE(eager, fp64) + tol), the worst over the tensors (the fp64
rule of ``dsgraph.testing`` holds when it is <= 1).

Step time: median over ``--repeats`` steps (CUDA events around forward + backward, after
``--warmup`` steps), gradients set to None before each step. Peak: the allocator's peak
during one step (``torch.cuda.max_memory_allocated`` after a reset), parameters and inputs
included, with what was allocated before the step and the step's blocks live at its peak
grouped by the Python frames that allocated them (``benchmarks.alloc_replay``: the
allocator's history is recorded around that one step; ``--history`` records it from the
start, which also names who allocated what a step finds allocated, and slows every
allocation of the compiles). On the CPU, times are wall-clock and peaks are not measured.
The JSON is rewritten after every model, so a run cut short keeps what it measured, and
each model's stages print their seconds as they finish (``stage_seconds``), so the log of
a run cut short says where its time went.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import dsgraph
from dsgraph.errors import BudgetError, find_cause
from dsgraph.testing import _compare, fp32_exact, run_step

from benchmarks import alloc_replay, measure


class LMLoss(nn.Module):
    """A library LM's logits into cross-entropy, outside the library's forward."""

    def __init__(self, model: nn.Module, encoder_decoder: bool = False):
        super().__init__()
        self.model = model
        self.encoder_decoder = encoder_decoder

    def forward(self, ids, targets, decoder_ids=None):
        if self.encoder_decoder:
            logits = self.model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        else:
            logits = self.model(input_ids=ids).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class HiddenLoss(nn.Module):
    """An encoder's last hidden state into a scalar: its projection on a fixed random
    direction, squared (the plain mean square of a layer norm's output is constant)."""

    def __init__(self, model: nn.Module, hidden: int):
        super().__init__()
        self.model = model
        self.register_buffer("probe", torch.randn(hidden, generator=torch.Generator().manual_seed(7)))

    def forward(self, ids, mask):
        # to the probe's dtype: fp32 under autocast, fp64 in the exact reference of the parity rule
        h = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.to(self.probe.dtype)
        return (h @ self.probe).square().mean()


class ImageLoss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images, labels):
        return F.cross_entropy(self.model(images), labels)


def _tokens(vocab: int, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _gpt2_style(tiny: bool):
    from dsgraph.models import GPT, GPTConfig, gpt_inputs

    cfg = GPTConfig(vocab=211, seq=16, layers=2, heads=2, dim=32) if tiny else \
        GPTConfig(vocab=8192, seq=256, layers=4, heads=8, dim=512)
    return GPT(cfg), gpt_inputs(cfg, 2 if tiny else 8)


def _mlp(tiny: bool):
    from dsgraph.models import MLP

    width, depth, batch = (64, 3, 16) if tiny else (2048, 6, 512)
    # inputs large enough that the mean square at the end, and so the gradients, are not
    # vanishingly small after the layers (each shrinks activations at this init)
    return MLP(width, depth), (8 * torch.randn(batch, width),)


def _llama(tiny: bool):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   attention_dropout=0.0)
    ids = _tokens(1024, 4, 128)
    return LMLoss(transformers.LlamaForCausalLM(cfg)), (ids, _tokens(1024, 4, 128, seed=1))


def _gpt2_hf(tiny: bool):
    import transformers

    cfg = transformers.GPT2Config(vocab_size=1024, n_positions=256, n_embd=256, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return LMLoss(transformers.GPT2LMHeadModel(cfg)), (_tokens(1024, 4, 128), _tokens(1024, 4, 128, seed=1))


def _bert(tiny: bool):
    import transformers

    cfg = transformers.BertConfig(vocab_size=1024, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=512, max_position_embeddings=256, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    ids = _tokens(1024, 4, 128)
    return HiddenLoss(transformers.BertModel(cfg), 256), (ids, torch.ones_like(ids))


def _t5(tiny: bool):
    import transformers

    cfg = transformers.T5Config(vocab_size=1024, d_model=256, d_kv=32, d_ff=512, num_layers=2, num_decoder_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    model = LMLoss(transformers.T5ForConditionalGeneration(cfg), encoder_decoder=True)
    return model, (_tokens(1024, 4, 64), _tokens(1024, 4, 32, seed=1), _tokens(1024, 4, 32, seed=2))


def _resnet18(tiny: bool):
    import torchvision

    g = torch.Generator().manual_seed(0)
    images = torch.randn(8, 3, 64, 64, generator=g)
    return ImageLoss(torchvision.models.resnet18(num_classes=10)), (images, _tokens(10, 8))


def _vit_b_16(tiny: bool):
    import torchvision

    g = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, 64, 64, generator=g)
    return ImageLoss(torchvision.models.vit_b_16(image_size=64, num_classes=10)), (images, _tokens(10, 4))


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    library: str | None  # the package it needs (importorskip), None for dsgraph's own
    build: Callable[[bool], tuple[nn.Module, tuple]]


ZOO = [
    Entry("gpt2_style", "decoder LM", None, _gpt2_style),
    Entry("mlp", "MLP", None, _mlp),
    Entry("llama", "decoder LM", "transformers", _llama),
    Entry("gpt2_hf", "decoder LM", "transformers", _gpt2_hf),
    Entry("bert", "encoder", "transformers", _bert),
    Entry("t5", "encoder-decoder", "transformers", _t5),
    Entry("resnet18", "CNN", "torchvision", _resnet18),
    Entry("vit_b_16", "vision transformer", "torchvision", _vit_b_16),
]
BY_NAME = {e.name: e for e in ZOO}


def build(entry: Entry, device: str, tiny: bool = False, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model, inputs = entry.build(tiny)
    return model.to(device), tuple(t.to(device) for t in inputs)


# a budget no plan reaches: the checkpoint pass then keeps the stock plan and reports its peak
_UNBOUNDED = 2**62


def stock_peak(model: nn.Module, inputs: tuple) -> int:
    """The stock step's predicted peak (the graphs Inductor compiles without dsgraph's passes).
    A model with graph breaks (T5 under some transformers versions) has no one step peak:
    then the largest of its pieces' stock peaks, as the checkpoint pass reports them (each
    piece is planned against the whole ``memory_budget``, README "Known limits")."""
    torch._dynamo.reset()
    try:
        return dsgraph.memory_profile(model, *inputs, pipeline="").peak_bytes
    except ValueError as e:
        if "graph break" not in str(e):
            raise
    probe = copy.deepcopy(model)
    dsgraph.clear_reports()
    torch._dynamo.reset()
    try:  # no loss kept: its autograd graph holds the probe's parameters past the collect below
        torch.compile(probe, backend="dsgraph", options={"memory_budget": _UNBOUNDED})(*inputs).backward()
    finally:
        del probe
        _collect()
    return max(r.memory["checkpoint_stock_peak"] for r in dsgraph.reports() if r.kind == "joint")


def full_options(model: nn.Module, inputs: tuple, stock: int | None = None) -> dict[str, Any]:
    """The full pipeline with a budget at half of the stock peak, or the smallest feasible
    budget when half is below it (found by compiling up to the planner: BudgetError)."""
    stock = stock_peak(model, inputs) if stock is None else stock
    options = {"memory_budget": stock // 2, "grad_pool": True, "lower_triton": True, "fallback": "error"}
    for _ in range(4):  # with graph breaks, each piece may raise the budget once
        probe = copy.deepcopy(model)
        torch._dynamo.reset()
        # Neither the loss nor the BudgetError is kept: the loss's autograd graph holds the
        # probe's parameters, and the error's traceback holds the compile's frames, whose
        # inputs are those parameters. Kept as locals, both probes outlived the collect
        # below and were still allocated (in the gradient pool too) when the measured
        # copy compiled.
        try:
            torch.compile(probe, backend="dsgraph", options=options)(*inputs).backward()
            return options
        except Exception as e:  # noqa: BLE001 - torch wraps the backend's error
            error = find_cause(e, BudgetError)
            if error is None:
                raise
            options["memory_budget"] = error.smallest_feasible
            del error
        finally:
            del probe
            _collect()
    raise RuntimeError(f"no budget found that every piece of the model meets: {options}")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(fn: Callable, model: nn.Module, inputs: tuple, device: str, warmup: int, repeats: int) -> dict:
    """Median step ms over ``repeats`` (gradients None before each) and the peak bytes of one step."""
    def step():
        for p in model.parameters():
            p.grad = None
        fn(*inputs).backward()

    for _ in range(warmup):
        step()
    times = measure.time_steps(step, repeats, device)
    out: dict[str, Any] = {"ms": statistics.median(times), "peak_bytes": None}
    if device.startswith("cuda"):
        out.update(_peak_of_one_step(step, model, inputs))
    return out


MAX_HISTORY = 4_000_000  # allocator events kept (a ring): far more than one zoo run makes
HISTORY_FROM_START = False  # main's --history: the allocator's history recorded from the start


def _collect() -> None:
    """Drop what earlier compiles left: Dynamo's caches hold compiled models until a reset,
    and compiled models sit in reference cycles that only the cycle collector frees (their
    parameters and gradient-pool slots would otherwise stay allocated into later models)."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def resident_bytes(model: nn.Module, inputs: tuple) -> int:
    """Bytes the step itself starts from: the model's parameters and buffers, the inputs,
    and its gradient pool (kept across steps), each storage once."""
    storages = {}
    tensors = list(model.parameters()) + list(model.buffers()) + [t for t in inputs if isinstance(t, torch.Tensor)]
    for t in tensors:
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
    pool = dsgraph.grad_pool(model)
    slots = 0
    if pool is not None:  # this model's slots (a process's pool also holds other live models')
        slots = sum(numel * pool.buffers[key].element_size() for key, _, numel in pool.slots.values())
    return sum(storages.values()) + slots


def _peak_of_one_step(step: Callable, model: nn.Module, inputs: tuple, top: int = 6) -> dict[str, Any]:
    """The allocator's peak over one step, what was allocated before it, and the step's own
    blocks live at its peak grouped by the Python frames that allocated them (from the
    allocator's history): what makes a peak differ from its plan.

    ``peak_bytes`` is the step's peak over what it starts from (``resident_bytes``: the
    model, its inputs, its gradient pool): the step as it would peak alone in a process.
    The allocator's own figure, which also counts whatever else this process holds (the
    benchmark's other copies of the model, earlier models' leftovers), is
    ``process_peak_bytes``; ``other_before_bytes`` is that difference, and ``before_frames``
    who allocated it (where the allocator's history saw the allocation)."""
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    resident = resident_bytes(model, inputs)
    recorded = HISTORY_FROM_START
    if not recorded:
        torch.cuda.memory._record_memory_history(max_entries=MAX_HISTORY)
    first = torch.cuda.memory._snapshot()
    held = _live_blocks_by_frame(first, top)
    seen = len(first["device_traces"][0]) if first.get("device_traces") else 0
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    if not recorded:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    replayed, blocks = alloc_replay.replay(snapshot["device_traces"][0][seen:], before)
    return {"peak_bytes": peak - before + resident, "process_peak_bytes": peak, "allocated_before_bytes": before,
            "resident_bytes": resident, "other_before_bytes": before - resident, "before_frames": held,
            "replayed_peak_bytes": replayed,
            "at_peak": [[size, where] for size, where in alloc_replay.group(blocks)[:top]]}


def _live_blocks_by_frame(snapshot: dict, top: int) -> list:
    """Allocated blocks of a snapshot grouped by allocating frames (frames exist for blocks
    allocated while the history was recorded: ``main`` records from the start)."""
    blocks = {}
    for seg in snapshot.get("segments", []):
        for k, b in enumerate(seg.get("blocks", [])):
            if b.get("state") == "active_allocated":
                blocks[(seg.get("address", 0), k)] = b
    return [[size, where] for size, where in alloc_replay.group(blocks)[:top]]


def parity(model: nn.Module, compiled: Callable, inputs: tuple, tol: float = 1e-3) -> dict:
    """The fp64 rule on one step of ``compiled`` (``model``'s compiled form), from the same
    parameters as an eager copy and a float64 copy: the worst RMSE(g, fp64) / (2 * RMSE(eager,
    fp64) + tol) over the loss and the gradients, and the tensors failing the rule."""
    eager = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    with fp32_exact():
        ref_loss, ref_grads = run_step(eager, eager, inputs, 0)
        got_loss, got_grads = run_step(compiled, model, inputs, 0)
        x64 = tuple(t.double() if t.is_floating_point() else t for t in inputs)
        exact_loss, exact_grads = run_step(exact, exact, x64, 0)
    rows = [_compare("loss", got_loss, ref_loss, "fp64", 1e-5, exact_loss, tol)]
    rows += [_compare(n, got_grads.get(n), ref_grads[n], "fp64", 1e-5, exact_grads.get(n), tol) for n in ref_grads]
    ratios = [r.rmse / (2 * r.ref_rmse + tol) for r in rows if r.rmse is not None]
    return {"parity_worst_ratio": max(ratios) if ratios else None,
            "parity_failed": [r.name for r in rows if not r.ok], "parity_tensors": len(rows)}


def run_model(entry: Entry, device: str, tiny: bool, warmup: int, repeats: int) -> dict:
    start = time.perf_counter()
    stages: dict[str, float] = {}
    last = [start]

    def done(stage: str) -> None:
        now = time.perf_counter()
        stages[stage] = round(now - last[0], 2)
        last[0] = now
        print(f"{entry.name}: {stage} {stages[stage]} s", flush=True)

    model, inputs = build(entry, device, tiny)
    out: dict[str, Any] = {"model": entry.name, "family": entry.family,
                           "parameters": sum(p.numel() for p in model.parameters()), "stage_seconds": stages}
    torch._dynamo.reset()
    inductor = torch.compile(copy.deepcopy(model), backend="inductor")
    out["inductor"] = time_steps(inductor, inductor._orig_mod, inputs, device, warmup, repeats)
    del inductor
    _collect()
    done("inductor compiled and timed")
    stock = stock_peak(model, inputs)
    done("stock peak predicted")
    options = full_options(model, inputs, stock)
    done("budget found")
    out["stock_predicted_peak_bytes"] = stock
    out["options"] = options
    dsgraph.clear_reports()
    torch._dynamo.reset()
    mine = copy.deepcopy(model)
    compiled = torch.compile(mine, backend="dsgraph", options=options)
    out.update(parity(mine, compiled, inputs))
    done("dsgraph compiled, parity")
    out["pipeline"] = {r.kind: r.pipeline for r in dsgraph.reports()}
    out["passes_changed"] = sorted({p.name for r in dsgraph.reports() for p in r.passes if p.changed})
    out["fallbacks"] = [r.fallback for r in dsgraph.reports() if r.fallback]
    out["plans"] = {r.kind: {k: v for k, v in r.memory.items() if "peak" in k} for r in dsgraph.reports()}
    out["pass_ms"] = [{"kind": r.kind, "compile_s": round(r.compile_seconds, 2),
                       **{p.name: round(p.ms, 1) for p in r.passes}} for r in dsgraph.reports()]
    out["dsgraph"] = time_steps(compiled, mine, inputs, device, warmup, repeats)
    done("dsgraph timed")
    out["speedup_vs_inductor"] = out["inductor"]["ms"] / out["dsgraph"]["ms"]
    if out["inductor"]["peak_bytes"]:
        out["peak_ratio_vs_inductor"] = out["dsgraph"]["peak_bytes"] / out["inductor"]["peak_bytes"]
    out["seconds"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="where to write the results (rewritten after every model)")
    parser.add_argument("--models", default=",".join(BY_NAME), help=f"comma-separated, of {', '.join(BY_NAME)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--history", action="store_true",
                        help="record the CUDA allocator's history from the start (who allocated what a step finds "
                             "allocated; slows every allocation)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(BY_NAME)}")
    tiny = not args.device.startswith("cuda")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if not tiny else "cpu",
                              "torch": torch.__version__, "dsgraph": dsgraph.__version__, "tiny": tiny,
                              "command": " ".join(sys.argv), "models": []}
    begun = time.perf_counter()
    if args.device.startswith("cuda") and args.history:
        # the allocator's history from the start, so that what a step finds allocated
        # before it can be traced to the frames that allocated it
        torch.cuda.memory._record_memory_history(max_entries=MAX_HISTORY)
        global HISTORY_FROM_START
        HISTORY_FROM_START = True
    for name in names:
        entry = BY_NAME[name]
        try:
            if entry.library is not None:
                __import__(entry.library)
        except ImportError as e:
            result["models"].append({"model": name, "skipped": f"{entry.library} is not installed ({e})"})
        else:
            try:
                result["models"].append(run_model(entry, args.device, tiny, args.warmup, args.repeats))
            except Exception as e:  # noqa: BLE001 - one model's failure is recorded, the rest still run
                result["models"].append({"model": name, "error": f"{type(e).__name__}: {e}"[:2000],
                                         "traceback": traceback.format_exc()[-4000:]})
        _collect()  # nothing of this model stays allocated into the next
        result["seconds"] = time.perf_counter() - begun
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["models"][-1])[:400], flush=True)
    return 0 if all("error" not in m for m in result["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
