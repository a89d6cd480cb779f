"""Models the checkpoint planner's zoo does not hold yet (session 31): a U-Net, the zoo's ViT (tests/zoo.py), an encoder-decoder with cross-attention, a dense top-k MoE; CPU sizes.
Checked by ``python -m benchmarks.unseen_zoo unet,moe`` (docs/BENCHMARKS.md, session 31)."""
import torch, torch.nn as nn, torch.nn.functional as F
import torch.utils.checkpoint

def ck(block, pb, *a):
    if pb and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(block, *a, use_reentrant=False)
    return block(*a)

class UBlock(nn.Module):
    def __init__(s, cin, cout):
        super().__init__()
        s.c1 = nn.Conv2d(cin, cout, 3, padding=1); s.n1 = nn.GroupNorm(4, cout)
        s.c2 = nn.Conv2d(cout, cout, 3, padding=1); s.n2 = nn.GroupNorm(4, cout)
    def forward(s, x):
        x = F.silu(s.n1(s.c1(x)))
        return F.silu(s.n2(s.c2(x)))

class UNet(nn.Module):
    """Long skip connections: every encoder level's output is live until its decoder level."""
    def __init__(s, ch=8, levels=3, per_block=False):
        super().__init__()
        s.pb = per_block
        s.inp = nn.Conv2d(3, ch, 3, padding=1)
        s.down = nn.ModuleList(); s.up = nn.ModuleList(); s.upconv = nn.ModuleList()
        c = ch
        for i in range(levels):
            s.down.append(UBlock(c, c * 2)); c *= 2
        s.mid = UBlock(c, c)
        for i in range(levels):
            s.upconv.append(nn.ConvTranspose2d(c, c // 2, 2, stride=2))
            s.up.append(UBlock(c // 2 + c, c // 2)); c //= 2
        s.out = nn.Conv2d(c, 3, 1)
    def forward(s, x, target):
        h = s.inp(x); skips = []
        for b in s.down:
            h = ck(b, s.pb, h); skips.append(h); h = F.max_pool2d(h, 2)
        h = ck(s.mid, s.pb, h)
        for uc, b in zip(s.upconv, s.up):
            h = uc(h); h = ck(b, s.pb, torch.cat([h, skips.pop()], 1))
        return F.mse_loss(s.out(h), target)

class XBlock(nn.Module):
    def __init__(s, d, heads):
        super().__init__()
        s.n1 = nn.LayerNorm(d); s.sa = nn.MultiheadAttention(d, heads, batch_first=True)
        s.n2 = nn.LayerNorm(d); s.ca = nn.MultiheadAttention(d, heads, batch_first=True)
        s.n3 = nn.LayerNorm(d); s.ff = nn.Sequential(nn.Linear(d, 3 * d), nn.ReLU(), nn.Linear(3 * d, d))
    def forward(s, x, mem):
        h = s.n1(x); x = x + s.sa(h, h, h, need_weights=False)[0]
        h = s.n2(x); x = x + s.ca(h, mem, mem, need_weights=False)[0]
        return x + s.ff(s.n3(x))

class EncBlock(nn.Module):
    def __init__(s, d, heads):
        super().__init__()
        s.n1 = nn.LayerNorm(d); s.sa = nn.MultiheadAttention(d, heads, batch_first=True)
        s.n2 = nn.LayerNorm(d); s.ff = nn.Sequential(nn.Linear(d, 3 * d), nn.ReLU(), nn.Linear(3 * d, d))
    def forward(s, x):
        h = s.n1(x); x = x + s.sa(h, h, h, need_weights=False)[0]
        return x + s.ff(s.n2(x))

class EncDec(nn.Module):
    """Encoder-decoder: the encoder's output (computed, not an input) is read by every decoder layer."""
    def __init__(s, vocab=89, d=32, heads=2, enc=3, dec=3, per_block=False):
        super().__init__()
        s.pb = per_block
        s.emb = nn.Embedding(vocab, d)
        s.enc = nn.ModuleList(EncBlock(d, heads) for _ in range(enc)); s.en = nn.LayerNorm(d)
        s.dec = nn.ModuleList(XBlock(d, heads) for _ in range(dec)); s.dn = nn.LayerNorm(d)
        s.head = nn.Linear(d, vocab)
    def forward(s, src, tgt, labels):
        m = s.emb(src)
        for b in s.enc:
            m = ck(b, s.pb, m)
        m = s.en(m); x = s.emb(tgt)
        for b in s.dec:
            x = ck(b, s.pb, x, m)
        return F.cross_entropy(s.head(s.dn(x)).flatten(0, 1), labels.flatten())

class MoELayer(nn.Module):
    def __init__(s, d, hidden, experts, k):
        super().__init__()
        s.norm = nn.LayerNorm(d); s.router = nn.Linear(d, experts, bias=False)
        s.w1 = nn.Parameter(torch.randn(experts, d, hidden) * d ** -0.5)
        s.w2 = nn.Parameter(torch.randn(experts, hidden, d) * hidden ** -0.5)
        s.k = k
    def forward(s, x):
        h = s.norm(x)
        gates = s.router(h).softmax(-1)
        top, idx = gates.topk(s.k, -1)
        weights = torch.zeros_like(gates).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        y = torch.einsum("nd,edh->enh", h, s.w1)
        y = torch.einsum("enh,ehd->end", F.gelu(y), s.w2)
        return x + torch.einsum("end,ne->nd", y, weights)

class MoE(nn.Module):
    """Dense top-k mixture of experts: topk, scatter, batched einsums."""
    def __init__(s, d=24, hidden=37, experts=4, k=2, layers=4, per_block=False):
        super().__init__()
        s.pb = per_block
        s.layers = nn.ModuleList(MoELayer(d, hidden, experts, k) for _ in range(layers))
    def forward(s, x):
        for l in s.layers:
            x = ck(l, s.pb, x)
        return x.square().mean()

def build(name, per_block=False, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name == "unet":
        m = UNet(per_block=per_block); x = torch.randn(3, 3, 32, 32, generator=g)
        return m.train(), (x, torch.randn(3, 3, 32, 32, generator=g))
    if name == "vit":  # the zoo's (tests/zoo.py)
        from tests import zoo
        return zoo.build("vit", per_block=per_block, seed=seed)
    if name == "encdec":
        m = EncDec(per_block=per_block)
        return m.train(), (torch.randint(0, 89, (4, 29), generator=g), torch.randint(0, 89, (4, 23), generator=g),
                           torch.randint(0, 89, (4, 23), generator=g))
    if name == "moe":
        m = MoE(per_block=per_block)
        return m.train(), (torch.randn(211, 24, generator=g),)
    raise KeyError(name)
