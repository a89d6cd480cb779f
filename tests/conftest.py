"""Shared test setup: GPU tests skip without CUDA; every test starts from fresh Dynamo
caches, empty dsgraph reports and no DSGRAPH_* variables from the caller's shell."""

import os

# deterministic cuBLAS for the GPU tests that compare bitwise (set before CUDA starts)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

import dsgraph


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    for key in list(os.environ):
        if key.startswith("DSGRAPH_"):
            monkeypatch.delenv(key)
    torch._dynamo.reset()
    dsgraph.clear_reports()
    yield
    torch._dynamo.reset()
