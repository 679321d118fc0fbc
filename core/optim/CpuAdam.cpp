#include "core/optim/CpuAdam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/Check.h"
#include "core/EnvParams.h"

#if defined(__x86_64__) || defined(__i386__)
#define MT_CPU_ADAM_X86 1
#include <immintrin.h>
// Per-function targets: only the variant's own functions use the wider instructions, the rest of
// the binary stays baseline x86-64 (cpuAdamSupported decides at run time).
#define MT_TARGET_AVX512 __attribute__((target("avx512f")))
#define MT_TARGET_AVX2 __attribute__((target("avx2")))
#endif

namespace mt {

const EnumTable<CpuAdamIsa>& cpuAdamIsas() {
  static const EnumTable<CpuAdamIsa> kTable = {
      {CpuAdamIsa::kScalar, "scalar", "the reference loop (compiler-vectorized for the baseline ISA)"},
      {CpuAdamIsa::kAvx2, "avx2", "8 lanes, AVX2"},
      {CpuAdamIsa::kAvx512, "avx512", "16 lanes, AVX-512F"},
  };
  return kTable;
}

bool cpuAdamSupported(CpuAdamIsa isa) {
  switch (isa) {
    case CpuAdamIsa::kScalar:
      return true;
#ifdef MT_CPU_ADAM_X86
    // libgcc's check includes the OS saving the wider registers (XCR0).
    case CpuAdamIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case CpuAdamIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

CpuAdamIsa bestCpuAdamIsa() {
  if (cpuAdamSupported(CpuAdamIsa::kAvx512)) return CpuAdamIsa::kAvx512;
  if (cpuAdamSupported(CpuAdamIsa::kAvx2)) return CpuAdamIsa::kAvx2;
  return CpuAdamIsa::kScalar;
}

CpuAdamIsa cpuAdamIsaFromEnv() {
  const std::string s = envString(EnvParam::kCpuAdam);
  if (s == "auto") return bestCpuAdamIsa();
  CpuAdamIsa isa = CpuAdamIsa::kScalar;
  MT_REQUIRE(parseEnum(cpuAdamIsas(), s, &isa), ConfigError, "environment variable MT_CPU_ADAM='", s,
             "' is not one of auto, scalar, avx2, avx512");
  MT_REQUIRE(cpuAdamSupported(isa), ConfigError, "environment variable MT_CPU_ADAM='", s,
             "': this CPU cannot run it (the best it runs: ", cpuAdamIsaName(bestCpuAdamIsa()), ")");
  return isa;
}

namespace {

// The step's scalars, computed once as the reference always has: the bias corrections in double,
// as PyTorch computes them in Python floats.
struct Consts {
  float decay, b1, omb1, b2, omb2, stepSize, bc2Sqrt, eps, gScale;
};

Consts constsOf(const AdamwHyper& h) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  Consts c;
  c.decay = 1.f - h.lr * h.weightDecay;
  c.b1 = h.beta1;
  c.omb1 = 1.f - h.beta1;
  c.b2 = h.beta2;
  c.omb2 = 1.f - h.beta2;
  c.stepSize = static_cast<float>(static_cast<double>(h.lr) / bc1);
  c.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = h.eps;
  c.gScale = h.gradScale;
  return c;
}

inline float gradOf(const float* g, int64_t i) {
  return g[i];
}
inline float gradOf(const BFloat16* g, int64_t i) {
  return static_cast<float>(g[i]);
}

// The scalar reference (and every variant's tail).
template <typename G, bool kCopy>
void scalarRange(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo, int64_t hi,
                 const Consts& c) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    float pi = p[i] * c.decay;
    const float gi = gradOf(g, i) * c.gScale;
    const float mi = c.b1 * m[i] + c.omb1 * gi;
    const float vi = c.b2 * v[i] + c.omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= c.stepSize * (mi / (std::sqrt(vi) / c.bc2Sqrt + c.eps));
    p[i] = pi;
    if (kCopy) copy[i].bits = BFloat16::fromFloat(pi);
  }
}

#ifdef MT_CPU_ADAM_X86

// ---- AVX-512F: 16 lanes ----

MT_TARGET_AVX512 inline __m512 loadGrad(const float* g) {
  return _mm512_loadu_ps(g);
}
MT_TARGET_AVX512 inline __m512 loadGrad(const BFloat16* g) {  // bf16 -> f32 is exact: bits << 16
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// BFloat16::fromFloat on 16 lanes: (u + 0x7fff + lsb) >> 16, NaN -> (u >> 16) | 0x40.
MT_TARGET_AVX512 inline __m256i toBf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

template <typename G, bool kCopy>
MT_TARGET_AVX512 void avx512Range(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo,
                                  int64_t hi, const Consts& c) {
  const __m512 decay = _mm512_set1_ps(c.decay), b1 = _mm512_set1_ps(c.b1), omb1 = _mm512_set1_ps(c.omb1),
               b2 = _mm512_set1_ps(c.b2), omb2 = _mm512_set1_ps(c.omb2),
               stepSize = _mm512_set1_ps(c.stepSize), bc2Sqrt = _mm512_set1_ps(c.bc2Sqrt),
               eps = _mm512_set1_ps(c.eps), gScale = _mm512_set1_ps(c.gScale);
  int64_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 gi = _mm512_mul_ps(loadGrad(g + i), gScale);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gi));
    const __m512 vi =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2Sqrt), eps);
    pi = _mm512_sub_ps(pi, _mm512_mul_ps(stepSize, _mm512_div_ps(mi, den)));
    _mm512_storeu_ps(p + i, pi);
    if (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(copy + i), toBf16(pi));
  }
  scalarRange<G, kCopy>(p, g, m, v, copy, i, hi, c);
}

// ---- AVX2: 8 lanes ----

MT_TARGET_AVX2 inline __m256 loadGrad8(const float* g) {
  return _mm256_loadu_ps(g);
}
MT_TARGET_AVX2 inline __m256 loadGrad8(const BFloat16* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

MT_TARGET_AVX2 inline __m128i toBf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  // |u| <= 0x7fffffff: the signed compare is the unsigned one.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // Every lane <= 0xffff: the unsigned saturating pack only narrows, in lane order.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

template <typename G, bool kCopy>
MT_TARGET_AVX2 void avx2Range(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo,
                              int64_t hi, const Consts& c) {
  const __m256 decay = _mm256_set1_ps(c.decay), b1 = _mm256_set1_ps(c.b1), omb1 = _mm256_set1_ps(c.omb1),
               b2 = _mm256_set1_ps(c.b2), omb2 = _mm256_set1_ps(c.omb2),
               stepSize = _mm256_set1_ps(c.stepSize), bc2Sqrt = _mm256_set1_ps(c.bc2Sqrt),
               eps = _mm256_set1_ps(c.eps), gScale = _mm256_set1_ps(c.gScale);
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 gi = _mm256_mul_ps(loadGrad8(g + i), gScale);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gi));
    const __m256 vi =
        _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2Sqrt), eps);
    pi = _mm256_sub_ps(pi, _mm256_mul_ps(stepSize, _mm256_div_ps(mi, den)));
    _mm256_storeu_ps(p + i, pi);
    if (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(copy + i), toBf16x8(pi));
  }
  scalarRange<G, kCopy>(p, g, m, v, copy, i, hi, c);
}

#endif  // MT_CPU_ADAM_X86

using RangeFn = void (*)(float*, const void*, float*, float*, BFloat16*, int64_t, int64_t, const Consts&);

template <template <typename, bool> class K, typename G, bool kCopy>
void callRange(float* p, const void* g, float* m, float* v, BFloat16* copy, int64_t lo, int64_t hi,
               const Consts& c) {
  K<G, kCopy>::run(p, static_cast<const G*>(g), m, v, copy, lo, hi, c);
}

template <typename G, bool kCopy>
struct ScalarK {
  static void run(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo, int64_t hi,
                  const Consts& c) {
    scalarRange<G, kCopy>(p, g, m, v, copy, lo, hi, c);
  }
};
#ifdef MT_CPU_ADAM_X86
template <typename G, bool kCopy>
struct Avx2K {
  static void run(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo, int64_t hi,
                  const Consts& c) {
    avx2Range<G, kCopy>(p, g, m, v, copy, lo, hi, c);
  }
};
template <typename G, bool kCopy>
struct Avx512K {
  static void run(float* p, const G* g, float* m, float* v, BFloat16* copy, int64_t lo, int64_t hi,
                  const Consts& c) {
    avx512Range<G, kCopy>(p, g, m, v, copy, lo, hi, c);
  }
};
#endif

template <template <typename, bool> class K>
RangeFn pickFor(bool gBf16, bool copy) {
  if (gBf16) return copy ? &callRange<K, BFloat16, true> : &callRange<K, BFloat16, false>;
  return copy ? &callRange<K, float, true> : &callRange<K, float, false>;
}

RangeFn pick(CpuAdamIsa isa, bool gBf16, bool copy) {
#ifdef MT_CPU_ADAM_X86
  if (isa == CpuAdamIsa::kAvx512) return pickFor<Avx512K>(gBf16, copy);
  if (isa == CpuAdamIsa::kAvx2) return pickFor<Avx2K>(gBf16, copy);
#endif
  (void)isa;
  return pickFor<ScalarK>(gBf16, copy);
}

// Threads split the span at multiples of 64 elements (whole 64-byte lines of every array when the
// span starts on one), and only when each gets enough to stream: below that a thread's start costs
// more than its share of the pass.
constexpr int64_t kSplitQuantum = 64;
constexpr int64_t kMinPerThread = 1 << 15;

}  // namespace

void cpuAdamw(const AdamwSpans& s, const AdamwHyper& h, CpuAdamIsa isa) {
  MT_CHECK(cpuAdamSupported(isa), "cpu adamw: this CPU cannot run the ", cpuAdamIsaName(isa), " variant");
  MT_CHECK(s.n >= 0 && (s.n == 0 || (s.p && s.g && s.m && s.v)), "cpu adamw: spans of ", s.n, " elements");
  if (s.n == 0) return;
  const RangeFn fn = pick(isa, s.gBf16, s.copy != nullptr);
  const Consts c = constsOf(h);
  const int threads =
      static_cast<int>(std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, s.n / kMinPerThread)));
  if (threads <= 1) {
    fn(s.p, s.g, s.m, s.v, s.copy, 0, s.n, c);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t per = ((s.n + team - 1) / team + kSplitQuantum - 1) / kSplitQuantum * kSplitQuantum;
    const int64_t lo = std::min(s.n, t * per), hi = std::min(s.n, lo + per);
    if (lo < hi) fn(s.p, s.g, s.m, s.v, s.copy, lo, hi, c);
  }
}

}  // namespace mt
