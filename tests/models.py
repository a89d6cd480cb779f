"""Small models for tests: odd sizes, several op kinds, random data (never only zeros)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from dsgraph.runtime.linear_cross_entropy import linear_cross_entropy


class MLP(nn.Module):
    def __init__(self, d_in=13, hidden=37, d_out=7, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d_out)
        self.dropout = dropout

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = F.dropout(self.norm(h), self.dropout, self.training)
        return self.fc2(h)


class TinyBlock(nn.Module):
    """A pre-norm transformer block with SDPA, as in the GPT example, at toy size."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim - 5)
        self.down = nn.Linear(4 * dim - 5, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=61, dim=24, layers=2, seq=11):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(TinyBlock(dim) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt_batch(batch=3, seq=11, vocab=61, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (batch, seq), generator=g)
    return idx, torch.randint(0, vocab, (batch, seq), generator=g)


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with BatchNorm and a shortcut (a 1x1 convolution
    where the block changes the stride or the channels)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18 in pure torch (a 7x7 stem, max pooling, four stages of two
    blocks, 64 to 512 channels), with the cross-entropy loss: ``model(images, labels)``."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x, y):
        x = self.blocks(F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1))
        return F.cross_entropy(self.fc(x.mean((2, 3))), y)


class ChunkedHead(nn.Module):
    """A projection, then dsgraph's chunked linear + cross-entropy op called directly (its
    joint graph holds the op with a workspace, without the chunk_loss pass)."""

    def __init__(self, chunk_tokens=16):
        super().__init__()
        self.proj = nn.Linear(24, 24)
        self.head = nn.Linear(24, 301)
        self.chunk_tokens = chunk_tokens

    def forward(self, x, t):
        h = torch.tanh(self.proj(x))
        return linear_cross_entropy(h, self.head.weight, self.head.bias, t, chunk_tokens=self.chunk_tokens)
