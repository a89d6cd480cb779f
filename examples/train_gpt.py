"""Train a small GPT with backend="dsgraph" and print dsgraph's per-pass report.

    python examples/train_gpt.py                 # CPU or the first CUDA GPU; dumps to ./dsgraph_dump
    python examples/train_gpt.py --steps 60 --dump /tmp/dsgraph_dump --budget 2MiB
    python examples/train_gpt.py --no-inductor   # run dsgraph's graphs as FX code
    python examples/train_gpt.py --quiet         # no dsgraph progress lines

The model learns to continue a short built-in text character by character, so the loss
falls from about 3.4 to under 2 in 60 steps. Each step uses a different random batch of windows.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import time

import torch

import dsgraph
from dsgraph.models import GPT, GPTConfig

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such "
    "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
    "minds of the surrounding families, that he is considered the rightful property of some "
    "one or other of their daughters. "
) * 4


def batches(data: torch.Tensor, seq: int, batch: int, steps: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        window = torch.stack([data[s : s + seq + 1] for s in starts.tolist()])
        yield window[:, :-1].to(device), window[:, 1:].to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-inductor", action="store_true", help="dsgraph option inductor=False")
    parser.add_argument("--dump", default="dsgraph_dump", help="dsgraph option dump_dir: per-pass graph dumps "
                        "(default ./dsgraph_dump; '' for none)")
    parser.add_argument("--budget", default=None, help="dsgraph option memory_budget, e.g. 2MiB")
    parser.add_argument("--quiet", action="store_true", help="do not print dsgraph's progress (DSGRAPH_LOG=info)")
    args = parser.parse_args()
    if not args.quiet:
        dsgraph.enable_logging(logging.INFO)  # what DSGRAPH_LOG=info does

    torch.manual_seed(0)
    device = torch.device(args.device)
    vocab = sorted(set(TEXT))
    data = torch.tensor([vocab.index(c) for c in TEXT])
    cfg = GPTConfig(vocab=len(vocab), seq=64, layers=4, heads=4, dim=128)
    model = GPT(cfg).to(device)
    options = {"inductor": not args.no_inductor}
    if args.dump:
        options["dump_dir"] = args.dump
    if args.budget:
        options["memory_budget"] = args.budget
    compiled = torch.compile(model, backend="dsgraph", options=options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))

    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(data, cfg.seq, args.batch, args.steps, device)):
        loss = compiled(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            print(f"step   0  loss {loss.item():.3f}  (first step, compile included: {time.perf_counter() - start:.1f} s)")
        elif step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    print()
    print(f"dsgraph {dsgraph.__version__}, torch {torch.__version__}, device {device}")
    print(dsgraph.report_table())
    if args.dump:
        plots = sorted(glob.glob(os.path.join(args.dump, "*_step_memory_plot.png")))
        print(f"\ndumps in {os.path.abspath(args.dump)} (index.md, one folder per graph)")
        for png in plots:
            print(f"step memory plot: {os.path.abspath(png)}")
        print(f"redraw plots and print the pass table: dsgraph report {args.dump}")


if __name__ == "__main__":
    main()
