#!/usr/bin/env python3
"""PyTorch reference for scripts/bench/gpt_bench.sh: the same GPT-2 (models/gpt/Gpt.h) trained with
torch.compile, bf16 autocast, flash scaled-dot-product attention and fused AdamW, on the same
tokens, batch and sequence length. Prints one JSON line: tokens/s, MFU, peak memory.
Also --export-losses: f32 losses of the first steps from given initial weights (parity)."""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from pydeps import require  # noqa: E402

h5py, np, torch = require("gpt_reference.py", "h5py", "numpy", "torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        sh = lambda t: t.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(sh(q), sh(k), sh(v), is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, Vp, T, L, H, C, checkpoint=False):
        super().__init__()
        self.V = V
        self.checkpoint = checkpoint  # torch.utils.checkpoint per block (meshtrain's "blocks")
        self.wte = nn.Parameter(torch.randn(Vp, C) * 0.02)
        self.wpe = nn.Parameter(torch.randn(T, C) * 0.01)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        std = 0.02 / math.sqrt(2 * L)
        for b in self.h:
            for m in (b.c_attn, b.c_fc):
                nn.init.normal_(m.weight, std=0.02), nn.init.zeros_(m.bias)
            for m in (b.c_proj, b.mlp_proj):
                nn.init.normal_(m.weight, std=std), nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte[idx] + self.wpe[: idx.shape[1]]
        for b in self.h:
            if self.checkpoint and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            else:
                x = b(x)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits[..., : self.V].float().reshape(-1, self.V), targets.reshape(-1))


def make_adamw(model):
    """llm.c's and meshtrain's GPT AdamW: (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices only, fused."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around every block "
                    "(non-reentrant): what train.activation_checkpointing = blocks does")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    V, Vp, T, B = 50257, 50304, args.seq, args.batch
    with h5py.File(args.tokens) as f:
        toks = torch.from_numpy(f["train/tokens"][: B * (T + 1) * args.steps + 1].astype(np.int64))
    model = GPT(V, Vp, T, args.layers, args.heads, args.channels, args.checkpoint).cuda()
    opt = make_adamw(model)
    step_fn = model if args.no_compile else torch.compile(model)
    n = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n + 6 * args.layers * args.channels * T
    times = []
    torch.cuda.reset_peak_memory_stats()
    for s in range(args.steps):
        w = toks[s * B * (T + 1): (s + 1) * B * (T + 1)].view(B, T + 1).cuda(non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    steady = sorted(times[10:])[len(times[10:]) // 2]  # median after warm-up and compilation
    tps = B * T / steady
    impl = ("pytorch-compile" if not args.no_compile else "pytorch-eager") + ("+checkpoint" if args.checkpoint else "")
    print(json.dumps({"impl": impl, "tokens_per_s": tps,
                      "mfu": tps * flops_per_token / 989e12, "step_ms": steady * 1000,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "final_loss": loss.item(),
                      "params": n, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
