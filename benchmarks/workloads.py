"""The benchmark's models and their inputs, by name.

Each workload builds an fp32 model on a device and the inputs of one step; the step's loss
is ``model(*inputs)`` (models return their loss) or ``loss_of`` of the output. ``small``
variants of the same architecture serve the fp32 gradient-parity check, and ``tiny`` ones
the CPU smoke test of the harness itself.
"""

from __future__ import annotations

import functools

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from dsgraph.models import GPT, MLP, GPTConfig, gpt_inputs


@dataclass
class Workload:
    name: str
    build: Callable[[str, str], tuple[torch.nn.Module, tuple]]  # (device, size) -> model, inputs
    description: str


def _gpt(device: str, size: str, checkpoint_blocks: bool = False):
    cfg = {
        "full": GPTConfig.gpt2_small(),
        "small": GPTConfig(vocab=512, seq=128, layers=2, heads=4, dim=128),
        "tiny": GPTConfig(vocab=97, seq=16, layers=2, heads=2, dim=32),
    }[size]
    batch = {"full": 16, "small": 2, "tiny": 2}[size]
    cfg = dataclasses.replace(cfg, checkpoint_blocks=checkpoint_blocks)
    return GPT(cfg).to(device), gpt_inputs(cfg, batch, device)


def _gpt_hand_checkpointed(device: str, size: str):
    return _gpt(device, size, checkpoint_blocks=True)


def _mlp(device: str, size: str):
    width, depth, batch = {"full": (4096, 8, 8192), "small": (256, 4, 64), "tiny": (32, 3, 8)}[size]
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(0)).to(device)
    return MLP(width, depth).to(device), (x,)


class _HFLoss(torch.nn.Module):
    """Wraps a transformers causal LM so that forward(input_ids, labels) returns the
    next-token loss. The loss is computed here rather than by ``labels=``: transformers'
    own loss path logs a warning inside the model, which breaks the Dynamo graph."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels):
        logits = self.lm(input_ids=input_ids, use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


def _hf_gpt2(device: str, size: str, gradient_checkpointing: bool = False):
    import transformers

    layers, dim, heads, seq, batch = {"full": (12, 768, 12, 1024, 8), "small": (2, 128, 4, 64, 2),
                                      "tiny": (2, 32, 2, 16, 2)}[size]
    config = transformers.GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, n_positions=seq,
                                     vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(config)
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = _HFLoss(lm).to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g).to(device)
    return model, (ids, ids.clone())


def _hf_gpt2_checkpointed(device: str, size: str):
    return _hf_gpt2(device, size, gradient_checkpointing=True)


class _ClassifierLoss(torch.nn.Module):
    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, images, labels):
        return F.cross_entropy(self.net(images).float(), labels)


def _resnet50(device: str, size: str, full_batch: int = 64):
    import torchvision

    batch, res = {"full": (full_batch, 224), "small": (2, 64), "tiny": (2, 32)}[size]
    torch.manual_seed(0)
    model = _ClassifierLoss(torchvision.models.resnet50(weights=None)).to(device)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, res, res, generator=g).to(device)
    labels = torch.randint(0, 1000, (batch,), generator=g).to(device)
    return model, (images, labels)


def _zoo(name: str, per_block: bool = False):
    """A model of the checkpoint planner's test zoo (tests/zoo.py) at its H200 size
    ("full") or its CPU size ("small", "tiny"); ``per_block``: its hand-written
    checkpointing (torch.utils.checkpoint per block, or transformers' own)."""

    def build(device: str, size: str):
        from tests import zoo

        model, inputs = zoo.build(name, "h200" if size == "full" else "cpu", per_block=per_block)
        return model.to(device), tuple(x.to(device) for x in inputs)

    return build


WORKLOADS: dict[str, Workload] = {
    "gpt2": Workload("gpt2", _gpt, "GPT-2-small style decoder: 12 x 768, SDPA, vocab 50304, batch 16 x 1024"),
    "gpt2_ckpt": Workload("gpt2_ckpt", _gpt_hand_checkpointed,
                          "gpt2 with torch.utils.checkpoint around each block (hand-written checkpointing)"),
    "mlp": Workload("mlp", _mlp, "8 x (Linear(4096, 4096) + GELU), batch 8192"),
    "hf_gpt2": Workload("hf_gpt2", _hf_gpt2, "transformers GPT2LMHeadModel 12 x 768 (sdpa), batch 8 x 1024"),
    "hf_gpt2_gc": Workload("hf_gpt2_gc", _hf_gpt2_checkpointed,
                           "hf_gpt2 with the model's gradient_checkpointing_enable() (non-reentrant)"),
    "resnet50": Workload("resnet50", _resnet50, "torchvision resnet50, batch 64 x 3 x 224 x 224"),
    "resnet50_b128": Workload("resnet50_b128", functools.partial(_resnet50, full_batch=128), "torchvision resnet50, batch 128 x 3 x 224 x 224"),
    "gpt24": Workload("gpt24", _zoo("gpt24"), "dsgraph's GPT, 24 x 1024, vocab 50304, batch 8 x 1024 (zoo)"),
    "gpt24_ckpt": Workload("gpt24_ckpt", _zoo("gpt24", per_block=True),
                           "gpt24 with torch.utils.checkpoint around each block"),
    "llama": Workload("llama", _zoo("llama"),
                      "transformers LlamaForCausalLM 16 x 2048 (GQA 16/4, sdpa), batch 4 x 2048 (zoo)"),
    "llama_gc": Workload("llama_gc", _zoo("llama", per_block=True), "llama with transformers' own gradient checkpointing"),
    "vit": Workload("vit", _zoo("vit"), "vision transformer 12 x 768 (ViT-B/16), dropout 0.1, batch 128 x 3 x 224 x 224 (zoo)"),
    "vit_ckpt": Workload("vit_ckpt", _zoo("vit", per_block=True), "vit with torch.utils.checkpoint around each block"),
}


def available(name: str) -> bool:
    """transformers and torchvision workloads run only where those packages are installed."""
    module = {"hf_gpt2": "transformers", "hf_gpt2_gc": "transformers", "resnet50": "torchvision",
              "resnet50_b128": "torchvision", "llama": "transformers", "llama_gc": "transformers"}.get(name)
    if module is None:
        return True
    try:
        __import__(module)
        return True
    except Exception:
        return False


def describe(name: str) -> str:
    return WORKLOADS[name].description


def build(name: str, device: str, size: str = "full") -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return WORKLOADS[name].build(device, size)
