#!/usr/bin/env bash
# configs/fashion_cnn.ini on one GPU at several batch sizes, meshtrain (f32 and bf16, the training
# split resident on the GPU) and the PyTorch reference (scripts/bench/cnn_reference.py: eager,
# channels_last, bf16 autocast, torch.compile, CUDA graphs) in ONE run, then the table of ratios
# against PyTorch's best variant at each batch. Both sides time training steps only: meshtrain
# evaluates once, after the last step (outside the timed intervals), and writes no checkpoint.
# On the device tool: bash scripts/device/run_on_device.sh exec bash scripts/bench/cnn_bench.sh
# Environment: TRAINER (default dist/bin/trainer or build/bin/trainer), FASHION_H5 (the dataset),
# BATCHES ("128 256 1024"), PRECISIONS ("f32 bf16"), STEPS (400), OUT (results), REF (1; 0 =
# meshtrain only), ARGS (extra trainer overrides), VARIANTS (cnn_reference.py --variants).
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer="${TRAINER:-$( [[ -x dist/bin/trainer ]] && echo dist/bin/trainer || echo build/bin/trainer )}"
data="${FASHION_H5:-datasets/fashion_mnist.h5}"
out="${OUT:-/tmp/cnn_bench}"
steps="${STEPS:-400}"
batches="${BATCHES:-128 256 1024}"
precisions="${PRECISIONS:-f32 bf16}"
mkdir -p "$out"
for b in $batches; do
  for p in $precisions; do
    name="mt_${p}_b$b"
    rm -rf "${out:?}/$name"
    # shellcheck disable=SC2086  # ARGS is split into words on purpose
    "$trainer" --config configs/fashion_cnn.ini --data.path="$data" --train.device=cuda --data.feed=device \
      --data.num_workers=0 --train.precision="$p" --train.batch_size="$b" --train.max_steps="$steps" \
      --run.log_interval=$((steps / 8)) --train.eval_interval="$steps" --checkpoint.at_exit=false --run.dir="$out" --run.name="$name" ${ARGS:-} >"$out/$name.log" 2>&1 ||
      { echo "cnn_bench: $name failed:"; tail -5 "$out/$name.log"; }
  done
done
if [[ ${REF:-1} != 0 ]]; then
  python3 scripts/bench/cnn_reference.py --data "$data" --batch "${batches// /,}" \
    ${VARIANTS:+--variants "$VARIANTS"} >"$out/pytorch.jsonl" 2>"$out/pytorch.err" || tail -5 "$out/pytorch.err"
fi
python3 - "$out" "$batches" "$precisions" <<'PY'
import json, os, statistics, sys
out, batches, precisions = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
ref = {}
path = f"{out}/pytorch.jsonl"
if os.path.exists(path):
    for line in open(path):
        r = json.loads(line)
        if "samples_per_s" in r:
            ref.setdefault(r["batch"], {})[r["variant"]] = r["samples_per_s"]
        elif "error" in r:
            print(f"pytorch {r['variant']} b{r['batch']}: {r['error']}")
variants = sorted({v for d in ref.values() for v in d})
print("| batch | " + " | ".join(f"meshtrain {p}" for p in precisions) + "".join(f" | {v}" for v in variants) +
      " | best PyTorch | meshtrain best / PyTorch best |")
print("| --- " * (len(precisions) + len(variants) + 3) + "|")
for b in batches:
    ours = []
    for p in precisions:
        try:
            recs = [json.loads(l) for l in open(f"{out}/mt_{p}_b{b}/metrics.jsonl")]
            steps = [r["samples_per_s"] for r in recs if r["type"] == "step"][1:]  # after warm-up
            ours.append(statistics.median(steps) if steps else 0.0)
        except (OSError, KeyError, ValueError):
            ours.append(0.0)
    theirs = ref.get(int(b), {})
    best = max(theirs.values()) if theirs else 0.0
    row = [b] + [f"{v:,.0f}" for v in ours] + [f"{theirs[v]:,.0f}" if v in theirs else "-" for v in variants]
    row += [f"{best:,.0f}", f"{max(ours) / best:.2f}" if best else "-"]
    print("| " + " | ".join(str(x) for x in row) + " |")
PY
