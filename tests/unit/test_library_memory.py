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


def test_step_external_counts_the_workspaces_for_every_caller():
    # memory_profile and the benchmarks' predicted column both take the step's external
    # memory from here; the benchmarks once left the workspaces out and read ~66 MiB low
    from types import SimpleNamespace

    from dsgraph.memory import step_external

    def matmul(a, b):
        return (a @ b).relu()

    with FakeTensorMode():
        a = torch.empty(4, 4, device="cuda")
        gemm = make_fx(matmul)(a, a)
    per_thread = cublas_workspace_bytes(torch.device("cuda", 0)) + cublaslt_workspace_bytes()
    stage = SimpleNamespace(after=gemm)
    params = [("param:w", torch.zeros(8)), ("param:tied", torch.zeros(8))]
    params.append(("param:w_view", params[0][1][:4]))  # a view of a counted storage counts once
    training = SimpleNamespace(stages={"forward": stage, "backward": stage}, dynamo_inputs=[])
    external = step_external(training, params)
    assert [iv.nbytes for iv in external] == [32, 32, 2 * per_thread]
    assert external[-1].label == "CUDA BLAS workspaces"
    inference = SimpleNamespace(stages={"inference": stage}, dynamo_inputs=[])
    assert step_external(inference, params)[-1].nbytes == per_thread
    cpu = SimpleNamespace(stages={"forward": SimpleNamespace(after=make_fx(matmul)(torch.randn(4, 4), torch.randn(4, 4)))},
                          dynamo_inputs=[])
    assert [iv.nbytes for iv in step_external(cpu, params)] == [32, 32]
