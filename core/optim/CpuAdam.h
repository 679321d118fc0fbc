#pragma once
// The CPU AdamW of the host optimizer and of ZeRO-Offload (sharding/ShardedOffload.cpp): one fused,
// streaming pass over a flat f32 shard that reads p, g, m, v and writes p, m, v and, optionally,
// the bf16 copy of p that the offload uploads for the all-gathers (DeepSpeed's CPU-Adam in
// spirit). Per element, in f32, in this order (PyTorch's AdamW, core/optim/Optimizer.h):
//
//   g = g·gradScale;  q = p·(1 - lr·wd);  m = b1·m + (1-b1)·g;  v = b2·v + ((1-b2)·g)·g
//   p = q - s·(m / (sqrt(v) / c2 + eps)),  s = lr / (1 - b1^t),  c2 = sqrt(1 - b2^t)  (from double)
//   copy = bf16(p), round to nearest even, NaN a quiet NaN (BFloat16::fromFloat)
//
// Every variant does exactly these IEEE operations (SIMD sqrt and division are correctly rounded
// too) and the file is compiled without FMA contraction, so all variants and thread counts give
// bitwise the scalar reference's results; a fused multiply-add would buy nothing here, the pass is
// bound by memory bandwidth: 28 bytes per element with bf16 gradients, 30 with f32 (p, m, v read
// and written, g read, the copy written), against 32 plus a separate 6-byte packing pass before.
//
// Variants, chosen at run time (the binary runs on any x86-64): avx512 (AVX-512F, 16 lanes), avx2
// (AVX2, 8 lanes), scalar (the reference loop, also the only one on other architectures).
// MT_CPU_ADAM forces one (core/EnvParams).

#include <cstdint>

#include "core/DType.h"
#include "core/EnumTable.h"

namespace mt {

enum class CpuAdamIsa { kScalar, kAvx2, kAvx512 };
const EnumTable<CpuAdamIsa>& cpuAdamIsas();  // "scalar", "avx2", "avx512"
inline const char* cpuAdamIsaName(CpuAdamIsa isa) {
  return enumName(cpuAdamIsas(), isa);
}

// Whether this CPU (and build) can run the variant.
bool cpuAdamSupported(CpuAdamIsa isa);
CpuAdamIsa bestCpuAdamIsa();
// MT_CPU_ADAM: "auto" (default) = bestCpuAdamIsa(), else the named variant. ConfigError naming the
// variable and the value when it is unknown or this CPU cannot run it.
CpuAdamIsa cpuAdamIsaFromEnv();

struct AdamwHyper {
  float lr = 0.f, weightDecay = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int64_t step = 1;  // 1-based, for the bias corrections
  // g is read as g·gradScale (in f32; x·1 is exact, so 1 changes nothing): a gradient clip's
  // factor applied in this pass instead of a read-modify-write pass of its own (ZeRO-Offload).
  float gradScale = 1.f;
};

// n elements each; g is f32 or bf16 (gBf16); copy may be null (no bf16 copy written). No alignment
// needed. The spans must not overlap, except that nothing else is read or written.
struct AdamwSpans {
  float* p = nullptr;
  const void* g = nullptr;
  bool gBf16 = false;
  float* m = nullptr;
  float* v = nullptr;
  BFloat16* copy = nullptr;
  int64_t n = 0;
};

// One AdamW step with `isa` (InternalError if this CPU cannot run it), OpenMP over the calling
// thread's team: each thread one contiguous range (whole cache lines), so every thread streams.
void cpuAdamw(const AdamwSpans& s, const AdamwHyper& h, CpuAdamIsa isa);

}  // namespace mt
