#!/usr/bin/env python3
"""PyTorch oracle for the parity tests (tests/models/test_parity.cpp).

Writes one HDF5 file with, for every op, the inputs, parameters and upstream gradient, and what
PyTorch computes for the output and every gradient; and for the mlp and cnn models, the initial
weights (in meshtrain's layouts), the batches of 20 training steps, the loss at every step and
the final weights. The C++ side recomputes everything and compares (f32, relative error < 1e-5).
"""
import math
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(0)
np.random.seed(0)
torch.set_default_dtype(torch.float32)
MEAN, STD = 0.2860, 0.3530


def t2n(t):
    return t.detach().cpu().numpy()


def nhwc(t):  # NCHW -> NHWC
    return t.permute(0, 2, 3, 1).contiguous()


def op_case(h5, name, arrays):
    g = h5.create_group("ops/" + name)
    for k, v in arrays.items():
        g.create_dataset(k, data=t2n(v) if torch.is_tensor(v) else np.asarray(v))


def ops(h5):
    # linear
    x = torch.randn(7, 13, requires_grad=True)
    w = torch.randn(5, 13, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    y = F.linear(x, w, b)
    dy = torch.randn_like(y)
    y.backward(dy)
    op_case(h5, "linear", dict(x=x, w=w, b=b, dy=dy, y=y, dx=x.grad, dw=w.grad, db=b.grad))

    # conv2d, two geometries, both layouts from the same NCHW computation
    for tag, (n, c, hh, ww, o, k, s, p) in {"conv_s1p1": (3, 4, 9, 7, 6, 3, 1, 1),
                                             "conv_s2p0": (2, 3, 11, 10, 5, 3, 2, 0),
                                             "conv_k5p2": (2, 2, 8, 8, 3, 5, 1, 2)}.items():
        x = torch.randn(n, c, hh, ww, requires_grad=True)
        w = torch.randn(o, c, k, k, requires_grad=True)
        b = torch.randn(o, requires_grad=True)
        y = F.conv2d(x, w, b, stride=s, padding=p)
        dy = torch.randn_like(y)
        y.backward(dy)
        meta = np.array([o, k, s, p])
        op_case(h5, tag + "_nchw", dict(x=x, w=w, b=b, dy=dy, y=y, dx=x.grad, dw=w.grad, db=b.grad, meta=meta))
        op_case(h5, tag + "_nhwc", dict(x=nhwc(x), w=w.permute(0, 2, 3, 1), b=b, dy=nhwc(dy), y=nhwc(y),
                                        dx=nhwc(x.grad), dw=w.grad.permute(0, 2, 3, 1), db=b.grad, meta=meta))

    # max pooling (non-overlapping and overlapping windows)
    for tag, (k, s) in {"pool_k2s2": (2, 2), "pool_k3s2": (3, 2)}.items():
        x = torch.randn(2, 3, 9, 8, requires_grad=True)
        y = F.max_pool2d(x, k, s)
        dy = torch.randn_like(y)
        y.backward(dy)
        meta = np.array([k, s])
        op_case(h5, tag + "_nchw", dict(x=x, dy=dy, y=y, dx=x.grad, meta=meta))
        op_case(h5, tag + "_nhwc", dict(x=nhwc(x), dy=nhwc(dy), y=nhwc(y), dx=nhwc(x.grad), meta=meta))

    # activations
    for tag, fn in {"relu": F.relu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
                    "gelu_erf": lambda v: F.gelu(v, approximate="none")}.items():
        x = (torch.randn(6, 33) * 3).requires_grad_(True)
        y = fn(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        op_case(h5, tag, dict(x=x, dy=dy, y=y, dx=x.grad))

    # dropout with a given keep-mask: y = x * m / (1 - p)
    p = 0.3
    x = torch.randn(5, 40, requires_grad=True)
    m = (torch.rand(5, 40) >= p).float()
    y = x * m / (1 - p)
    dy = torch.randn_like(y)
    y.backward(dy)
    op_case(h5, "dropout", dict(x=x, mask=m.to(torch.uint8), dy=dy, y=y, dx=x.grad, p=np.array([p])))

    # layernorm
    x = (torch.randn(10, 17) * 2 + 1).requires_grad_(True)
    w = torch.randn(17, requires_grad=True)
    b = torch.randn(17, requires_grad=True)
    y = F.layer_norm(x, (17,), w, b, eps=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    op_case(h5, "layernorm", dict(x=x, w=w, b=b, dy=dy, y=y, dx=x.grad, dw=w.grad, db=b.grad))

    # softmax cross-entropy, mean over non-ignored rows
    z = (torch.randn(9, 11) * 3).requires_grad_(True)
    t = torch.randint(0, 11, (9,))
    t[4] = -100
    loss = F.cross_entropy(z, t, ignore_index=-100)
    loss.backward()
    op_case(h5, "cross_entropy", dict(z=z, t=t, loss=loss.reshape(1), dz=z.grad))

    # embedding with repeated indices
    w = torch.randn(20, 8, requires_grad=True)
    idx = torch.tensor([[3, 7, 3], [19, 0, 7]])
    y = F.embedding(idx, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    op_case(h5, "embedding", dict(w=w, idx=idx, dy=dy, y=y, dw=w.grad))


class Mlp(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        dims = [784] + hidden + [10]
        self.layers = torch.nn.ModuleList([torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])

    def forward(self, x):
        x = ((x.float() / 255 - MEAN) / STD).reshape(x.shape[0], -1)
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x

    def export(self, layout):
        return {f"fc{i + 1}.{k}": t2n(v) for i, l in enumerate(self.layers) for k, v in
                (("weight", l.weight), ("bias", l.bias))}


class Cnn(torch.nn.Module):
    def __init__(self, channels, fc):
        super().__init__()
        c1, c2 = channels
        self.conv1 = torch.nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(c1, c2, 3, padding=1)
        self.fc1 = torch.nn.Linear(c2 * 7 * 7, fc)
        self.fc2 = torch.nn.Linear(fc, 10)
        self.c2 = c2

    def forward(self, x):  # x: u8 [N,28,28,1]
        x = ((x.float() / 255 - MEAN) / STD).permute(0, 3, 1, 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)

    def export(self, layout):
        out = {}
        for name in ("conv1", "conv2"):
            m = getattr(self, name)
            w = m.weight if layout == "nchw" else m.weight.permute(0, 2, 3, 1)
            out[name + ".weight"] = t2n(w.contiguous())
            out[name + ".bias"] = t2n(m.bias)
        w = self.fc1.weight
        if layout == "nhwc":  # meshtrain flattens (H,W,C), PyTorch (C,H,W)
            w = w.reshape(w.shape[0], self.c2, 7, 7).permute(0, 2, 3, 1).reshape(w.shape[0], -1)
        out["fc1.weight"] = t2n(w.contiguous())
        out["fc1.bias"] = t2n(self.fc1.bias)
        out["fc2.weight"] = t2n(self.fc2.weight)
        out["fc2.bias"] = t2n(self.fc2.bias)
        return out


def lr_at(step, base, warmup, total, min_lr):  # core/optim/LrSchedule.h "cosine"
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def real_batches(steps, batch):
    """Fashion-MNIST training images (random noise with random labels makes gradients that are
    mostly cancellation, whose sign no two implementations agree on)."""
    import gzip
    import os
    src = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    with gzip.open(os.path.join(src, "train-images-idx3-ubyte.gz")) as f:
        img = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)
    with gzip.open(os.path.join(src, "train-labels-idx1-ubyte.gz")) as f:
        lbl = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    idx = torch.randperm(len(img))[: steps * batch].numpy()
    xs = torch.from_numpy(img[idx].copy()).reshape(steps, batch, 28, 28, 1)
    ys = torch.from_numpy(lbl[idx].copy()).reshape(steps, batch)
    return xs, ys


def train_case(h5, name, model, layout, opt_kind, steps=20, batch=16, clip=0.0):
    g = h5.create_group("train/" + name)
    for k, v in model.export(layout).items():
        g.create_dataset("init/" + k, data=v)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    if opt_kind == "adamw":
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        base, warmup, min_lr = 1e-3, 5, 1e-4
    else:
        opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=0.05, momentum=0.9)
        base, warmup, min_lr = 0.05, 3, 0.005
    xs, ys = real_batches(steps, batch)
    losses = []
    for s in range(steps):
        for pg in opt.param_groups:
            pg["lr"] = lr_at(s, base, warmup, steps, min_lr)
        opt.zero_grad()
        loss = F.cross_entropy(model(xs[s]), ys[s])
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    g.create_dataset("x", data=t2n(xs))
    g.create_dataset("y", data=t2n(ys))
    g.create_dataset("losses", data=np.array(losses, dtype=np.float64))
    for k, v in model.export(layout).items():
        g.create_dataset("final/" + k, data=v)
    g.attrs["optimizer"] = opt_kind
    g.attrs["base_lr"] = base
    g.attrs["warmup"] = warmup
    g.attrs["min_lr"] = min_lr
    g.attrs["clip"] = clip


class TorchGpt(torch.nn.Module):
    """GPT-2 as in models/gpt/Gpt.h (nn.Linear layouts, tied embeddings, padded vocabulary)."""

    def __init__(self, V, Vp, T, L, H, C):
        super().__init__()
        self.V, self.H = V, H
        self.wte = torch.nn.Parameter(torch.randn(Vp, C) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(T, C) * 0.01)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln_1 = torch.nn.LayerNorm(C)
            b.c_attn = torch.nn.Linear(C, 3 * C)
            b.c_proj = torch.nn.Linear(C, C)
            b.ln_2 = torch.nn.LayerNorm(C)
            b.c_fc = torch.nn.Linear(C, 4 * C)
            b.mlp_proj = torch.nn.Linear(4 * C, C)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            q, k, v = b.c_attn(b.ln_1(x)).split(x.shape[-1], dim=2)
            sh = lambda t: t.view(B, T, self.H, -1).transpose(1, 2)
            q, k, v = sh(q), sh(k), sh(v)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
            x = x + b.c_proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x)), approximate="tanh"))
        return self.ln_f(x) @ self.wte.t()

    def export(self):
        out = {"wte": self.wte, "wpe": self.wpe, "ln_f.weight": self.ln_f.weight, "ln_f.bias": self.ln_f.bias}
        for i, b in enumerate(self.blocks):
            for ours, mod in (("ln_1", b.ln_1), ("attn.c_attn", b.c_attn), ("attn.c_proj", b.c_proj), ("ln_2", b.ln_2),
                              ("mlp.c_fc", b.c_fc), ("mlp.c_proj", b.mlp_proj)):
                out[f"h{i}.{ours}.weight"] = mod.weight
                out[f"h{i}.{ours}.bias"] = mod.bias
        return {k: t2n(v) for k, v in out.items()}


def gpt_case(h5, name="gpt", H=4, C=32, T=16, steps=10):
    """Head dim C / H: 8 takes meshtrain's reference attention, 64 its flash kernels on the GPU."""
    V, Vp, L, B = 65, 128, 2, 4
    torch.manual_seed(5)
    model = TorchGpt(V, Vp, T, L, H, C)
    g = h5.create_group(name)
    for k, v in model.export().items():
        g.create_dataset("init/" + k, data=v)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    data = torch.randint(0, V, (steps, B, T + 1))
    losses = []
    for s in range(steps):
        opt.zero_grad()
        logits = model(data[s, :, :-1])
        loss = F.cross_entropy(logits[..., :V].reshape(-1, V), data[s, :, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    g.create_dataset("tokens", data=t2n(data).astype(np.int32))
    g.create_dataset("losses", data=np.array(losses, dtype=np.float64))
    g.attrs["config"] = np.array([V, Vp, T, L, H, C, B])
    g.create_dataset("config_values", data=np.array([V, Vp, T, L, H, C, B], dtype=np.int64))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "parity_ref.h5"
    with h5py.File(out, "w") as h5:
        h5.attrs["torch_version"] = str(torch.__version__)
        ops(h5)
        torch.manual_seed(1)
        train_case(h5, "mlp_adamw", Mlp([64, 32]), "nhwc", "adamw", clip=1.0)
        torch.manual_seed(2)
        train_case(h5, "mlp_sgd", Mlp([64, 32]), "nhwc", "sgd")
        torch.manual_seed(3)
        cnn = Cnn((8, 16), 32)
        train_case(h5, "cnn_nhwc_sgd", cnn, "nhwc", "sgd")
        torch.manual_seed(3)
        cnn = Cnn((8, 16), 32)
        train_case(h5, "cnn_nchw_adamw", cnn, "nchw", "adamw", clip=0.5)
        gpt_case(h5)
        gpt_case(h5, "gpt_d64", H=2, C=128, T=40)
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
