"""Memory the CUDA BLAS libraries hold for a step's matrix products, outside any graph's plan.

torch gives each cuBLAS handle and stream a workspace from the caching allocator the first
time a GEMM runs there and keeps it for the life of the process (``cublas_handle_stream_to_
workspace`` in ATen's CublasHandlePool), beside a cuBLASLt workspace. Handles are per thread:
a training step runs its forward on the caller's thread and its backward on autograd's
device thread, so two of each exist once a step has run. They are in every peak the
allocator reports (``max_memory_allocated``) and in no graph's buffer plan.

Measured on the H200 (torch 2.11, ``benchmarks.alloc_replay``, session 8): at the GPU budget
test's peak, 32 MiB allocated under ``getCurrentCUDABlasHandle`` and 1 MiB under
``getCUDABlasLtWorkspace`` for each of the two threads, 66 MiB in all; every bf16 benchmark
measured 65 to 67 MiB over Inductor's own plans. The sizes follow torch's rules: the
``CUBLAS_WORKSPACE_CONFIG`` environment variable (``:SIZE_KiB:COUNT`` pairs) when set, else
32 MiB on compute capability 9.0 and later (``:4096:8``; earlier GPUs ``:4096:2:16:8``,
not measured here); ``CUBLASLT_WORKSPACE_SIZE`` in KiB, else 1 MiB.
"""

from __future__ import annotations

import os
import re

import torch
from torch.fx import GraphModule

_MiB = 1 << 20

# ops that run a cuBLAS GEMM on CUDA (dsgraph's chunked loss calls torch.mm inside)
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "_scaled_mm", "_int_mm", "linear",
          "linear_cross_entropy", "linear_cross_entropy_grads", "matmul", "addbmm", "dot", "vdot"}


def _is_gemm(target) -> bool:
    packet = getattr(target, "overloadpacket", target)  # aten.mm.default -> aten.mm
    return getattr(packet, "__name__", "") in _GEMMS


def _cuda_device(gm: GraphModule) -> torch.device | None:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return None


def cublas_workspace_bytes(device: torch.device, env: dict | None = None) -> int:
    """One cuBLAS handle's workspace on ``device`` (torch's rule, see the module docstring)."""
    env = os.environ if env is None else env
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":(\d+):(\d+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    # without a CUDA runtime (fake CUDA tensors in CPU tests) the H200's rule stands in
    major = torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 9
    return 32 * _MiB if major >= 9 else (4096 * 2 + 16 * 8) * 1024


def cublaslt_workspace_bytes(env: dict | None = None) -> int:
    env = os.environ if env is None else env
    size = env.get("CUBLASLT_WORKSPACE_SIZE")
    return int(size) * 1024 if size and size.isdigit() else _MiB


def blas_workspace_bytes(gm: GraphModule, threads: int = 2) -> int:
    """Bytes the BLAS libraries hold while ``gm``'s step runs: 0 unless it runs GEMMs on CUDA;
    else one cuBLAS and one cuBLASLt workspace per thread that runs them (``threads``: 2 for
    a training step, forward and backward; 1 for a graph without a backward)."""
    device = _cuda_device(gm)
    if device is None or not any(n.op == "call_function" and _is_gemm(n.target) for n in gm.graph.nodes):
        return 0
    return threads * (cublas_workspace_bytes(device) + cublaslt_workspace_bytes())
