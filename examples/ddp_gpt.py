"""Data-parallel training of a small GPT with dsgraph instead of DistributedDataParallel.

    torchrun --nproc_per_node 2 examples/ddp_gpt.py                  # NCCL on GPUs, gloo on CPU
    torchrun --nproc_per_node 2 examples/ddp_gpt.py --accumulate 2   # no_sync micro-batches
    torchrun --nproc_per_node 2 examples/ddp_gpt.py --compress bf16 --no-inductor

``dsgraph.replicate(model)`` broadcasts rank 0's parameters; ``data_parallel=True`` makes the
compiled backward average the gradients over the ranks itself, in buckets issued as soon as
their gradients exist and waited at the end of the backward. Every rank trains on its own
batches (different windows of the built-in text). At the end the script checks that the
replicas still hold identical parameters.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import dsgraph
from dsgraph.models import GPT, GPTConfig

from train_gpt import TEXT, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank and micro-batch")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (all but the last in no_sync)")
    parser.add_argument("--compress", default="none", choices=["none", "bf16"])
    parser.add_argument("--bucket-mb", type=float, default=None)
    parser.add_argument("--no-inductor", action="store_true", help="dsgraph option inductor=False")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    vocab = sorted(set(TEXT))
    data = torch.tensor([vocab.index(c) for c in TEXT])
    cfg = GPTConfig(vocab=len(vocab), seq=64, layers=4, heads=4, dim=128)
    torch.manual_seed(rank)  # replicas start different on purpose: replicate() broadcasts rank 0's
    model = dsgraph.replicate(GPT(cfg).to(device))
    options = {"data_parallel": True, "inductor": not args.no_inductor, "compress": args.compress}
    if args.bucket_mb is not None:
        options["bucket_mb"] = args.bucket_mb
    compiled = torch.compile(model, backend="dsgraph", options=options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))

    micro = batches(data, cfg.seq, args.batch, args.steps * args.accumulate, device, seed=1 + rank)
    start = time.perf_counter()
    for step in range(args.steps):
        for m in range(args.accumulate):
            x, y = next(micro)
            if m < args.accumulate - 1:
                with dsgraph.no_sync(model):  # local accumulation, no collectives
                    (compiled(x, y) / args.accumulate).backward()
            else:
                loss = compiled(x, y) / args.accumulate
                loss.backward()  # reduces everything accumulated since the last step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # the loss of this rank's last micro-batch, averaged over the ranks for printing
        shown = loss.detach() * args.accumulate
        dist.all_reduce(shown)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            extra = f"  (compile included: {time.perf_counter() - start:.1f} s)" if step == 0 else ""
            print(f"step {step:3d}  loss {shown.item() / world:.3f}{extra}", flush=True)

    flat = torch.cat([p.detach().flatten().float() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    same = all(torch.equal(copies[0], c) for c in copies)
    if rank == 0:
        print(f"\n{world} replicas, backend {dist.get_backend()}, torch {torch.__version__}: "
              f"parameters identical on every rank: {same}")
        print(dsgraph.report_table())
    dist.destroy_process_group()
    if not same:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
