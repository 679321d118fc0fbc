#!/usr/bin/env python3
"""PyTorch's side of issue 35's f16 gap (scripts/bench/f16_gap.sh REF=1): the GPT of gpt_reference.py
trained on the same byte-level corpus with the same recipe as the meshtrain runs — d12, B x 1024,
AdamW (0.9, 0.95, wd 0.1 on matrices), cosine lr 6e-4 -> 6e-5 after steps/20 warm-up steps, clip 1.0
— under bf16 autocast, or f16 autocast with torch's GradScaler (init 65536, growth every 2000
steps). For one seed, both precisions see the same initial weights and the same batches (random
windows drawn from the seed), so their difference is what the precision costs PyTorch: the
control for meshtrain's own f16 - bf16 gap, run on the same machine. Prints one JSON line with the
final test loss (the first eval_batches x B windows of the test split)."""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from gpt_reference import GPT, make_adamw, require  # noqa: E402

h5py, np, torch = require("f16_gap_reference.py", "h5py", "numpy", "torch")


def lr_at(step, steps, warmup, base=6e-4, low=6e-5):
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return low + 0.5 * (base - low) * (1 + math.cos(math.pi * frac))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--precision", choices=("bf16", "f16"), required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-batches", type=int, default=40)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    T, B = 1024, args.batch
    torch.manual_seed(args.seed)
    with h5py.File(args.tokens) as f:
        train = torch.from_numpy(f["train/tokens"][...].astype(np.int64))
        test = torch.from_numpy(f["test/tokens"][...].astype(np.int64))
    model = GPT(256, 256, T, 12, 12, 768).cuda()
    opt = make_adamw(model)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_interval=2000,
                                  enabled=args.precision == "f16")
    step_fn = model if args.no_compile else torch.compile(model)
    gen = torch.Generator().manual_seed(args.seed)  # the batches: the same for both precisions
    warmup = args.steps // 20
    skipped = 0
    for s in range(args.steps):
        starts = torch.randint(0, train.numel() - T - 1, (B,), generator=gen)
        w = torch.stack([train[i: i + T + 1] for i in starts.tolist()]).cuda(non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(s, args.steps, warmup)
        with torch.autocast("cuda", dtype=dtype):
            loss = step_fn(w[:, :-1], w[:, 1:])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.is_enabled() and scaler.get_scale() < before
        opt.zero_grad(set_to_none=True)
        if s % 100 == 0:
            print(f"step {s}: train loss {loss.item():.4f}", file=sys.stderr, flush=True)
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        for b in range(args.eval_batches):
            rows = [test[(b * B + r) * T: (b * B + r) * T + T + 1] for r in range(B)]
            if len(rows[-1]) < T + 1:
                break
            w = torch.stack(rows).cuda()
            total += model(w[:, :-1], w[:, 1:]).item()
            n += 1
    print(json.dumps({"impl": "pytorch", "precision": args.precision, "seed": args.seed, "steps": args.steps,
                      "final_train_loss": loss.item(), "test_loss": total / max(1, n), "eval_batches": n,
                      "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
                      "skipped_steps": int(skipped), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
