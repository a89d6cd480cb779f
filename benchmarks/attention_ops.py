"""Which fused attention ops a workload's joint graph holds, with their tensors' shapes and
strides and whether a workspace rule counts their scratch (``analysis.attention_workspace``):
SDPA picks its kernel on the device the graph is traced for, so this tells which backward's
scratch a GPU step really holds.

    python -m benchmarks.attention_ops --workload llama [--device cuda] [--size full]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from benchmarks import workloads
from dsgraph.analysis.cost_model import is_attention
from dsgraph.analysis.workspace import workspace_bytes
from dsgraph.recompute import truth


def attention_ops(workload: str, device: str, size: str) -> list[str]:
    model, inputs = workloads.build(workload, device, size)
    j = truth.capture_joint(model, inputs, torch.bfloat16 if device == "cuda" else None)
    seen: Counter = Counter()
    lines = []
    for n in j.gm.graph.nodes:
        if not is_attention(n):
            continue
        vals = [a.meta.get("val") for a in n.args if isinstance(a, torch.fx.Node)]
        shapes = " ".join(f"{tuple(v.shape)}/{tuple(v.stride())}/{v.dtype}".replace("torch.", "")
                          for v in vals[:5] if isinstance(v, torch.Tensor))
        line = f"{n.target}: {shapes}; kwargs {dict(n.kwargs)}; workspace {workspace_bytes(n)} B"
        if not seen[line]:
            lines.append(line)
        seen[line] += 1
    return [f"{seen[line]} x {line}" for line in lines]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="full")
    args = p.parse_args(argv)
    for line in attention_ops(args.workload, args.device, args.size):
        print(line)


if __name__ == "__main__":
    main()
