"""The checkpoint planner's model zoo: models of different shapes, each returning its loss.

Each entry builds ``(model, inputs)`` at a size (``"cpu"``: small, for the tests;
``"h200"``: the benchmark's) and, with ``per_block=True``, the same model with hand-written
per-block checkpointing (``torch.utils.checkpoint`` around each block, or transformers'
``gradient_checkpointing_enable()``): what people do by hand, the floor the planner must
reach. Sizes are odd on purpose; the activations dominate the parameters at the CPU size,
so a peak is about what the planner decides.

- ``gated``: a residual network of gated layers, ``x + W3(sigmoid(W1 x) * W2 x)``: the
  gradient stream reaches the matmuls only through pointwise ops;
- ``llama``: a transformers Llama decoder (RMSNorm, rotary embeddings, SwiGLU, grouped
  attention), loss computed outside the model (FACTS.md: ``labels=`` can break the graph);
- ``gpt24``: dsgraph's GPT reference model with 24 layers at a tiny width;
- ``cnn``: a residual CNN with BatchNorm (running statistics: buffers the forward mutates)
  and a cross-entropy loss on labels that live through the whole step;
- ``resnet50``: torchvision's ResNet-50 structure (bottlenecks, max pooling) in pure
  torch, at a small base width on CPU;
- ``masked``: a residual MLP whose every layer and the loss read a mask derived from the
  input (a long-lived input-only value that crosses every cut).
- ``vit``: a vision transformer with dropout (random values: under Inductor the backward
  draws the masks again from their seeds, as per-block checkpointing does) whose first
  block, after the patch embedding, has more cuts inside it than one DP option spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


def _maybe_checkpoint(block: nn.Module, per_block: bool, *args):
    if per_block and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
    return block(*args)


# -- gated residual network -------------------------------------------------------------

class GatedLayer(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.sigmoid(self.gate(x)) * self.up(x))


class GatedNet(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int, per_block: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(GatedLayer(dim, hidden) for _ in range(layers))
        self.per_block = per_block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = _maybe_checkpoint(layer, self.per_block, x)
        return x.square().mean()


# -- transformers Llama ----------------------------------------------------------------------

class LlamaLoss(nn.Module):
    """Next-token loss of a transformers causal LM, computed outside the model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _llama(vocab: int, dim: int, hidden: int, layers: int, heads: int, kv_heads: int, seq: int,
           per_block: bool) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                         attn_implementation="sdpa", use_cache=False)
    model = LlamaForCausalLM(config)
    if per_block:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24 renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return LlamaLoss(model)


# -- CNN with BatchNorm ----------------------------------------------------------------------

class ConvBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ConvNet(nn.Module):
    def __init__(self, channels: int, blocks: int, classes: int, per_block: bool = False):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.blocks = nn.ModuleList(ConvBlock(channels) for _ in range(blocks))
        self.head = nn.Linear(channels, classes)
        self.per_block = per_block

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(images)))
        for block in self.blocks:
            x = _maybe_checkpoint(block, self.per_block, x)
        logits = self.head(x.mean(dim=(2, 3)))
        return F.cross_entropy(logits, labels)


# -- residual MLP with an input-derived mask -------------------------------------------------

class MaskedLayer(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x)))) * mask


class MaskedNet(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, layers: int, per_block: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(MaskedLayer(dim, hidden) for _ in range(layers))
        self.out = nn.Linear(dim, 1)
        self.per_block = per_block

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != 0).unsqueeze(-1).to(torch.float32)  # padding (id 0) is masked out
        x = self.embed(ids)
        for layer in self.layers:
            x = _maybe_checkpoint(layer, self.per_block, x, mask)
        return (self.out(x).squeeze(-1) * mask.squeeze(-1)).sum() / mask.sum()


# -- ResNet-50 (bottleneck blocks) -----------------------------------------------------------

class Bottleneck(nn.Module):
    """torchvision's bottleneck: 1x1 reduce, 3x3 (strided), 1x1 expand (x4), BatchNorm after
    each, a projected shortcut where the shape changes."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """torchvision's resnet50 in pure torch (7x7 stem, max pooling, stages of 3, 4, 6 and 3
    bottlenecks) at a chosen base width, with the cross-entropy loss: run under bf16
    autocast it is the benchmark's ResNet-50, whose weights reach each convolution through a
    cast (``JointGraph``'s input-only rule once counted the whole network free)."""

    def __init__(self, width: int, classes: int, per_block: bool = False, stages=(3, 4, 6, 3)):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width)
        blocks, cin = [], width
        for i, count in enumerate(stages):
            for b in range(count):
                blocks.append(Bottleneck(cin, width * 2 ** i, 2 if (b == 0 and i > 0) else 1))
                cin = 4 * width * 2 ** i
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)
        self.per_block = per_block

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(images))), 3, 2, 1)
        for block in self.blocks:
            x = _maybe_checkpoint(block, self.per_block, x)
        return F.cross_entropy(self.fc(x.mean((2, 3))), labels)


# -- vision transformer with dropout --------------------------------------------------------

class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads, self.drop = heads, nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(attended))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class ViT(nn.Module):
    """A vision transformer: patch embedding (a strided convolution), a class token and
    learned positions, pre-norm blocks with dropout, the class token's head."""

    def __init__(self, dim: int, heads: int, layers: int, patch: int, image: int, classes: int, dropout: float,
                 per_block: bool = False):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(dim, heads, dropout) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)
        self.per_block = per_block

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for block in self.blocks:
            x = _maybe_checkpoint(block, self.per_block, x)
        return F.cross_entropy(self.head(self.norm(x[:, 0])), labels)


# -- the zoo ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[str, bool], nn.Module]  # (size, per_block) -> model
    inputs: Callable[[str, int], tuple]  # (size, seed) -> inputs
    needs: str = ""  # an optional package the entry needs


SIZES = {
    "gated": {"cpu": dict(dim=48, hidden=83, layers=12, batch=509), "h200": dict(dim=2048, hidden=5632, layers=16, batch=16384)},
    "llama": {"cpu": dict(vocab=301, dim=64, hidden=171, layers=4, heads=4, kv_heads=2, seq=67, batch=5),
              "h200": dict(vocab=32000, dim=2048, hidden=5632, layers=16, heads=16, kv_heads=4, seq=2048, batch=4)},
    "gpt24": {"cpu": dict(vocab=211, seq=64, layers=24, heads=2, dim=32, batch=7),
              "h200": dict(vocab=50304, seq=1024, layers=24, heads=16, dim=1024, batch=8)},
    "cnn": {"cpu": dict(channels=12, blocks=4, classes=10, image=23, batch=13),
            "h200": dict(channels=128, blocks=8, classes=1000, image=112, batch=128)},
    "resnet50": {"cpu": dict(width=8, classes=10, image=64, batch=4),
                 "h200": dict(width=64, classes=1000, image=224, batch=128)},
    "vit": {"cpu": dict(dim=32, heads=2, layers=6, patch=4, image=32, classes=10, dropout=0.1, batch=6),
            "h200": dict(dim=768, heads=12, layers=12, patch=16, image=224, classes=1000, dropout=0.1, batch=128)},
    "masked": {"cpu": dict(vocab=97, dim=40, hidden=123, layers=8, seq=53, batch=11),
               "h200": dict(vocab=32000, dim=2048, hidden=8192, layers=16, seq=2048, batch=8)},
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gpt(size: str, per_block: bool) -> nn.Module:
    from dsgraph.models import GPT, GPTConfig

    s = SIZES["gpt24"][size]
    return GPT(GPTConfig(vocab=s["vocab"], seq=s["seq"], layers=s["layers"], heads=s["heads"], dim=s["dim"],
                         checkpoint_blocks=per_block))


def _gpt_inputs(size: str, seed: int):
    s = SIZES["gpt24"][size]
    g = _gen(seed)
    return (torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g),
            torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g))


def _llama_inputs(size: str, seed: int):
    s = SIZES["llama"][size]
    g = _gen(seed)
    return (torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g),
            torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g))


def _masked_inputs(size: str, seed: int):
    s = SIZES["masked"][size]
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=_gen(seed))
    ids[:, -(s["seq"] // 5):] = 0  # a padded tail, as batches of unequal sequences have
    return (ids,)


def _image_inputs(name: str, size: str, seed: int):
    s = SIZES[name][size]
    g = _gen(seed)
    return (torch.randn(s["batch"], 3, s["image"], s["image"], generator=g),
            torch.randint(0, s["classes"], (s["batch"],), generator=g))


def _vit(size: str, per_block: bool) -> nn.Module:
    return ViT(**{k: v for k, v in SIZES["vit"][size].items() if k != "batch"}, per_block=per_block)


ZOO: dict[str, Entry] = {
    "gated": Entry("gated", lambda size, pb: GatedNet(*(SIZES["gated"][size][k] for k in ("dim", "hidden", "layers")),
                                                     per_block=pb),
                   lambda size, seed: (torch.randn(SIZES["gated"][size]["batch"], SIZES["gated"][size]["dim"],
                                                   generator=_gen(seed)),)),
    "llama": Entry("llama", lambda size, pb: _llama(**{k: v for k, v in SIZES["llama"][size].items() if k != "batch"},
                                                    per_block=pb),
                   _llama_inputs, needs="transformers"),
    "gpt24": Entry("gpt24", _gpt, _gpt_inputs),
    "cnn": Entry("cnn", lambda size, pb: ConvNet(*(SIZES["cnn"][size][k] for k in ("channels", "blocks", "classes")),
                                                 per_block=pb),
                 lambda size, seed: _image_inputs("cnn", size, seed)),
    "resnet50": Entry("resnet50", lambda size, pb: ResNet50(SIZES["resnet50"][size]["width"],
                                                            SIZES["resnet50"][size]["classes"], per_block=pb),
                      lambda size, seed: _image_inputs("resnet50", size, seed)),
    "vit": Entry("vit", _vit, lambda size, seed: _image_inputs("vit", size, seed)),
    "masked": Entry("masked", lambda size, pb: MaskedNet(*(SIZES["masked"][size][k]
                                                           for k in ("vocab", "dim", "hidden", "layers")),
                                                         per_block=pb),
                    _masked_inputs),
}


def build(name: str, size: str = "cpu", per_block: bool = False, seed: int = 0) -> tuple[nn.Module, tuple]:
    """The model (fp32, train mode, seeded) and one batch of inputs."""
    entry = ZOO[name]
    torch.manual_seed(seed)
    model = entry.build(size, per_block).train()
    return model, entry.inputs(size, seed + 1)


def available(name: str) -> bool:
    return ZOO[name].needs != "transformers" or transformers_available()
