// FP8 casts, scaling state and the CPU emulation of the FP8 GEMM (core/Fp8.h). The CPU functions
// are the reference the CUDA kernels (core/cuda/Fp8.cu) are tested against bit for bit.

#include "core/Fp8.h"

#include <algorithm>
#include <cmath>

#include "core/Check.h"
#include "core/Gemm.h"
#include "core/GeluMath.h"
#include "core/Parallel.h"

namespace mt {

namespace {

constexpr int64_t kGrain = 1 << 15;

template <typename T>
float amaxOf(const T* x, int64_t n) {
  // Per-chunk maxima combined in chunk order: max is exact, so the split does not matter, but a
  // NaN anywhere must reach the result (std::max would drop it depending on the side).
  const int64_t chunks = std::max<int64_t>(1, (n + kGrain - 1) / kGrain);
  std::vector<float> part(static_cast<size_t>(chunks), 0.f);
  parallelFor(chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      float m = 0.f;
      for (int64_t i = c * kGrain, e = std::min(n, (c + 1) * kGrain); i < e; ++i) {
        const float a = std::fabs(static_cast<float>(x[i]));
        if (!(a <= m) && m == m) m = a;  // a NaN, once in m, stays
      }
      part[static_cast<size_t>(c)] = m;
    }
  });
  float m = 0.f;
  for (float p : part)
    if (!(p <= m) && m == m) m = p;
  return m;
}

template <typename T>
void castLoop(uint8_t* q, uint8_t* qt, const T* x, int64_t n, int64_t cols, float scale, Fp8Format f) {
  parallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const uint8_t c = fp8FromFloat(static_cast<float>(x[i]) * scale, f);
      q[i] = c;
      if (qt) qt[(i % cols) * (n / cols) + i / cols] = c;
    }
  });
}

}  // namespace

const EnumTable<Fp8Format>& fp8Formats() {
  static const EnumTable<Fp8Format> t = {
      {Fp8Format::kE4M3, "e4m3", "4 exponent, 3 mantissa bits: max 448, 2 significant digits"},
      {Fp8Format::kE5M2, "e5m2", "5 exponent, 2 mantissa bits: max 57344, wider range for gradients"}};
  return t;
}

const EnumTable<Fp8Recipe>& fp8Recipes() {
  static const EnumTable<Fp8Recipe> t = {
      {Fp8Recipe::kCurrent, "current", "scale from the amax of the tensor being cast"},
      {Fp8Recipe::kDelayed, "delayed",
       "scale from the amax history of the previous casts (Transformer Engine)"}};
  return t;
}

Fp8State::Fp8State(Fp8Format format, const Fp8Options& options, Device device)
    : format_(format), options_(options) {
  MT_CHECK(options.historyLength >= 1 && options.margin >= 0 && options.margin < 64, "fp8 scaling: history ",
           options.historyLength, ", margin ", options.margin);
  std::vector<float> v(static_cast<size_t>(kHistory + options.historyLength), 0.f);
  v[kScale] = v[kScaleInv] = 1.f;
  values_ = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF32, device);
  write(v);
}

Tensor& Fp8State::deviceScratch() {
  if (!scratch_.defined() || scratch_.device() != values_.device())
    scratch_ = Tensor::zeros({2}, DType::kI32, values_.device());
  return scratch_;
}

std::vector<float> Fp8State::read() const {
  std::vector<float> v(static_cast<size_t>(values_.numel()));
  Tensor host = Tensor::fromBlob(v.data(), {values_.numel()}, DType::kF32);
  host.copyFrom(values_);
  return v;
}

void Fp8State::write(const std::vector<float>& v) {
  MT_CHECK(static_cast<int64_t>(v.size()) == values_.numel(), "fp8 scaling state of ", v.size(),
           " values for ", values_.numel());
  Tensor host = Tensor::fromBlob(const_cast<float*>(v.data()), {values_.numel()}, DType::kF32);
  values_.copyFrom(host);
}

float amaxCpu(const Tensor& x) {
  MT_CHECK(x.device().isCpu() && x.isContiguous(), "amax of ", x.str());
  if (x.dtype() == DType::kBF16) return amaxOf(x.data<BFloat16>(), x.numel());
  MT_CHECK(x.dtype() == DType::kF32, "amax of ", x.str());
  return amaxOf(x.data<float>(), x.numel());
}

namespace {

// The operands of a cast: q u8 like x (contiguous, same device); transposed (optional) u8 [cols, rows].
void checkCastOperands(const Tensor& q, const Tensor& x, const Tensor* transposed) {
  MT_CHECK(q.dtype() == DType::kU8 && q.numel() == x.numel() && q.device() == x.device() && x.isContiguous(),
           "fp8 cast ", x.str(), " -> ", q.str());
  const int64_t n = x.numel(), cols = x.ndim() ? x.dim(-1) : 1;
  if (transposed)
    MT_CHECK(transposed->dtype() == DType::kU8 && transposed->numel() == n && transposed->dim(0) == cols,
             "fp8 transposed cast of ", x.str(), " into ", transposed->str());
}

// x (bf16 or f32, CPU) -> q and, when given, its transpose, at this scale.
void castCpu(Tensor& q, const Tensor& x, Tensor* transposed, float scale, Fp8Format format) {
  const int64_t n = x.numel(), cols = x.ndim() ? x.dim(-1) : 1;
  uint8_t* qt = transposed ? transposed->data<uint8_t>() : nullptr;
  if (x.dtype() == DType::kBF16)
    castLoop(q.data<uint8_t>(), qt, x.data<BFloat16>(), n, cols, scale, format);
  else
    castLoop(q.data<uint8_t>(), qt, x.data<float>(), n, cols, scale, format);
}

void checkCastInput(const Fp8CastInput& in) {
  MT_CHECK(in.x != nullptr, "fp8 cast without an input");
  const Tensor& x = *in.x;
  if (in.op == Fp8CastOp::kDGelu)
    MT_CHECK(in.pre && in.pre->numel() == x.numel() && in.pre->device() == x.device() && in.pre->isContiguous() &&
                 (in.pre->dtype() == DType::kF32 || in.pre->dtype() == DType::kBF16),
             "fp8 dGELU cast of ", x.str(), ": pre-activation ", in.pre ? in.pre->str() : std::string("missing"));
  if (in.colSum) {
    const int64_t cols = x.ndim() ? x.dim(-1) : 1;
    MT_CHECK(in.op == Fp8CastOp::kDGelu && in.colSum->dtype() == DType::kF32 && in.colSum->numel() == cols &&
                 in.colSum->device() == x.device(),
             "fp8 cast of ", x.str(), ": column sums ", in.colSum->str(), " (dGELU casts only, f32 [", cols, "])");
  }
}

// What `in` reads, as the tensor a plain cast takes: x itself, or GELU(x) / x * GELU'(pre) in f32
// (core/GeluMath.h with std::tanh: the CPU GELU layer's values to the bit); colSum from those values
// (f64 per column in row order, so it does not depend on the thread split).
Tensor castSourceCpu(const Fp8CastInput& in) {
  if (in.op == Fp8CastOp::kValue) return *in.x;
  const Tensor x = in.x->toDType(DType::kF32);
  const int64_t n = x.numel(), cols = x.ndim() ? x.dim(-1) : 1;
  Tensor out = Tensor::empty(x.shape(), DType::kF32);
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  if (in.op == Fp8CastOp::kGelu) {
    parallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) op[i] = geluFromTanh(xp[i], std::tanh(geluTanhArg(xp[i])));
    });
    return out;
  }
  const Tensor pre = in.pre->toDType(DType::kF32);
  const float* pp = pre.data<float>();
  parallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) op[i] = xp[i] * geluGradFromTanh(pp[i], std::tanh(geluTanhArg(pp[i])));
  });
  if (in.colSum) {
    float* cs = in.colSum->data<float>();
    const int64_t rows = n / cols;
    parallelFor(cols, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        double acc = 0.0;
        for (int64_t r = 0; r < rows; ++r) acc += op[r * cols + c];
        cs[c] = static_cast<float>(acc);
      }
    });
  }
  return out;
}

// The CPU cast of x (the emulation's values) with st's recipe, st updated.
void quantizeCpu(Tensor& q, const Tensor& x, Fp8State& st, Tensor* transposed) {
  const int L = st.options().historyLength;
  float* v = st.values().data<float>();
  const float amax = amaxCpu(x);
  const Fp8Options& o = st.options();
  fp8ScaleBeforeCast(v, L, st.format(), o.margin, o.recipe == Fp8Recipe::kDelayed && st.casts() > 0, amax);
  castCpu(q, x, transposed, v[Fp8State::kScale], st.format());
  fp8PushAmax(v, L, amax);
  st.setCasts(st.casts() + 1);
}

}  // namespace

void fp8QuantizeFrom(Tensor& q, const Fp8CastInput& in, Fp8State& st, Tensor* transposed) {
  checkCastInput(in);
  checkCastOperands(q, *in.x, transposed);
  if (in.x->device().isCuda()) {
#ifdef MT_WITH_CUDA
    cuda::fp8QuantizeOnDevice(q, in, st, transposed);
    return;
#endif
  }
  quantizeCpu(q, castSourceCpu(in), st, transposed);
}

void fp8QuantizeReplayFrom(Tensor& q, const Fp8CastInput& in, const Fp8State& st, Tensor* transposed) {
  checkCastInput(in);
  checkCastOperands(q, *in.x, transposed);
  if (in.x->device().isCuda()) {
#ifdef MT_WITH_CUDA
    cuda::fp8QuantizeReplayOnDevice(q, in, st, transposed);
    return;
#endif
  }
  castCpu(q, castSourceCpu(in), transposed, st.values().data<float>()[Fp8State::kScale], st.format());
}

void fp8Quantize(Tensor& q, const Tensor& x, Fp8State& st, Tensor* transposed) {
  fp8QuantizeFrom(q, Fp8CastInput{&x}, st, transposed);
}

void fp8QuantizeReplay(Tensor& q, const Tensor& x, const Fp8State& st, Tensor* transposed) {
  fp8QuantizeReplayFrom(q, Fp8CastInput{&x}, st, transposed);
}

void fp8Dequantize(Tensor& x, const Tensor& q, const Fp8State& st) {
  MT_CHECK(x.dtype() == DType::kF32 && q.dtype() == DType::kU8 && x.numel() == q.numel(), "fp8 dequantize ",
           q.str(), " -> ", x.str());
  if (x.device().isCuda()) {
#ifdef MT_WITH_CUDA
    cuda::fp8DequantizeOnDevice(x, q, st);
    return;
#endif
  }
  const float inv = st.values().data<float>()[Fp8State::kScaleInv];
  const uint8_t* qp = q.data<uint8_t>();
  float* xp = x.data<float>();
  const Fp8Format f = st.format();
  parallelFor(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      xp[i] = fp8ToFloat(qp[i], f) * inv;
  });
}

namespace {

void checkGemmArgs(const Fp8GemmArgs& a) {
  MT_CHECK(a.A && a.B && a.D && a.sa && a.sb, "fp8 gemm: missing operand");
  MT_CHECK(a.A->numel() == a.M * a.K && a.B->numel() == a.N * a.K && a.D->numel() == a.M * a.N &&
               a.A->dtype() == DType::kU8 && a.B->dtype() == DType::kU8,
           "fp8 gemm M=", a.M, " N=", a.N, " K=", a.K, ": A ", a.A->str(), " B ", a.B->str(), " D ",
           a.D->str());
  MT_CHECK(a.D->dtype() == DType::kF32 || a.D->dtype() == DType::kBF16, "fp8 gemm output ", a.D->str());
  for (const Tensor* t : {a.C, static_cast<const Tensor*>(a.geluPre), a.dgeluPre})
    MT_CHECK(!t || (t->numel() == a.D->numel() && t->dtype() == a.D->dtype() && t->device() == a.D->device()),
             "fp8 gemm: ", t ? t->str() : "", " beside the output ", a.D->str());
}

}  // namespace

bool fp8GemmGelu(const Fp8GemmArgs& a) {
  checkGemmArgs(a);
  MT_CHECK((a.geluPre != nullptr) != (a.dgeluPre != nullptr) && !(a.dgeluPre && a.bias),
           "fp8 gemm: one GELU epilogue (geluPre, or dgeluPre without a bias)");
#ifdef MT_WITH_CUDA
  if (a.D->device().isCuda()) return cuda::fp8GemmGeluOnDevice(a);
#endif
  return false;
}

void fp8Gemm(const Fp8GemmArgs& a) {
  checkGemmArgs(a);
  MT_CHECK(!a.geluPre && !a.dgeluPre, "fp8 gemm: the GELU epilogues are fp8GemmGelu's");
  if (a.D->device().isCuda()) {
#ifdef MT_WITH_CUDA
    cuda::fp8GemmOnDevice(a);
    return;
#endif
  }
  // Decoding is exact (an fp8 value has at most 4 significant bits), products of two are exact in
  // f32, so only OpenBLAS's f32 accumulation order differs from the tensor cores'.
  auto decode = [](const Tensor& t, Fp8Format f) {
    Tensor out = Tensor::empty(t.shape(), DType::kF32);
    const uint8_t* s = t.data<uint8_t>();
    float* d = out.data<float>();
    parallelFor(t.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        d[i] = fp8ToFloat(s[i], f);
    });
    return out;
  };
  const Tensor fa = decode(*a.A, a.fa), fb = decode(*a.B, a.fb);
  Tensor acc = Tensor::empty({a.M, a.N}, DType::kF32);
  gemmCpu(Trans::kNo, Trans::kYes, a.M, a.N, a.K, 1.f, fa.data<float>(), fb.data<float>(), 0.f,
          acc.data<float>());
  const float s =
      a.sa->values().data<float>()[Fp8State::kScaleInv] * a.sb->values().data<float>()[Fp8State::kScaleInv];
  const float* ap = acc.data<float>();
  const bool bf16 = a.D->dtype() == DType::kBF16;
  MT_CHECK(!a.bias || (a.bias->numel() == a.N &&
                       (a.bias->dtype() == DType::kF32 || a.bias->dtype() == DType::kBF16)),
           "fp8 gemm bias ", a.bias ? a.bias->str() : "");
  // The bias as cuBLASLt's FP8 kernels read it: bf16.
  std::vector<float> biasValues(a.bias ? static_cast<size_t>(a.N) : 0);
  for (int64_t n = 0; a.bias && n < a.N; ++n) {
    const float b = a.bias->dtype() == DType::kBF16 ? static_cast<float>(a.bias->data<BFloat16>()[n])
                                                    : a.bias->data<float>()[n];
    biasValues[static_cast<size_t>(n)] = static_cast<float>(BFloat16(b));
  }
  const float* bp = a.bias ? biasValues.data() : nullptr;
  const int64_t N = a.N;
  const Tensor* c = a.C ? a.C : a.D;
  parallelFor(a.M, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t i = m * N + n;
        float v = s * ap[i];
        if (bp) v += bp[n];
        if (bf16) {
          if (a.beta != 0.f) v += a.beta * static_cast<float>(c->data<BFloat16>()[i]);
          a.D->data<BFloat16>()[i] = BFloat16(v);
        } else {
          if (a.beta != 0.f) v += a.beta * c->data<float>()[i];
          a.D->data<float>()[i] = v;
        }
      }
  });
}

}  // namespace mt
