#!/usr/bin/env bash
# GPT-2 124M (d12) at B=64 T=1024 bf16 on one GPU, meshtrain and the PyTorch reference
# (torch.compile, bf16 autocast, flash SDPA, fused AdamW) in ONE run, then the ratio.
# On the device tool: bash scripts/device/run_on_device.sh exec bash scripts/bench/gpt_bench.sh
# Environment: TRAINER (default dist/bin/trainer or build/bin/trainer), STEPS (50), OUT (results),
# REF (1; 0 = meshtrain only, for A/B runs of meshtrain settings after a full run),
# NAME (run name, default meshtrain), PRESET (d12; d24 = GPT-2 350M, d36, d48, gpt3-2.7b, gpt3-6.7b), BATCH (64),
# ARGS (extra trainer overrides for meshtrain's half, e.g. "--optim.lr=1e-7 --train.grad_clip=0"),
# REF_ARGS (extra gpt_reference.py options, e.g. --checkpoint: torch.utils.checkpoint per block).
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer="${TRAINER:-$( [[ -x dist/bin/trainer ]] && echo dist/bin/trainer || echo build/bin/trainer )}"
out="${OUT:-/tmp/gpt_bench}"
steps="${STEPS:-50}"
ref="${REF:-1}"
preset="${PRESET:-d12}"
batch="${BATCH:-64}"
case "$preset" in
  d12) dims="--layers 12 --heads 12 --channels 768" ;;
  d24) dims="--layers 24 --heads 16 --channels 1024" ;;
  d36) dims="--layers 36 --heads 20 --channels 1280" ;;
  d48) dims="--layers 48 --heads 25 --channels 1600" ;;
  gpt3-2.7b) dims="--layers 32 --heads 20 --channels 2560" ;;
  gpt3-6.7b) dims="--layers 32 --heads 32 --channels 4096" ;;
  *) echo "gpt_bench: PRESET=$preset: d12, d24, d36, d48, gpt3-2.7b or gpt3-6.7b" >&2; exit 2 ;;
esac
name="${NAME:-meshtrain}"
mkdir -p "$out" datasets
tokens=datasets/bench_tokens.h5
# Random GPT-2 token ids: throughput does not depend on what the tokens say. The file records how
# many it holds ($tokens.count): one made for fewer steps (or by another script) is made again, since
# PyTorch's half stops with an error when the data runs out.
need=$((128 * 1025 * (steps + 5)))
if [[ ! -f $tokens || $(cat "$tokens.count" 2>/dev/null || echo 0) -lt $need ]]; then
  python3 -c "import numpy as np; np.save('/tmp/bench_tokens.npy', np.random.default_rng(0).integers(0, 50257, $need, dtype=np.int64))"
  rm -f "$tokens" "$tokens.count"
  python3 scripts/data/text_to_tokens --npy /tmp/bench_tokens.npy --vocab 50257 --test-fraction 0.01 --out $tokens
  echo $need >"$tokens.count"
fi
# SM clock and board power twice a second while each half runs (where nvidia-smi is): at large
# models both frameworks sit at the power limit with the clock below its boost, which decides what
# a ratio can be (docs/performance.md, "what bounds the d48 step").
sample() {  # sample FILE: starts the sampler, prints its pid (nothing without nvidia-smi)
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 >"$1" 2>/dev/null &
  echo $!
}
echo "== $name"
rm -rf "${out:?}/$name"
rm -f "$out/$name.clocks" "$out/pytorch.clocks"
smi=$(sample "$out/$name.clocks")
# shellcheck disable=SC2086  # ARGS is split into words on purpose
"$trainer" --config configs/gpt_d12.ini --data.path=$tokens --train.max_steps="$steps" --run.dir="$out" \
  --run.name="$name" --model.gpt_preset="$preset" --train.batch_size="$batch" ${ARGS:-} 2>&1 | tee "$out/$name.log" | grep -E "step [0-9]+/|memory|final|error" || true
[[ -n $smi ]] && kill "$smi" 2>/dev/null
if [[ $ref != 0 ]]; then
  echo "== pytorch"
  smi=$(sample "$out/pytorch.clocks")
  # shellcheck disable=SC2086
  python3 scripts/bench/gpt_reference.py --tokens $tokens --steps "$steps" --batch "$batch" $dims ${REF_ARGS:-} 2>&1 | tee "$out/pytorch.log" | tail -1
  [[ -n $smi ]] && kill "$smi" 2>/dev/null
fi
python3 - "$out" "$name" "$ref" <<'PY'
import json, os, sys, statistics
out, name, ref = sys.argv[1], sys.argv[2], sys.argv[3] != "0"


def clocks(path):
    """Median SM clock (MHz) and power (W) of the samples taken while training ran (power above
    40 % of the run's highest: setup, compilation and evaluation draw far less), or None."""
    if not os.path.exists(path):
        return None
    rows = []
    for line in open(path):
        try:
            mhz, watts = (float(v) for v in line.split(","))
            rows.append((mhz, watts))
        except ValueError:
            continue
    if not rows:
        return None
    top = max(w for _, w in rows)
    busy = [r for r in rows if r[1] >= 0.4 * top]
    return statistics.median(m for m, _ in busy), statistics.median(w for _, w in busy), len(busy)


def clockLine(who, path):
    c = clocks(path)
    if c:
        print(f"{who}: while training, SM clock {c[0]:.0f} MHz, power {c[1]:.0f} W (median of {c[2]} samples)")
recs = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
steps = [r for r in recs if r["type"] == "step"]
mem = [r for r in recs if r["type"] == "memory"][0]
timed = steps[1:] or steps  # after the first interval (warm-up), where there is more than one
ours = statistics.median(r["tokens_per_s"] for r in timed)
mfu = statistics.median(r["mfu"] for r in timed)
print(f"{name}: {ours:,.0f} tokens/s, MFU {100*mfu:.1f}%, allocator peak {mem['allocator_peak_bytes'][0]/2**30:.1f} GiB")
clockLine(name, f"{out}/{name}.clocks")
if not ref:
    sys.exit(0)
ref = json.loads(open(f"{out}/pytorch.log").read().strip().splitlines()[-1])
print(f"pytorch  : {ref['tokens_per_s']:,.0f} tokens/s, MFU {100*ref['mfu']:.1f}%, peak {ref['peak_mem_gib']:.1f} GiB ({ref['impl']}, torch {ref['torch']})")
clockLine("pytorch  ", f"{out}/pytorch.clocks")
print(f"ratio meshtrain/pytorch tokens/s: {ours/ref['tokens_per_s']:.3f}")
PY
