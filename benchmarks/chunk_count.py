"""The chunked loss op's time against its chunk count, alone on one device.

    python -m benchmarks.chunk_count --shapes 16384x768,8192x1024 --vocab 50304 --counts 1,2,3,5,9 --json F
    python -m benchmarks.chunk_count --device cpu --shapes 64x16 --vocab 97 --counts 1,2 --reps 2 --json F

What ``workspace_fit`` trades: fewer, larger chunks for workspace. Each (tokens x dim, count)
calls ``dsgraph::linear_cross_entropy_grads`` as the chunk_loss pass does under bf16 autocast
(fp32 rows and weight, bf16 GEMMs, fp32 loss, the gradients of the rows and the weight, no
bias), balanced chunks of ``ceil(tokens / count)``; median of ``--reps`` timed calls after
3 untimed ones (CUDA events on a GPU), with the op's workspace by its own count.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from benchmarks.measure import time_steps


def _timed(fn, reps: int, device: str) -> list[float]:
    for _ in range(3):  # untimed: first-call work (GEMM heuristics, Triton's compile)
        fn()
    return time_steps(fn, reps, device)


def measure(tokens: int, dim: int, vocab: int, counts: list[int], reps: int, device: str) -> list[dict]:
    from dsgraph.runtime.linear_cross_entropy import GRADS_OP, workspace_bytes, use_triton, fp32_out_gemm

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, dim, generator=g).to(device)
    w = (torch.randn(vocab, dim, generator=g) * dim ** -0.5).to(device)
    t = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    rows = []
    for count in counts:
        chunk = math.ceil(tokens / count)

        def call():
            return GRADS_OP(x, w, None, t, -100, "mean", 0.0, torch.bfloat16, torch.float32, chunk, True, True, False)

        ms = _timed(call, reps, device)
        ws = workspace_bytes(tokens, dim, vocab, x_dtype=x.dtype, w_dtype=w.dtype, mm_dtype=torch.bfloat16,
                             loss_dtype=torch.float32, has_bias=False, chunk_tokens=chunk, grads=True,
                             triton=use_triton(x.device), fp32_gemm=fp32_out_gemm(x.device.type), want_b=False)
        rows.append({"tokens": tokens, "dim": dim, "vocab": vocab, "chunks": math.ceil(tokens / chunk),
                     "chunk_tokens": chunk, "ms": statistics.median(ms), "ms_all": ms, "workspace_bytes": ws})
        print(f"{tokens}x{dim} V={vocab} chunks {rows[-1]['chunks']:3d} ({chunk} tokens): "
              f"{rows[-1]['ms']:.3f} ms ({min(ms):.3f}-{max(ms):.3f}), workspace {ws} B", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="16384x768,8192x1024", help="tokens x dim, comma-separated")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--counts", default="1,2,3,4,5,6,9")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default=None)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    counts = [int(c) for c in args.counts.split(",")]
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "command": "python -m benchmarks.chunk_count " + " ".join(argv or []), "rows": []}
    for shape in args.shapes.split(","):
        tokens, dim = (int(v) for v in shape.split("x"))
        out["rows"] += measure(tokens, dim, args.vocab, counts, args.reps, device)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
