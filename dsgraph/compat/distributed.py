"""torch.distributed: the functional collectives dsgraph puts into graphs, process-group facts.

``torch.ops._c10d_functional`` is the op namespace torch.compile traces collectives into
(``all_reduce_`` works in place and returns its input; ``wait_tensor`` blocks until the
collective that wrote a tensor is done). Inductor lowers both to its collective kernels.
Checked on torch 2.13 (CPU, gloo); the ops and their schemas are the same on 2.11.
"""

from __future__ import annotations

from typing import Any


def all_reduce_op() -> Any:
    """``_c10d_functional.all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)``."""
    import torch

    return torch.ops._c10d_functional.all_reduce_.default


def wait_tensor_op() -> Any:
    """``_c10d_functional.wait_tensor(Tensor tensor) -> Tensor``."""
    import torch

    return torch.ops._c10d_functional.wait_tensor.default


def group_name(group: Any) -> str:
    """The name the functional collectives address a process group by (the same on every rank
    of the group: c10d registers groups in creation order)."""
    return group.group_name
