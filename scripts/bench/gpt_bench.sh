#!/usr/bin/env bash
# GPT-2 124M (d12) at B=64 T=1024 bf16 on one GPU, meshtrain and the PyTorch reference
# (torch.compile, bf16 autocast, flash SDPA, fused AdamW) in ONE run, then the ratio.
# On the device tool: bash scripts/device/run_on_device.sh exec bash scripts/bench/gpt_bench.sh
# Environment: TRAINER (default dist/bin/trainer or build/bin/trainer), STEPS (50), OUT (results).
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer="${TRAINER:-$( [[ -x dist/bin/trainer ]] && echo dist/bin/trainer || echo build/bin/trainer )}"
out="${OUT:-/tmp/gpt_bench}"
steps="${STEPS:-50}"
mkdir -p "$out" datasets
tokens=datasets/bench_tokens.h5
if [[ ! -f $tokens ]]; then
  # Random GPT-2 token ids: throughput does not depend on what the tokens say.
  python3 -c "import numpy as np; np.save('/tmp/bench_tokens.npy', np.random.default_rng(0).integers(0, 50257, 64*1025*($steps+5), dtype=np.int64))"
  python3 scripts/data/text_to_tokens --npy /tmp/bench_tokens.npy --vocab 50257 --test-fraction 0.01 --out $tokens
fi
echo "== meshtrain"
"$trainer" --config configs/gpt_d12.ini --data.path=$tokens --train.max_steps="$steps" --run.dir="$out" \
  --run.name=meshtrain 2>&1 | tee "$out/meshtrain.log" | grep -E "step [0-9]+/|memory|final|error" || true
echo "== pytorch"
python3 scripts/bench/gpt_reference.py --tokens $tokens --steps "$steps" 2>&1 | tee "$out/pytorch.log" | tail -1
python3 - "$out" <<'PY'
import json, sys, statistics
out = sys.argv[1]
recs = [json.loads(l) for l in open(f"{out}/meshtrain/metrics.jsonl")]
steps = [r for r in recs if r["type"] == "step"]
mem = [r for r in recs if r["type"] == "memory"][0]
ours = statistics.median(r["tokens_per_s"] for r in steps[1:])  # after the first interval (warm-up)
mfu = statistics.median(r["mfu"] for r in steps[1:])
ref = json.loads(open(f"{out}/pytorch.log").read().strip().splitlines()[-1])
print(f"meshtrain: {ours:,.0f} tokens/s, MFU {100*mfu:.1f}%, allocator peak {mem['allocator_peak_bytes'][0]/2**30:.1f} GiB")
print(f"pytorch  : {ref['tokens_per_s']:,.0f} tokens/s, MFU {100*ref['mfu']:.1f}%, peak {ref['peak_mem_gib']:.1f} GiB ({ref['impl']}, torch {ref['torch']})")
print(f"ratio meshtrain/pytorch tokens/s: {ours/ref['tokens_per_s']:.3f}")
PY
