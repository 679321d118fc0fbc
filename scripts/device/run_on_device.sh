#!/usr/bin/env bash
# Runs on the device machine over the carried dist/ (see build_for_device.sh):
#   bash scripts/device/run_on_device.sh probe|gpu-tests|attention|fp8|fp8-speed|nccl-ranks|nccl-sanitizer|sharding-scale|largest|f16-gap|onnx-gpt|bench [args]
# Results go to $OUT (when set) as logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/mt-out}"
mkdir -p "$out" dist/active-lib
if [[ -f dist/binaries.tar.xz ]]; then  # build_for_device.sh's binaries and libraries
  rm -rf dist/bin dist/lib
  tar -C dist -xJf dist/binaries.tar.xz
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Unpack only the fallback libraries the system lacks (twice: fallbacks may need fallbacks).
export LD_LIBRARY_PATH="$PWD/dist/active-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for pass in 1 2; do
  for b in dist/bin/* dist/lib/*.so dist/active-lib/*; do
    [[ -e "$b" ]] && ldd "$b" 2>/dev/null | awk '/not found/ {print $1}'
  done | sort -u | while read -r missing; do
    if [[ -f "dist/fallback-lib/$missing.xz" ]]; then
      python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
        "dist/fallback-lib/$missing.xz" "dist/active-lib/$missing"
      echo "using bundled $missing"
    fi
  done
done
if [[ ! -f dist/fashion_mnist.h5 ]]; then
  python3 scripts/data/fashion_mnist_to_hdf5 --src dist/fashion-idx --out dist/fashion_mnist.h5 >/dev/null
fi
export TRAINER="$PWD/dist/bin/trainer" FASHION_H5="$PWD/dist/fashion_mnist.h5" SOURCE_DIR="$PWD"
export PARITY_REF="$PWD/dist/parity_ref.h5"
what="${1:-probe}"
shift || true
case "$what" in
  probe)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    ls dist/active-lib
    for b in dist/bin/trainer dist/lib/*.so; do ldd "$b" | grep -E "not found" && echo "MISSING in $b"; done
    dist/bin/trainer --devices
    ;;
  gpu-tests)
    # Most telling first: device time is short, and what ran before a limit still comes back.
    status=0
    for t in test_gpu_parity test_cudnn_attention test_cuda_core test_tma_wait test_nccl test_gpu_compression test_gpu_feed; do
      echo "=== $t"
      dist/bin/$t 2>&1 | tee "$out/$t.log" | grep -E "OK|FAILED|PASSED|worst|GPU tests on" || true
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
    echo "=== flash_attention"
    PYTHONUNBUFFERED=1 python3 tests/models/test_flash_attention.py 2>&1 | tee "$out/flash_attention.log" |
      grep -E "FAIL|^OK|^Ran|Error" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    echo "=== gpu_training"
    g=GpuTraining
    PYTHONUNBUFFERED=1 python3 tests/launch/test_gpu_training.py -v $g.test_fashion_cnn_accuracy \
      $g.test_one_rank_nccl_matches_cpu $g.test_one_rank_nccl_hierarchical_rails \
      $g.test_two_rank_mpi_backend_on_one_gpu_matches_cpu \
      $g.test_gpu_local_matches_cpu $g.test_f16_loss_scaling_trains $g.test_f16_forced_overflow_is_reported $g.test_data_feeds_match_cpu \
      $g.test_gpu_compression_trains $g.test_offload_pipeline_matches_cpu $g.test_partial_offload_matches_cpu_and_resumes \
      $g.test_delayed_update_trains \
      $g.test_divergence_stops_with_exit_4 2>&1 | tee "$out/gpu_training.log" | tail -25
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    exit $status
    ;;
  attention)
    # Attention backends (issue 33): cuDNN's fused attention through our graphs against float64 and
    # our flash kernels (C++ test, every line says which backend ran, its errors and times), then
    # attention_bench: ours, cuDNN through us and PyTorch SDPA (default and forced) at head dims 64
    # and 128, T = 512..4096, after checking the cuDNN backend over the lab's cases. Arguments go
    # to attention_bench (e.g. --shapes 64x1024x12x64 --reps 10).
    status=0
    echo "=== test_cudnn_attention"
    dist/bin/test_cudnn_attention 2>&1 | tee "$out/test_cudnn_attention.log" |
      grep -E "OK \]|FAILED|PASSED|cudnn|flash|layer|gpt|model.attention|GPU tests on|Failure|Expected|Which" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    echo "=== attention_bench"
    PYTHONUNBUFFERED=1 python3 scripts/bench/attention_bench --check-cudnn --reps "${REPS:-20}" \
      --json "$out/attention_bench.json" "$@" 2>&1 | tee "$out/attention_bench.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    exit $status
    ;;
  fp8)
    # FP8 (issue 35), one call of a few minutes: the casts, scale kernels and FP8 cuBLASLt GEMM
    # against the CPU emulation (CudaFp8.*: every f32 through the intrinsic, codes bitwise), the
    # GPT FP8 training tests when the build has them, then fp8_gemm_bench at every GPT width (FP8
    # against bf16 TFLOP/s; arguments go to the bench, e.g. --widths 768 --reps 10).
    status=0
    echo "=== test_cuda_core CudaFp8.*"
    timeout 200 dist/bin/test_cuda_core --gtest_filter='CudaFp8.*' 2>&1 | tee "$out/test_cuda_fp8.log" |
      grep -E "OK \]|FAILED|PASSED|fp8 gemm|Failure|mismatch|Expected|Which|GPU tests on" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    if [[ -x dist/bin/test_gpu_parity ]]; then
      echo "=== test_gpu_parity *Fp8*"
      timeout 120 dist/bin/test_gpu_parity --gtest_filter='*Fp8*' 2>&1 | tee "$out/test_gpu_parity_fp8.log" |
        grep -E "OK \]|FAILED|PASSED|fp8|Failure|Expected|Which" || true
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    fi
    echo "=== fp8_gemm_bench"
    timeout 240 dist/bin/fp8_gemm_bench "$@" 2>&1 | tee "$out/fp8_gemm_bench.log" | grep -v '^{'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    exit $status
    ;;
  nccl-ranks)
    # Several NCCL ranks on the one GPU (MT_NCCL_SHARE_GPU_FOR_TESTS: each rank its own NCCL host
    # over sockets; testing only, timings are not throughput): the backend's own tests with 2 and
    # 4 ranks, then every trainer path and fault (tests/launch/test_nccl_ranks.py). Arguments:
    # unittest names to run only those (e.g. NcclRanks.test_sharded), or "cxx" for the C++ part only.
    export MT_NCCL_SHARE_GPU_FOR_TESTS=1
    status=0
    for np in 2 4; do
      echo "=== test_nccl_ranks -np $np"
      timeout 300 mpirun -np $np --bind-to none dist/bin/test_nccl_ranks 2>&1 | tee "$out/test_nccl_ranks_np$np.log" |
        grep -E "OK \]|FAILED|PASSED|rank [0-9]:|Failure|error" || true
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
    [[ "${1:-}" == "cxx" ]] && exit $status
    echo "=== test_nccl_ranks.py"
    PYTHONUNBUFFERED=1 python3 tests/launch/test_nccl_ranks.py -v "$@" 2>&1 | tee "$out/nccl_ranks.log" |
      grep -E "^test_|ok$|FAIL|ERROR|worst|ended|Error|^Ran|^OK" || true
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    exit $status
    ;;
  fp8-speed)
    # Issue 35's speed table, one call of about five minutes: GPT PRESETS (default d24 d48) at
    # BATCH (default 16) x 1024 in bf16 and in FP8 (delayed scaling, all four block Linears), then
    # PyTorch torch.compile bf16 once per preset, each row tokens/s, MFU and allocator peak
    # (scripts/bench/gpt_bench.sh; STEPS as there). GELU_LEVELS (default 3): one FP8 row per
    # MT_FP8_GELU level, e.g. "0 3" for the A/B of the GELU inside the casts against its kernels.
    status=0
    for preset in ${PRESETS:-d24 d48}; do
      read -r -a levels <<<"${GELU_LEVELS:-3}"
      for run in bf16 "${levels[@]}"; do
        p=$([[ $run == bf16 ]] && echo bf16 || echo fp8)
        name="$preset-$p$([[ $p == fp8 && ${#levels[@]} -gt 1 ]] && echo "-gelu$run")"
        MT_FP8_GELU=$([[ $p == fp8 ]] && echo "$run" || echo 3) \
          REF=$([[ $run == "${levels[-1]}" && $p == fp8 ]] && echo 1 || echo 0) NAME="$name" PRESET="$preset" \
          BATCH="${BATCH:-16}" STEPS="${STEPS:-20}" OUT="$out/gpt" ARGS="--train.precision=$p" \
          bash scripts/bench/gpt_bench.sh 2>&1 | grep -vE "^step|^\["
        [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      done
    done
    exit $status
    ;;
  sharding-scale)
    # Models past one GPU (issue 32): GPT d48 (1.56B) at batch 16 x 1024 with each activation
    # checkpointing mode against PyTorch torch.compile (once), then which presets full_shard trains
    # under a 16 GiB cap with blocks checkpointing, without and with CPU offload.
    status=0
    for mode in none blocks selective; do
      REF=$([[ $mode == none ]] && echo 1 || echo 0) NAME="d48-$mode" PRESET=d48 BATCH=16 STEPS="${STEPS:-20}" \
        OUT="$out/gpt" ARGS="--train.activation_checkpointing=$mode" bash scripts/bench/gpt_bench.sh || status=1
    done
    python3 scripts/bench/shard_bench --tokens datasets/bench_tokens.h5 --largest-under-cap 16384 \
      --cap-models "${CAP_MODELS:-d36,d48}" --batch-per-rank 4 --steps 5 \
      --extra=--train.activation_checkpointing=blocks 2>&1 | tee "$out/largest_under_cap.log" | grep -v '^{' || status=1
    exit $status
    ;;
  largest)
    # Issue 32: the offload path's correctness on the GPU, then the largest presets one rank trains
    # with full_shard + offload + blocks (LARGEST, LARGEST_CAPS MiB, 0 = the whole card), each with
    # `trainer plan`'s prediction, then offload speed at d24 16 x 1024 (OFFLOAD_SPEED=0 skips it).
    status=0
    g=GpuTraining
    PYTHONUNBUFFERED=1 python3 tests/launch/test_gpu_training.py -v $g.test_offload_pipeline_matches_cpu \
      $g.test_delayed_update_trains $g.test_one_rank_nccl_matches_cpu 2>&1 | tee "$out/gpu_training_offload.log" | tail -8
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    mkdir -p datasets
    if [[ ! -f datasets/bench_tokens.h5 ]]; then  # random GPT-2 ids, as gpt_bench.sh makes them
      python3 -c "import numpy as np; np.save('/tmp/bench_tokens.npy', np.random.default_rng(0).integers(0, 50257, 128*1025*25, dtype=np.int64))"
      python3 scripts/data/text_to_tokens --npy /tmp/bench_tokens.npy --vocab 50257 --test-fraction 0.01 --out datasets/bench_tokens.h5
    fi
    for m in $(echo "${LARGEST:-d48,gpt3-2.7b,gpt3-6.7b}" | tr , ' '); do
      dist/bin/trainer plan --config configs/gpt_d12.ini --model.gpt_preset=$m --data.path=datasets/bench_tokens.h5 \
        --train.device=cuda --train.batch_size="${BATCH_PER_RANK:-4}" --sharding.strategy=full_shard \
        --sharding.offload=cpu --train.activation_checkpointing=blocks --gpu-memory 16 2>&1 | tee "$out/plan_$m.log" |
        grep -E "total|fits"
    done
    timeout 480 python3 scripts/bench/shard_bench --tokens datasets/bench_tokens.h5 --largest "${LARGEST:-d48,gpt3-2.7b,gpt3-6.7b}" \
      --largest-caps "${LARGEST_CAPS:-16384,0}" --batch-per-rank "${BATCH_PER_RANK:-4}" --steps "${STEPS:-10}" 2>&1 |
      tee "$out/largest.log" | grep -v '^{' || status=1
    if [[ "${OFFLOAD_SPEED:-1}" != 0 ]]; then
      python3 scripts/bench/shard_bench --tokens datasets/bench_tokens.h5 --np 1 --offload-speed d24 --batch-per-rank 16 \
        --steps 8 2>&1 | tee "$out/offload_speed.log" | grep -v '^{' || status=1
    fi
    exit $status
    ;;
  nccl-sanitizer)
    # The multi-rank NCCL path under compute-sanitizer's memcheck (2 ranks sharing the GPU): the
    # backend's collectives, splits, hierarchy and fingerprint, then 10 data-parallel and 10
    # full_shard training steps. Slow: correctness only.
    export MT_NCCL_SHARE_GPU_FOR_TESTS=1
    status=0
    # NCCL probes kernels it has no sm_90 image for (cudaFuncGetAttributes: error 209, 40 of them in
    # a first run, 2026-12-04): API errors it handles itself, so only memory errors are reported.
    cs="compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 50"
    echo "=== test_nccl_ranks -np 2 under memcheck"
    timeout 300 mpirun -np 2 --bind-to none $cs dist/bin/test_nccl_ranks \
      --gtest_filter='NcclRanks.Collectives*:NcclRanks.Hier*:NcclRanks.Splits*:NcclRanks.Fingerprint*:NcclRanks.Thousands*' \
      >"$out/sanitizer_nccl_ranks.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|OK \]|FAILED" "$out/sanitizer_nccl_ranks.log" | sort | uniq -c
    for strategy in no_shard full_shard; do
      echo "=== trainer -np 2 $strategy under memcheck"
      timeout 240 mpirun -np 2 --bind-to none $cs dist/bin/trainer --data.path="$FASHION_H5" --model.type=cnn \
        --model.conv_channels=8,16 --model.fc=32 --train.batch_size=32 --train.max_steps=10 --train.device=cuda \
        --dist.backend=nccl --sharding.strategy=$strategy --run.dir=/tmp/mt-sanitizer --run.name=$strategy \
        --checkpoint.at_exit=false >"$out/sanitizer_$strategy.log" 2>&1 || status=1
      grep -E "ERROR SUMMARY|final test" "$out/sanitizer_$strategy.log"
    done
    exit $status
    ;;
  f16-gap)
    # Issue 35: GPT d12 bf16 vs f16 (B=32 x 1024, 800 steps, cosine lr 6e-4, seeds 1 and 2, the
    # same data order) on a byte-level corpus of this machine's Python sources; prints each final
    # test loss, the gap and f16's loss scale and skipped steps (scripts/bench/f16_gap.sh; STEPS,
    # SEEDS, BATCH, PRECISIONS, ARGS as there). About 4.5 minutes on an H200.
    OUT="$out" bash scripts/bench/f16_gap.sh
    ;;
  onnx-gpt)
    # Issue 34: a GPT d12 trained here in bf16 on real text (byte-level, STEPS steps), exported as
    # ONNX and run by the Python onnxruntime (its CUDA provider when it has one), against the
    # trainer's own forward on the GPU in bf16 (what it trains with) and in f32, and on the CPU.
    status=0
    mkdir -p datasets
    scripts/data/python_source_corpus datasets/python_bytes.h5 >/dev/null || exit 2
    rm -rf /tmp/mt-onnx-gpt
    dist/bin/trainer --config configs/gpt_d12.ini --data.path=datasets/python_bytes.h5 --model.vocab_size=256 \
      --model.padded_vocab=256 --train.batch_size=16 --train.max_steps="${STEPS:-300}" --run.log_interval=100 \
      --train.eval_batches=10 --checkpoint.at_exit=true --run.dir=/tmp/mt-onnx-gpt --run.name=d12 2>&1 |
      tee "$out/onnx_gpt_train.log" | grep -E "step [0-9]+/|final|rror" || true
    ckpt=$(ls -d /tmp/mt-onnx-gpt/d12/checkpoints/step_* 2>/dev/null | grep -v tmp- | tail -1)
    [[ -n "$ckpt" ]] || { echo "onnx-gpt: no checkpoint"; exit 1; }
    for run in "cuda bf16 0.5" "cuda f32 1e-3" "cpu f32 1e-4"; do
      read -r device precision tol <<<"$run"
      echo "=== trainer $device $precision against ONNX Runtime (tolerance $tol)"
      python3 scripts/onnx/check_parity --checkpoint "$ckpt" --trainer dist/bin/trainer --runtime python \
        --device "$device" --precision "$precision" --count "${COUNT:-8}" --seq-len 64 1024 --tol "$tol" \
        --workdir "/tmp/mt-onnx-gpt/${device}_$precision" 2>&1 | tee -a "$out/onnx_gpt.log" || status=1
    done
    exit $status
    ;;
  *)
    "$@"
    ;;
esac
