#!/usr/bin/env bash
# Issue 35: does f16 (with the dynamic loss scaler) learn as well as bf16? GPT d12 on a real-text,
# byte-level corpus (the machine's Python sources: scripts/data/python_source_corpus), B=32 x 1024,
# cosine lr 6e-4, bf16 then f16 for each seed with the same seed (same init, same data order), then
# each run's final test loss, the f16 - bf16 gap per seed, and f16's final loss scale and skipped
# steps (metrics.jsonl's step records; the log's "step skipped" warnings for older builds).
# The same runs compare FP8 with bf16 (issue 35's convergence check): PRECISIONS="bf16 fp8"
# STEPS=2000, ARGS=--model.gpt_preset=d24 for d24; every precision's gap to bf16 is printed.
# On the device tool: bash scripts/device/run_on_device.sh f16-gap
# Environment: TRAINER (dist/bin/trainer or build/bin/trainer), OUT (results), STEPS (800), SEEDS
# ("1 2"), BATCH (32), PRECISIONS ("bf16 f16"), CORPUS_MB (cap on the corpus, 64), ARGS (extra
# trainer overrides for every run), REF (1: PyTorch's bf16 and f16 runs of the same recipe beside
# each seed's, scripts/bench/f16_gap_reference.py — the control for the gap).
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer="${TRAINER:-$( [[ -x dist/bin/trainer ]] && echo dist/bin/trainer || echo build/bin/trainer )}"
out="${OUT:-/tmp/f16_gap}"
steps="${STEPS:-800}"
seeds="${SEEDS:-1 2}"
batch="${BATCH:-32}"
precisions="${PRECISIONS:-bf16 f16}"
mkdir -p "$out" datasets
tokens=datasets/python_bytes.h5
scripts/data/python_source_corpus $tokens
for seed in $seeds; do
  for p in $precisions; do
    name="$p-seed$seed"
    rm -rf "${out:?}/$name"
    echo "== $name"
    # shellcheck disable=SC2086  # ARGS is split into words on purpose
    "$trainer" --config configs/gpt_d12.ini --data.path=$tokens --model.vocab_size=256 --model.padded_vocab=256 \
      --train.batch_size="$batch" --train.max_steps="$steps" --train.precision="$p" --run.seed="$seed" \
      --schedule.warmup_steps=$((steps / 20)) --run.log_interval=50 --train.eval_batches=40 \
      --run.dir="$out" --run.name="$name" ${ARGS:-} 2>&1 | tee "$out/$name.log" |
      grep -E "step [0-9]+/[0-9]+ epoch|final|error" || true
    echo "$(grep -c "step skipped" "$out/$name.log" || true) step(s) skipped; first: $(grep -m3 -o "step [0-9]*: inf/nan.*" "$out/$name.log" | tr "\n" ";")"
    if [[ "${REF:-0}" != 0 && ( $p == bf16 || $p == f16 ) ]]; then  # PyTorch's own gap, the control
      echo "== pytorch $name"
      python3 scripts/bench/f16_gap_reference.py --tokens $tokens --precision "$p" --seed "$seed" --steps "$steps" \
        --batch "$batch" 2>"$out/pt-$name.log" | tee "$out/pt-$name.json"
    fi
  done
done
python3 - "$out" "$seeds" "$precisions" <<'PY'
import json, os, re, sys
out, seeds, precs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def final(name):
    path = f"{out}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        return None, {}
    recs = [json.loads(l) for l in open(path)]
    fin = [r for r in recs if r["type"] == "final"]
    steps = [r for r in recs if r["type"] == "step"]
    return (fin[-1]["test_loss"] if fin else None), (steps[-1] if steps else {})
gaps = []
for s in seeds:
    losses = {}
    for p in precs:
        name = f"{p}-seed{s}"
        loss, last = final(name)
        losses[p] = loss
        log = open(f"{out}/{name}.log").read() if os.path.exists(f"{out}/{name}.log") else ""
        skipped = last.get("skipped_steps", len(re.findall(r"step skipped", log)))
        scale = last.get("loss_scale")
        extra = f", loss scale {scale}, skipped steps {skipped}" if p == "f16" else ""
        print(f"seed {s} {p}: final test_loss {loss}{extra}")
    for p in precs:
        if p != "bf16" and losses.get(p) is not None and losses.get("bf16") is not None:
            gaps.append((p, losses[p] - losses["bf16"]))
            print(f"seed {s}: {p} - bf16 = {gaps[-1][1]:+.4f} nats")
pt_gaps = []
for s in seeds:  # REF=1: PyTorch's runs of the same recipe, corpus and seed
    pt = {}
    for p in ("bf16", "f16"):
        path = f"{out}/pt-{p}-seed{s}.json"
        if os.path.exists(path) and os.path.getsize(path) > 0:
            pt[p] = json.loads(open(path).read().strip().splitlines()[-1])
    if len(pt) == 2:
        g = pt["f16"]["test_loss"] - pt["bf16"]["test_loss"]
        pt_gaps.append(g)
        print(f"seed {s} PyTorch: bf16 {pt['bf16']['test_loss']:.4f}, f16 {pt['f16']['test_loss']:.4f} "
              f"(loss scale {pt['f16']['loss_scale']}, skipped {pt['f16']['skipped_steps']}): f16 - bf16 = {g:+.4f} nats")
def summary(label, values):  # mean and its standard error over seeds: one seed's gap is noisy
    if len(values) < 2:
        return
    m = sum(values) / len(values)
    se = (sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5
    print(f"{label}: mean gap {m:+.4f} nats, standard error {se:.4f} over {len(values)} seeds")
for p in sorted({p for p, _ in gaps}):
    worst = max((g for q, g in gaps if q == p), key=abs)
    print(f"{p}: worst gap {worst:+.4f} nats (acceptance: f16 within 0.01, fp8 within 0.02)")
    summary(p, [g for q, g in gaps if q == p])
summary("PyTorch f16", pt_gaps)
PY
