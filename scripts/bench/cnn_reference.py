#!/usr/bin/env python3
"""PyTorch reference for scripts/bench/cnn_bench.sh: configs/fashion_cnn.ini's CNN
(u8 image -> normalise -> 2 x (conv3x3 pad 1 + ReLU + maxpool2) -> FC 128 + ReLU + dropout 0.25
-> FC 10, cross-entropy, AdamW) trained on Fashion-MNIST's training split held on the GPU, so the
data feed costs what meshtrain's device-resident feed costs (a gather of the batch's rows).

Variants, each at every --batch: eager f32 NCHW, eager f32 channels_last, eager bf16 autocast
channels_last, torch.compile (default mode) f32 and bf16, torch.compile mode="reduce-overhead"
(CUDA graphs) bf16. Prints one JSON line per (variant, batch): samples/s as the median over timed
windows of --window steps after --warmup steps, and the best variant per batch at the end."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from pydeps import require  # noqa: E402

h5py, np, torch = require("cnn_reference.py", "h5py", "numpy", "torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # models/ModelConfig.h defaults for Fashion-MNIST


class Cnn(nn.Module):
    def __init__(self, channels=(32, 64), fc=128, classes=10, dropout=0.25):
        super().__init__()
        c, convs = 1, []
        for o in channels:
            convs.append(nn.Conv2d(c, o, 3, padding=1))
            c = o
        self.convs = nn.ModuleList(convs)
        self.fc1 = nn.Linear(c * 7 * 7, fc)
        self.fc2 = nn.Linear(fc, classes)
        self.dropout = dropout

    def forward(self, x):
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(F.dropout(x, self.dropout, self.training))


def run(variant, batch, images, labels, args):
    torch.manual_seed(1234)
    channels_last = variant != "eager_f32_nchw"
    bf16 = "bf16" in variant
    model = Cnn().to(args.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4,
                            **({"fused": True} if args.device == "cuda" else {}))

    def step(x8, y):
        x = (x8.float() * (1.0 / (255.0 * STD)) - MEAN / STD).unsqueeze(1)  # [B,1,28,28]
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if variant.startswith("compiled"):
        mode = "reduce-overhead" if "graphs" in variant else "default"
        step_fn = torch.compile(step, mode=mode)
    else:
        step_fn = step
    n = images.shape[0]
    g = torch.Generator(device=args.device)
    g.manual_seed(0)

    def batch_rows():
        idx = torch.randint(0, n, (batch,), device=args.device, generator=g)
        return images.index_select(0, idx), labels.index_select(0, idx)

    for _ in range(args.warmup):
        step_fn(*batch_rows())
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    rates = []
    for _ in range(args.windows):
        t0 = time.perf_counter()
        for _ in range(args.window):
            loss = step_fn(*batch_rows())
        sync()
        rates.append(args.window * batch / (time.perf_counter() - t0))
    return {"variant": variant, "batch": batch, "samples_per_s": statistics.median(rates),
            "loss": float(loss), "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0,
            "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="meshtrain image HDF5 (train/images u8 NHWC, train/labels)")
    ap.add_argument("--batch", default="128,256,1024", help="comma-separated batch sizes")
    ap.add_argument("--variants", default="eager_f32_nchw,eager_f32,eager_bf16,compiled_f32,compiled_bf16,"
                    "compiled_graphs_bf16")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to check the script itself")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("cnn_reference.py: needs a CUDA GPU (--device cpu only checks the script)")
    torch.backends.cudnn.benchmark = True
    with h5py.File(args.data, "r") as f:
        images = torch.from_numpy(f["train/images"][...].reshape(-1, 28, 28)).to(args.device)
        labels = torch.from_numpy(f["train/labels"][...].astype(np.int64)).to(args.device)
    best = {}
    for b in (int(s) for s in args.batch.split(",")):
        for v in args.variants.split(","):
            try:
                r = run(v, b, images, labels, args)
            except Exception as e:  # a variant the installed torch cannot run is reported, not fatal
                r = {"variant": v, "batch": b, "error": f"{type(e).__name__}: {e}"[:300]}
            print(json.dumps(r), flush=True)
            if "samples_per_s" in r and r["samples_per_s"] > best.get(b, {}).get("samples_per_s", 0):
                best[b] = r
            if args.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    print(json.dumps({"best": {str(b): {"variant": r["variant"], "samples_per_s": r["samples_per_s"]}
                               for b, r in best.items()}}), flush=True)


if __name__ == "__main__":
    main()
