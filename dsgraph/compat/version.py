"""The torch versions dsgraph supports, and the check made at every compile."""

from __future__ import annotations

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
SUPPORTED = ((2, 11), (2, 14))


def check_version() -> None:
    if not (SUPPORTED[0] <= TORCH_VERSION <= SUPPORTED[1]):
        raise RuntimeError(
            f"dsgraph supports torch 2.11 to 2.14; this is torch {torch.__version__}"
        )
