#!/usr/bin/env bash
# Per-kernel GPU time of one GPT training step (default GPT-2 124M, B=64, T=1024, bf16) under Nsight
# Compute (duration metric only: one replay pass per kernel, clocks and caches as they run),
# aggregated by kernel name and by category (GEMMs, FP8 casts, GELU, attention, LayerNorm, ...).
#   bash scripts/device/run_on_device.sh exec bash scripts/device/profile_step.sh [kernels]
# Only step STEP (default 2) is recorded: the trainer runs STEP steps with run.profile_from=STEP and
# ncu --profile-from-start off, so setup, the first step's plans and evaluation stay out.
# Writes $OUT/step_kernels.csv (raw) and prints the tables. Kernel durations are measured with the
# kernels serialised, so their sum is the step's GPU time without overlap. BLOCKS=n also prints
# ms per transformer block (profile a model of n blocks, e.g. ARGS="--model.layers=2").
# CONFIG (default configs/gpt_d12.ini) and ARGS (extra trainer overrides) profile another model, e.g.
#   ARGS="--model.gpt_preset=d48 --model.layers=2 --train.batch_size=16 --train.precision=fp8" BLOCKS=2, or
#   CONFIG=configs/fashion_cnn.ini ARGS="--data.path=$FASHION_H5 --train.device=cuda --train.batch_size=1024"
#   (the overrides come last and win over the GPT defaults below).
set -euo pipefail
# shellcheck disable=SC2086  # ARGS is split into words on purpose
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/profile_step}"
mkdir -p "$out" datasets
tokens=datasets/bench_tokens.h5
if [[ ! -f $tokens ]]; then
  python3 -c "import numpy as np; np.save('/tmp/bench_tokens.npy', np.random.default_rng(0).integers(0, 50257, 64*1025*8, dtype=np.int64))"
  python3 scripts/data/text_to_tokens --npy /tmp/bench_tokens.npy --vocab 50257 --test-fraction 0.01 --out $tokens >/dev/null
fi
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
step="${STEP:-2}"
"$ncu" --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --print-units base -c "${1:-2500}" \
  "${TRAINER:-dist/bin/trainer}" --config "${CONFIG:-configs/gpt_d12.ini}" --data.path=$tokens --train.max_steps="$step" \
  --train.eval_batches=1 --run.dir=/tmp/profile_step --run.name=p --run.profile_from="$step" ${ARGS:-} \
  >"$out/step_kernels.csv" 2>"$out/ncu.err" || true
python3 - "$out/step_kernels.csv" "${BLOCKS:-0}" <<'PY'
import csv, sys, collections, re
CATEGORIES = [("fp8 casts", r"castKernel|amaxKernel|scaleKernel|pushKernel|colSumKernel"),
              ("gelu", r"gelu(Fwd|Bwd)"),
              ("attention", r"flash|Flash|attention|Attention|cudnn|fmha|sdpa"),
              ("layernorm", r"[lL]ayer[nN]orm|ln[A-Z]"),
              ("optimizer / clip", r"[aA]dam|[cC]lip|sumOfSquares|scaleInPlace"),
              ("gemm", r"sm90_|gemm|Gemm|cutlass|xmma|nvjet|cublas"),
              ("classifier / loss", r"[sS]oftmax|[cC]ross[eE]ntropy|logits"),
              ("embedding", r"[eE]mbedding|positional")]
def category(name):
    return next((c for c, p in CATEGORIES if re.search(p, name)), "other")
blocks = int(sys.argv[2])
rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)  # the trainer's own lines come first
rows = [r for r in rows[start:] if len(r) == len(rows[start])]
hdr = rows[0]
ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter(); cats = collections.defaultdict(float)
for r in rows[1:]:
    try:
        ns = float(r[vi].replace(",", ""))
    except ValueError:
        continue
    cats[category(r[ki])] += ns
    name = re.sub(r"\(.*", "", r[ki]).replace("void ", "")
    name = re.sub(r"<.*", "<..>", name) if "cutlass" in name or "sm90" in name else name
    tot[name] += ns; cnt[name] += 1
all_ns = sum(tot.values())
print(f"{len(rows)-1} kernels, {all_ns/1e6:.1f} ms GPU time in total")
print("| category | ms | share |" + (" ms per block |" if blocks else ""))
print("| --- | --- | --- |" + (" --- |" if blocks else ""))
for c, v in sorted(cats.items(), key=lambda kv: -kv[1]):
    print(f"| {c} | {v/1e6:.3f} | {100*v/all_ns:.1f} % |" + (f" {v/1e6/blocks:.3f} |" if blocks else ""))
print("| kernel | launches | ms | share |")
print("| --- | --- | --- | --- |")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:40]:
    print(f"| {k[:90]} | {cnt[k]} | {v/1e6:.2f} | {100*v/all_ns:.1f} % |")
PY
