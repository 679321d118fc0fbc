#pragma once
// FP8 formats and per-tensor scaling (FP8 training, issue 35).
//
// Formats (OCP 8-bit floating point; CUDA's __NV_E4M3 and __NV_E5M2):
//   E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; S.1111.111 is
//                NaN, so the largest finite value is 1.75 * 2^8 = 448; normals down to 2^-6,
//                subnormals m/8 * 2^-6 down to 2^-9.
//   E5M2:        sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is inf
//                (m = 0) or NaN; largest finite 1.75 * 2^15 = 57344; normals down to 2^-14,
//                subnormals m/4 * 2^-14 down to 2^-16.
// fp8FromFloat is bit-identical to CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format) (the
// cvt.rn.satfinite instruction on sm_89+): round to nearest, ties to even mantissa; a magnitude
// that rounds past the largest finite value (infinity included) saturates to ±max; NaN becomes
// 0x7F in both formats (positive, all exponent and mantissa bits set); a magnitude at or below
// half the smallest subnormal becomes a zero of x's sign.
//
// Per-tensor scaling. A tensor x is stored as q = fp8(x * s) with one f32 scale s per tensor and
// read back as x ≈ q * sInv, sInv = 1 / s (the dequantization factor cuBLASLt's A/B scale
// pointers take). With amax = max_i |x_i| and fmax the format's largest finite value:
//     scaleFrom(amax) = fmax / amax / 2^margin   if amax is finite and > 0,
//                       the previous scale       otherwise (an all-zero or non-finite tensor).
// (Left-to-right f32 divisions, no fused operation, so the CPU and the GPU give the same bits.)
// Recipes:
//   current: s_t = scaleFrom(amax(x_t)), the amax of the tensor being cast (one reduction, then
//            the cast).
//   delayed: Transformer Engine's recipe. The step-t tensor is cast with
//            s_t = scaleFrom(max_{0<=i<L} h_i) over the amax history h of the previous L casts
//            (h_0 the newest), and its own amax is then pushed: h <- [amax(x_t), h_0, .., h_{L-2}].
//            The cast and the amax are one pass. The first cast of a state (no history yet) uses
//            current scaling, so no tensor is ever cast with an arbitrary initial scale.
// The whole per-tensor state is one f32 vector (Fp8State), the same layout on the CPU and the GPU,
// saved in checkpoints so a resumed run casts with exactly the scales the uninterrupted one would.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/EnumTable.h"
#include "core/Tensor.h"

#if defined(__CUDACC__)
#define MT_FP8_HD __host__ __device__
#else
#define MT_FP8_HD
#endif

namespace mt {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };
const EnumTable<Fp8Format>& fp8Formats();  // "e4m3", "e5m2"

enum class Fp8Recipe : uint8_t { kCurrent, kDelayed };
const EnumTable<Fp8Recipe>& fp8Recipes();  // "current", "delayed"

constexpr float kFp8E4M3Max = 448.f;
constexpr float kFp8E5M2Max = 57344.f;
constexpr uint8_t kFp8NaN = 0x7F;
MT_FP8_HD inline float fp8Max(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? kFp8E4M3Max : kFp8E5M2Max;
}

// The cast, as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f). Works on the f32 bits: the value is
// rounded in a format with f's mantissa width and an unbounded exponent, then saturated.
MT_FP8_HD inline uint8_t fp8FromFloat(float x, Fp8Format f) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kFp8NaN;
  const int mbits = f == Fp8Format::kE4M3 ? 3 : 2;
  const int bias = f == Fp8Format::kE4M3 ? 7 : 15;
  const uint8_t maxCode = f == Fp8Format::kE4M3 ? 0x7E : 0x7B;
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | maxCode);  // inf saturates
  const int e = static_cast<int>(a >> 23) - 127;                      // unbiased (f32 subnormals: -127)
  // Bits of the f32 significand dropped: those below the fp8 mantissa, more for fp8 subnormals.
  const int minNormalExp = 1 - bias;
  int drop = 23 - mbits + (e < minNormalExp ? minNormalExp - e : 0);
  if (drop > 25) return sign;  // below half the smallest subnormal (and f32 subnormals)
  const uint32_t sig = (a & 0x7fffffu) | (e > -127 ? 0x800000u : 0u);
  uint32_t q = sig >> drop;
  const uint32_t rem = sig & ((1u << drop) - 1u), half = 1u << (drop - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the next binade: still right
  // q counts units of 2^(max(e, minNormalExp) - mbits); code = biased exponent * 2^mbits + mantissa.
  uint32_t code;
  if (e < minNormalExp)
    code = q;  // subnormal (q == 2^mbits is the smallest normal, same encoding)
  else
    code = (static_cast<uint32_t>(e + bias) << mbits) + (q - (1u << mbits));
  if (code > maxCode) code = maxCode;
  return static_cast<uint8_t>(sign | code);
}

MT_FP8_HD inline float fp8ToFloat(uint8_t c, Fp8Format f) {
  const int mbits = f == Fp8Format::kE4M3 ? 3 : 2;
  const int bias = f == Fp8Format::kE4M3 ? 7 : 15;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c & 0x7fu) >> mbits, man = c & ((1u << mbits) - 1u);
  uint32_t u;
  if (f == Fp8Format::kE4M3 && (c & 0x7fu) == 0x7fu)
    u = 0x7fc00000u;
  else if (f == Fp8Format::kE5M2 && exp == 31)
    u = man ? 0x7fc00000u : 0x7f800000u;
  else if (exp != 0)
    u = ((exp - bias + 127) << 23) | (man << (23 - mbits));
  else {
    // subnormal: man * 2^(1 - bias - mbits), exact in f32
    float v = static_cast<float>(man);
    for (int i = 0; i < bias - 1 + mbits; ++i)
      v *= 0.5f;
    memcpy(&u, &v, 4);
  }
  u |= sign;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

// scaleFrom(amax) of the header comment: fmax / amax / 2^margin, or prev when amax is 0 or not
// finite. 2^margin is exact, so the second division rounds the same way everywhere.
MT_FP8_HD inline float fp8ScaleFrom(float amax, float prev, Fp8Format f, int margin) {
  if (!(amax > 0.f) || amax > 3.4028234663852886e38f) return prev;
  float s = fp8Max(f) / amax;
  float p = 1.f;
  for (int i = 0; i < margin; ++i)
    p *= 2.f;
  return s / p;
}

// max over the amax history h[0..L) (a NaN, once met, is the result: it keeps the previous scale).
MT_FP8_HD inline float fp8HistoryMax(const float* h, int L) {
  float m = 0.f;
  for (int i = 0; i < L; ++i)
    if (!(h[i] <= m) && m == m) m = h[i];
  return m;
}

struct Fp8Options {
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int historyLength = 16;  // delayed: amax values kept (L)
  int margin = 0;          // scale divided by 2^margin: headroom for growth between steps
};

// One tensor's scaling state: a f32 vector [scaleInv, scale, amax, h_0 .. h_{L-1}] on the device
// of the tensors it scales (element kScale is what the cast multiplies by, kScaleInv what the GEMM
// reads, kAmax the amax of the last tensor cast). The history is unused by the current recipe.
// scaleInv comes first so that its pointer, cuBLASLt's A/B scale pointer, has the allocation's
// alignment: with it 4 bytes into the vector, cublasLtMatmul refused all eight algorithms its
// heuristic (which sees no pointers) offered, NOT_SUPPORTED (H100, cuBLAS 13.1, 2026-12-05).
class Fp8State {
 public:
  static constexpr int kScaleInv = 0, kScale = 1, kAmax = 2, kHistory = 3;
  Fp8State() = default;
  Fp8State(Fp8Format format, const Fp8Options& options, Device device);
  Fp8Format format() const { return format_; }
  const Fp8Options& options() const { return options_; }
  Tensor& values() { return values_; }
  const Tensor& values() const { return values_; }
  // Device pointers into values() (for kernels and cuBLASLt's scale pointers).
  float* scalePtr() const { return values_.data<float>() + kScale; }
  float* scaleInvPtr() const { return values_.data<float>() + kScaleInv; }
  // Host copies (a device-to-host copy on CUDA: for tests and logs, not the training step).
  std::vector<float> read() const;
  void write(const std::vector<float>& v);
  // Moves the values to device d (a copy; nothing when they are there).
  void moveTo(Device d) {
    if (values_.device() != d) values_ = values_.to(d);
  }
  // Casts done with this state (host-side: decides the delayed recipe's first cast; checkpointed).
  int64_t casts() const { return casts_; }
  void setCasts(int64_t n) { casts_ = n; }
  // Two zeroed 32-bit words on values()'s device (made at the first call) for the CUDA cast that
  // updates the state in its own kernel (core/cuda/Fp8.cu): the amax being reduced and a count of
  // the blocks done. Every such cast leaves them zero. Not part of the state: not in values(), not
  // saved.
  Tensor& deviceScratch();

 private:
  int64_t casts_ = 0;
  Tensor scratch_;
  Fp8Format format_ = Fp8Format::kE4M3;
  Fp8Options options_;
  Tensor values_;
};

// The updates of a state vector v around a cast, one code for the CPU emulation and the CUDA
// kernels: the scale the cast multiplies by with its inverse (what the GEMMs read), and the cast's
// amax pushed onto the history of length L (h <- [amax, h_0, .., h_{L-2}]) and kept as the last amax.
MT_FP8_HD inline void fp8SetScale(float* v, float s) {
  v[Fp8State::kScale] = s;
  v[Fp8State::kScaleInv] = 1.f / s;
}
MT_FP8_HD inline void fp8PushAmax(float* v, int L, float amax) {
  for (int i = L - 1; i > 0; --i)
    v[Fp8State::kHistory + i] = v[Fp8State::kHistory + i - 1];
  if (L > 0) v[Fp8State::kHistory] = amax;
  v[Fp8State::kAmax] = amax;
}
// The scale before a cast: delayed, from the history's max (fromHistory); otherwise (current, and the
// delayed recipe's first cast) from amaxNow, this cast's own amax.
MT_FP8_HD inline void fp8ScaleBeforeCast(float* v, int L, Fp8Format f, int margin, bool fromHistory,
                                         float amaxNow) {
  const float src = fromHistory ? fp8HistoryMax(v + Fp8State::kHistory, L) : amaxNow;
  fp8SetScale(v, fp8ScaleFrom(src, v[Fp8State::kScale], f, margin));
}

// q (u8, x's shape) <- fp8(x * s) with s chosen by st's recipe (header comment), st updated
// (scale, scaleInv, amax, history). x: f32 or bf16, contiguous. transposed (optional, u8 [C,R]
// for a 2-D view [R,C] of x): also written with the transpose, as the FP8 GEMMs' TN layout needs.
// CPU: the emulation; CUDA: the kernels of core/cuda/Fp8.cu, bit-identical to it.
void fp8Quantize(Tensor& q, const Tensor& x, Fp8State& st, Tensor* transposed = nullptr);
// The same cast with the scale st holds now (the one the last fp8Quantize used), st unchanged: a
// recomputation (activation checkpointing) makes the codes its forward made.
void fp8QuantizeReplay(Tensor& q, const Tensor& x, const Fp8State& st, Tensor* transposed = nullptr);
// What a cast reads (the fused casts of the GPT MLP: the FP8 input of the layer after the GELU,
// and the FP8 gradient of the layer before it, made without the GELU's output or its gradient in
// memory). kValue: x itself. kGelu: GELU(x), tanh form (core/GeluMath.h). kDGelu: x * GELU'(pre),
// the gradient at the GELU's input from the gradient x at its output and the pre-activation pre
// (x's shape; f32 or bf16); colSum (optional, f32 [C] for x viewed as [R, C]) is then overwritten
// with the column sums of that gradient, unquantized, from the same pass (the bias gradient of the
// layer that made pre). The CPU computes GELU with std::tanh, the GPU with its tanh.approx (relative
// error ~2^-11, far under E4M3's 2^-4 rounding): a code can then differ from the emulation's by one
// step where the value lands within that error of a rounding boundary, and the amax in its last bits.
enum class Fp8CastOp : uint8_t { kValue, kGelu, kDGelu };
struct Fp8CastInput {
  const Tensor* x = nullptr;
  Fp8CastOp op = Fp8CastOp::kValue;
  const Tensor* pre = nullptr;
  Tensor* colSum = nullptr;
};
// fp8Quantize / fp8QuantizeReplay of what `in` reads.
void fp8QuantizeFrom(Tensor& q, const Fp8CastInput& in, Fp8State& st, Tensor* transposed = nullptr);
void fp8QuantizeReplayFrom(Tensor& q, const Fp8CastInput& in, const Fp8State& st, Tensor* transposed = nullptr);
// x (f32) <- q * scaleInv.
void fp8Dequantize(Tensor& x, const Tensor& q, const Fp8State& st);
// max |x| over a f32 or bf16 tensor (NaN propagates as NaN); CPU only.
float amaxCpu(const Tensor& x);

// The FP8 GEMM, TN as cuBLASLt's FP8 kernels require: D[M,N] = sA * sB * (A[M,K] · B[N,K]^T)
// (+ bias[N]) (+ beta * C, C = D unless given), A and B u8 codes in formats fa / fb, sA / sB their scaleInv
// (device pointers on CUDA), f32 accumulation, D f32 or bf16, the bias read as bf16 (cuBLASLt's FP8 kernels
// take a bf16 bias whatever D is; the emulation rounds it the same way). On the CPU the codes are decoded
// exactly to f32, multiplied with OpenBLAS in f32 and scaled once, as cuBLASLt applies the scales to the f32
// accumulator.
struct Fp8GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const Tensor* A = nullptr;
  const Tensor* B = nullptr;
  Fp8Format fa = Fp8Format::kE4M3, fb = Fp8Format::kE4M3;
  const Fp8State* sa = nullptr;
  const Fp8State* sb = nullptr;
  Tensor* D = nullptr;
  const Tensor* bias = nullptr;  // f32 or bf16 [N], read as bf16
  float beta = 0.f;
  const Tensor* C = nullptr;  // D's shape and dtype: read (times beta) instead of D, e.g. a residual
  // fp8GemmGelu only, one of: geluPre (D's shape and dtype) written with the sum above and
  // D = GELU(geluPre) (tanh form); or dgeluPre read and D = sA * sB * (A · B^T) * GELU'(dgeluPre).
  Tensor* geluPre = nullptr;
  const Tensor* dgeluPre = nullptr;
  // CUDA: cuBLASLt's FP8 fast accumulation (partial sums not promoted to full f32 every few k
  // steps; Transformer Engine uses it in forward only). No effect on the CPU emulation.
  bool fastAccum = false;
};
void fp8Gemm(const Fp8GemmArgs& a);
// fp8Gemm with the tanh GELU (geluPre) or its derivative (dgeluPre) in cuBLASLt's epilogue, so the
// GELU costs no pass of its own. False, with nothing done, where there is no such kernel (the CPU
// emulation has none; a cuBLASLt may lack one for FP8): the caller then runs fp8Gemm and the GELU
// kernel.
bool fp8GemmGelu(const Fp8GemmArgs& a);

namespace cuda {
// The CUDA halves (core/cuda/Fp8.cu), in CUDA builds.
// fp8QuantizeFrom and fp8QuantizeReplayFrom (and so the plain casts, kValue).
void fp8QuantizeOnDevice(Tensor& q, const Fp8CastInput& in, Fp8State& st, Tensor* transposed);
void fp8QuantizeReplayOnDevice(Tensor& q, const Fp8CastInput& in, const Fp8State& st, Tensor* transposed);
void fp8DequantizeOnDevice(Tensor& x, const Tensor& q, const Fp8State& st);
// Element-wise cast with CUDA's own __nv_cvt_float_to_fp8 (tests compare fp8FromFloat with it).
void fp8CastIntrinsic(Tensor& q, const Tensor& x, Fp8Format f);
void fp8GemmOnDevice(const Fp8GemmArgs& a);
bool fp8GemmGeluOnDevice(const Fp8GemmArgs& a);
}  // namespace cuda

}  // namespace mt
