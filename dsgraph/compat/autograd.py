"""Autograd internals the gradient pool needs: a parameter's hook dicts and the engine's
end-of-backward callback. Checked on torch 2.11 (GPU) and 2.13 (CPU)."""

from __future__ import annotations

from typing import Callable

import torch

HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def tensor_hooks(param: torch.Tensor) -> list[Callable]:
    """``param.register_hook`` hooks, in registration order."""
    hooks = getattr(param, "_backward_hooks", None)
    return list(hooks.values()) if hooks else []


def post_accumulate_hooks(param: torch.Tensor) -> list[Callable]:
    """``param.register_post_accumulate_grad_hook`` hooks, in registration order."""
    hooks = getattr(param, "_post_accumulate_grad_hooks", None)
    return list(hooks.values()) if hooks else []


def hook_dicts(param: torch.Tensor) -> list[dict]:
    """The dicts autograd reads a parameter's hooks from (non-empty ones only)."""
    return [d for attr in HOOK_DICTS if (d := getattr(param, attr, None))]


def at_backward_end(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the running backward finishes (autograd's engine callback). The
    engine runs it only when the backward completes: not when a node raises."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def graph_task_id() -> int | None:
    """Which backward (autograd graph task) the calling code runs in: -1 outside any; None
    where torch does not say."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return None if current is None else current()
