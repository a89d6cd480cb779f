"""analysis.library_memory: the CUDA BLAS workspaces a step's GEMMs leave allocated."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensorMode

from dsgraph.analysis.library_memory import blas_workspace_bytes, cublas_workspace_bytes, cublaslt_workspace_bytes

MiB = 1 << 20


def test_sizes_follow_torchs_environment_rules():
    cuda = torch.device("cuda", 0)
    assert cublas_workspace_bytes(cuda, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == 32 * MiB
    assert cublas_workspace_bytes(cuda, {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}) == (8192 + 128) * 1024
    assert cublaslt_workspace_bytes({}) == MiB and cublaslt_workspace_bytes({"CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * MiB


def test_only_cuda_graphs_with_gemms_count():
    def matmul(a, b):
        return (a @ b).relu()

    def pointwise(a, b):
        return a + b

    cpu = make_fx(matmul)(torch.randn(4, 4), torch.randn(4, 4))
    assert blas_workspace_bytes(cpu) == 0  # cuBLAS is CUDA's
    with FakeTensorMode():
        a = torch.empty(4, 4, device="cuda")
        b = torch.empty(4, 4, device="cuda")
        gemm = make_fx(matmul)(a, b)
        plain = make_fx(pointwise)(a, b)
    per_thread = cublas_workspace_bytes(torch.device("cuda", 0)) + cublaslt_workspace_bytes()
    assert blas_workspace_bytes(gemm) == 2 * per_thread and blas_workspace_bytes(gemm, threads=1) == per_thread
    assert blas_workspace_bytes(plain) == 0
