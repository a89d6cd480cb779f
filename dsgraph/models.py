"""Reference models for the examples, benchmarks and tests.

- ``GPT``: a GPT-2 style decoder (pre-norm blocks, causal SDPA, GELU MLP, tied embedding
  and head) whose forward returns the cross-entropy loss. ``GPTConfig.gpt2_small()`` is the
  benchmark's GPT-2-small (12 layers, 768 wide, 12 heads, vocabulary 50304, 1024 positions).
- ``MLP``: ``depth`` x (Linear(width, width) + GELU); the benchmark uses 8 x 4096.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 50304
    seq: int = 1024
    layers: int = 12
    heads: int = 12
    dim: int = 768
    dropout: float = 0.0
    # per-block torch.utils.checkpoint, as people write it by hand (a benchmark baseline)
    checkpoint_blocks: bool = False

    @staticmethod
    def gpt2_small() -> "GPTConfig":
        return GPTConfig()


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.down = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)), self.dropout, self.training)
        return x + F.dropout(self.down(F.gelu(self.up(self.ln2(x)))), self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            if self.cfg.checkpoint_blocks and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def gpt_inputs(cfg: GPTConfig, batch: int, device: str | torch.device = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=g)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq), generator=g)
    return idx.to(device), targets.to(device)


class MLP(nn.Module):
    def __init__(self, width: int = 4096, depth: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x.float().square().mean()
