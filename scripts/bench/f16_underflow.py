#!/usr/bin/env python3
"""How much of a GPT's gradient f16 storage loses at a given loss scale (issue 35), on the CPU.

meshtrain's f16 path stores the gradients that GEMMs and attention read (the logits' gradient, the
classifier input's, attention's output and qkv gradients, the GELU input's, each LayerNorm output's
and the residual stream's copy for the projection GEMMs) in f16, scaled by the loss scale S; each
is the gradient of the MEAN loss over N = B x T tokens, so a token's entries are ~ S / N. This
script trains a small pre-LayerNorm GPT (f32, PyTorch on the CPU) on real text for a few steps,
captures those gradients, and for each loss scale reports, per tensor, the relative L2 error of
storing S*g in f16 (and, for comparison, in bf16, which has no range problem) and the share of
nonzero entries that f16 flushes to zero or keeps as subnormals (fewer than 10 bits). The
per-token size is rescaled to the issue's N = 32 x 1024 (--tokens-per-step), so the scales mean
what they mean there.

    /usr/bin/python3 scripts/bench/f16_underflow.py [--steps 30] [--scales 65536,4096,256,16]
"""
import argparse
import glob
import math

import torch
import torch.nn.functional as F


def corpus(limit):
    data = bytearray()
    for p in sorted(glob.glob("/usr/lib/python3*/*.py")):
        data += open(p, "rb").read()
        if len(data) >= limit:
            break
    if not data:
        raise SystemExit("f16_underflow: no /usr/lib/python3*/*.py to read")
    return torch.tensor(list(data[:limit]), dtype=torch.long)


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc, self.fc_proj = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x, keep):
        b, t, c = x.shape
        h1 = self.ln1(x)
        qkv = self.qkv(h1)
        q, k, v = (u.view(b, t, self.heads, -1).transpose(1, 2) for u in qkv.split(c, dim=-1))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x1 = x + self.proj(y)
        h2 = self.ln2(x1)
        pre = self.fc(h2)
        out = x1 + self.fc_proj(F.gelu(pre, approximate="tanh"))
        for name, tensor in (("ln out", h1), ("qkv", qkv), ("attention out", y), ("ln out", h2),
                             ("gelu input", pre), ("residual", x1)):
            tensor.retain_grad()
            keep.append((name, tensor))
        return out


class Gpt(torch.nn.Module):
    def __init__(self, layers, c, heads, t):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.randn(256, c) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(t, c) * 0.01)
        self.blocks = torch.nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(c)
        for blk in self.blocks:
            for lin in (blk.proj, blk.fc_proj):
                torch.nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens, targets, keep):
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, keep)
        xf = self.lnf(x)
        logits = xf @ self.wte.t()
        for name, tensor in (("classifier input", xf), ("logits", logits)):
            tensor.retain_grad()
            keep.append((name, tensor))
        return F.cross_entropy(logits.view(-1, 256), targets.reshape(-1))


def stored_error(g, scale, dtype):
    """Relative L2 error of g stored as (scale * g) in dtype and unscaled again."""
    s = (g * scale).to(dtype).float() / scale
    return ((s - g).norm() / g.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="f32 AdamW steps before the measurement")
    ap.add_argument("--tokens-per-step", type=int, default=32 * 1024, help="the N the scales refer to")
    ap.add_argument("--scales", default="65536,4096,256,16")
    a = ap.parse_args()
    torch.manual_seed(0)
    data = corpus(4 << 20)
    model = Gpt(a.layers, a.channels, a.heads, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95))

    def batch():
        i = torch.randint(0, len(data) - a.seq - 1, (a.batch,))
        x = torch.stack([data[j: j + a.seq + 1] for j in i.tolist()])
        return x[:, :-1], x[:, 1:]

    for step in range(a.steps):
        x, y = batch()
        keep = []
        loss = model(x, y, keep)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = batch()
    keep = []
    loss = model(x, y, keep)
    loss.backward()
    print(f"after {a.steps} f32 steps: loss {loss.item():.4f}; N here {a.batch * a.seq}, scales for N = "
          f"{a.tokens_per_step}")
    # The gradient of the mean over N tokens is 1/N per token: rescale ours to the N.
    rescale = (a.batch * a.seq) / a.tokens_per_step
    grads = {}
    for name, t in keep:
        grads.setdefault(name, []).append(t.grad.flatten() * rescale)
    tiny, sub_max = 2.0 ** -24, 2.0 ** -14  # f16's smallest subnormal and smallest normal
    for scale in (float(s) for s in a.scales.split(",")):
        print(f"loss scale {scale:g}:")
        for name, gs in grads.items():
            g = torch.cat(gs)
            nz = g != 0
            sg = (g * scale).abs()
            flushed = ((sg < tiny / 2) & nz).float().mean().item()
            subnormal = ((sg >= tiny / 2) & (sg < sub_max)).float().mean().item()
            print(f"  {name:17s} f16 rel.err {stored_error(g, scale, torch.float16):.2e}  bf16 "
                  f"{stored_error(g, scale, torch.bfloat16):.2e}  flushed to 0 {100 * flushed:5.1f}%  "
                  f"subnormal {100 * subnormal:5.1f}%")


if __name__ == "__main__":
    main()
