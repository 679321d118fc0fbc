// FP8 formats and scaling (core/Fp8.h) on the CPU. The cast is checked against a reference written
// independently from the format definition: all 256 codes decoded with ldexp, and a value goes to
// the nearest code by comparing it with the exact midpoints (ties to the even code, values past
// the largest finite one saturate). Inputs: every bf16 and every f16 value, a strided sweep over
// all f32 bit patterns, and every midpoint with its neighbouring floats.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/Error.h"
#include "core/Fp8.h"

namespace mt {
namespace {

// The format definition: decode by fields with ldexp (not by bit placement as Fp8.h does).
double refDecode(uint8_t c, Fp8Format f) {
  const int eb = f == Fp8Format::kE4M3 ? 4 : 5, mb = 7 - eb, bias = (1 << (eb - 1)) - 1;
  const int e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (f == Fp8Format::kE4M3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (f == Fp8Format::kE5M2 && e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mb);
  return sign * std::ldexp((1 << mb) + m, e - bias - mb);
}

struct RefTable {
  std::vector<double> values;  // finite non-negative values in code order (codes 0..maxCode)
  explicit RefTable(Fp8Format f) {
    for (int c = 0; c < 128; ++c) {
      const double v = refDecode(static_cast<uint8_t>(c), f);
      if (std::isfinite(v)) values.push_back(v);
    }
  }
  uint8_t cast(float x) const {
    if (std::isnan(x)) return kFp8NaN;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs(static_cast<double>(x));
    const size_t maxCode = values.size() - 1;
    if (a >= values.back()) return static_cast<uint8_t>(sign | maxCode);
    const size_t hi = static_cast<size_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin());
    const size_t lo = hi - 1;
    const double mid = (values[lo] + values[hi]) / 2;  // exact: few significant bits
    size_t c = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    return static_cast<uint8_t>(sign | c);
  }
};

float fromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void expectCast(const RefTable& ref, Fp8Format f, float x, int* failures) {
  const uint8_t got = fp8FromFloat(x, f), want = ref.cast(x);
  if (got != want && ++*failures <= 10)
    ADD_FAILURE() << enumName(fp8Formats(), f) << " cast of " << x << " (0x" << std::hex
                  << *reinterpret_cast<uint32_t*>(&x) << "): got 0x" << int(got) << ", want 0x" << int(want);
}

TEST(Fp8, DecodeMatchesTheFormatDefinition) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (int c = 0; c < 256; ++c) {
      const double want = refDecode(static_cast<uint8_t>(c), f);
      const float got = fp8ToFloat(static_cast<uint8_t>(c), f);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got)) << c;
      else
        EXPECT_EQ(static_cast<double>(got), want) << enumName(fp8Formats(), f) << " code " << c;
    }
  EXPECT_EQ(fp8ToFloat(0x7E, Fp8Format::kE4M3), 448.f);
  EXPECT_EQ(fp8ToFloat(0x7B, Fp8Format::kE5M2), 57344.f);
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::kE4M3), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::kE5M2), std::ldexp(1.f, -16));
}

TEST(Fp8, CastOfEveryBf16AndF16Value) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const RefTable ref(f);
    int failures = 0;
    for (uint32_t b = 0; b < 65536; ++b) {
      expectCast(ref, f, BFloat16::toFloat(static_cast<uint16_t>(b)), &failures);
      expectCast(ref, f, Float16::toFloat(static_cast<uint16_t>(b)), &failures);
    }
    EXPECT_EQ(failures, 0);
  }
}

TEST(Fp8, CastOfAStridedSweepOfAllFloats) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const RefTable ref(f);
    int failures = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 509)
      expectCast(ref, f, fromBits(static_cast<uint32_t>(u)), &failures);
    EXPECT_EQ(failures, 0);
  }
}

TEST(Fp8, CastAtEveryMidpointAndItsNeighbours) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const RefTable ref(f);
    int failures = 0;
    std::vector<double> points = ref.values;
    const double top = ref.values.back(), ulp = top - ref.values[ref.values.size() - 2];
    points.push_back(top + ulp / 2);  // the saturation boundary
    points.push_back(top + ulp);
    for (size_t i = 0; i + 1 < ref.values.size(); ++i)
      points.push_back((ref.values[i] + ref.values[i + 1]) / 2);
    points.push_back(ref.values[1] / 2);  // half the smallest subnormal: ties to zero
    for (double p : points)
      for (float s : {1.f, -1.f}) {
        const float x = static_cast<float>(p) * s;
        for (float y : {x, std::nextafter(x, INFINITY), std::nextafter(x, -INFINITY)})
          expectCast(ref, f, y, &failures);
      }
    EXPECT_EQ(failures, 0);
  }
}

TEST(Fp8, SpecialValuesAsCudaSatfinite) {
  EXPECT_EQ(fp8FromFloat(1.f, Fp8Format::kE4M3), 0x38);
  EXPECT_EQ(fp8FromFloat(1.f, Fp8Format::kE5M2), 0x3C);
  EXPECT_EQ(fp8FromFloat(464.f, Fp8Format::kE4M3), 0x7E);  // tie between 448 and 480 (NaN): even
  EXPECT_EQ(fp8FromFloat(1e30f, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(fp8FromFloat(INFINITY, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(fp8FromFloat(-INFINITY, Fp8Format::kE4M3), 0xFE);
  EXPECT_EQ(fp8FromFloat(INFINITY, Fp8Format::kE5M2), 0x7B);
  EXPECT_EQ(fp8FromFloat(-61440.f, Fp8Format::kE5M2), 0xFB);
  EXPECT_EQ(fp8FromFloat(NAN, Fp8Format::kE4M3), 0x7F);
  EXPECT_EQ(fp8FromFloat(-NAN, Fp8Format::kE5M2), 0x7F);
  EXPECT_EQ(fp8FromFloat(-1e-30f, Fp8Format::kE4M3), 0x80);
  EXPECT_EQ(fp8FromFloat(std::ldexp(1.f, -10), Fp8Format::kE4M3), 0x00);  // half the smallest subnormal
  EXPECT_EQ(fp8FromFloat(std::nextafter(std::ldexp(1.f, -10), 1.f), Fp8Format::kE4M3), 0x01);
}

Tensor f32(std::vector<float> v, Shape s = {}) {
  if (s.empty()) s = {static_cast<int64_t>(v.size())};
  Tensor t = Tensor::empty(s, DType::kF32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

TEST(Fp8, CurrentScalingUsesTheTensorsOwnAmax) {
  Fp8Options o;
  o.recipe = Fp8Recipe::kCurrent;
  o.margin = 1;
  Fp8State st(Fp8Format::kE4M3, o, Device::cpu());
  Tensor x = f32({0.5f, -3.f, 2.f, 0.f});
  Tensor q = Tensor::empty({4}, DType::kU8);
  fp8Quantize(q, x, st, nullptr);
  const float scale = 448.f / 3.f / 2.f;
  std::vector<float> v = st.read();
  EXPECT_EQ(v[Fp8State::kScale], scale);
  EXPECT_EQ(v[Fp8State::kScaleInv], 1.f / scale);
  EXPECT_EQ(v[Fp8State::kAmax], 3.f);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(q.data<uint8_t>()[i], fp8FromFloat(x.data<float>()[i] * scale, Fp8Format::kE4M3));
  // A zero tensor keeps the previous scale; so does a non-finite amax.
  Tensor z = f32({0.f, 0.f, 0.f, 0.f});
  fp8Quantize(q, z, st, nullptr);
  EXPECT_EQ(st.read()[Fp8State::kScale], scale);
  Tensor n = f32({1.f, NAN, 2.f, 0.f});
  fp8Quantize(q, n, st, nullptr);
  EXPECT_EQ(st.read()[Fp8State::kScale], scale);
  EXPECT_EQ(q.data<uint8_t>()[1], kFp8NaN);
}

TEST(Fp8, DelayedScalingFollowsTheAmaxHistory) {
  Fp8Options o;
  o.recipe = Fp8Recipe::kDelayed;
  o.historyLength = 3;
  Fp8State st(Fp8Format::kE5M2, o, Device::cpu());
  Tensor q = Tensor::empty({2}, DType::kU8);
  const float amaxes[] = {4.f, 1.f, 2.f, 0.5f, 0.25f, 8.f};
  std::vector<float> hist;  // newest first
  for (int t = 0; t < 6; ++t) {
    float hmax = 0.f;
    for (size_t i = 0; i < hist.size() && i < 3; ++i)
      hmax = std::max(hmax, hist[i]);
    const float want = fp8ScaleFrom(t == 0 ? amaxes[0] : hmax, 1.f, Fp8Format::kE5M2, 0);
    Tensor x = f32({amaxes[t], -amaxes[t] / 3});
    fp8Quantize(q, x, st, nullptr);
    const std::vector<float> v = st.read();
    EXPECT_EQ(v[Fp8State::kScale], want) << "step " << t;
    EXPECT_EQ(q.data<uint8_t>()[0], fp8FromFloat(amaxes[t] * want, Fp8Format::kE5M2)) << "step " << t;
    hist.insert(hist.begin(), amaxes[t]);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(v[Fp8State::kHistory + i], i < static_cast<int>(hist.size()) ? hist[i] : 0.f);
  }
  // At step 5 the history was {0.25, 0.5, 2}: 57344 / 2, so 8 saturates.
  EXPECT_EQ(q.data<uint8_t>()[0], 0x7B);
  EXPECT_EQ(st.casts(), 6);
}

TEST(Fp8, TransposedCastIsTheTransposeOfTheCast) {
  Fp8Options o;
  o.recipe = Fp8Recipe::kCurrent;
  Fp8State st(Fp8Format::kE4M3, o, Device::cpu());
  const int64_t R = 5, C = 7;
  std::vector<float> v(R * C);
  for (int64_t i = 0; i < R * C; ++i)
    v[static_cast<size_t>(i)] = std::sin(0.7f * static_cast<float>(i)) * 3.f;
  Tensor x = f32(v, {R, C});
  Tensor q = Tensor::empty({R, C}, DType::kU8), qt = Tensor::empty({C, R}, DType::kU8);
  fp8Quantize(q, x, st, &qt);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(q.data<uint8_t>()[r * C + c], qt.data<uint8_t>()[c * R + r]);
  // A replay makes the same codes and leaves the state as it was.
  const std::vector<float> before = st.read();
  Tensor q2 = Tensor::empty({R, C}, DType::kU8), qt2 = Tensor::empty({C, R}, DType::kU8);
  fp8QuantizeReplay(q2, x, st, &qt2);
  EXPECT_EQ(memcmp(q2.rawData(), q.rawData(), R * C), 0);
  EXPECT_EQ(memcmp(qt2.rawData(), qt.rawData(), R * C), 0);
  EXPECT_EQ(st.read(), before);
  EXPECT_EQ(st.casts(), 1);
  Tensor back = Tensor::empty({R, C}, DType::kF32);
  fp8Dequantize(back, q, st);
  for (int64_t i = 0; i < R * C; ++i)  // 3 mantissa bits: relative error at most 2^-4 (normals)
    EXPECT_NEAR(back.data<float>()[i], v[static_cast<size_t>(i)],
                std::fabs(v[static_cast<size_t>(i)]) / 16 + 1e-6);
}

TEST(Fp8, GemmEmulationIsTheScaledProductOfTheDecodedCodes) {
  const int64_t M = 16, N = 32, K = 48;
  Fp8Options o;
  o.recipe = Fp8Recipe::kCurrent;
  Fp8State sa(Fp8Format::kE5M2, o, Device::cpu()), sb(Fp8Format::kE4M3, o, Device::cpu());
  std::vector<float> av(M * K), bv(N * K), bias(N);
  for (size_t i = 0; i < av.size(); ++i)
    av[i] = std::cos(0.31f * static_cast<float>(i)) * 1e-3f;
  for (size_t i = 0; i < bv.size(); ++i)
    bv[i] = std::sin(0.17f * static_cast<float>(i)) * 5.f;
  for (size_t i = 0; i < bias.size(); ++i)
    bias[i] = 0.01f * static_cast<float>(i);
  Tensor A = Tensor::empty({M, K}, DType::kU8), B = Tensor::empty({N, K}, DType::kU8);
  fp8Quantize(A, f32(av, {M, K}), sa, nullptr);
  fp8Quantize(B, f32(bv, {N, K}), sb, nullptr);
  Tensor D = Tensor::empty({M, N}, DType::kBF16);
  Tensor bt = f32(bias);
  Fp8GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.A = &A, g.B = &B, g.fa = Fp8Format::kE5M2, g.fb = Fp8Format::kE4M3;
  g.sa = &sa, g.sb = &sb, g.D = &D, g.bias = &bt;
  fp8Gemm(g);
  const double ia = sa.read()[Fp8State::kScaleInv], ib = sb.read()[Fp8State::kScaleInv];
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0, full = 0;
      for (int64_t k = 0; k < K; ++k) {
        exact += refDecode(A.data<uint8_t>()[m * K + k], Fp8Format::kE5M2) *
                 refDecode(B.data<uint8_t>()[n * K + k], Fp8Format::kE4M3);
        full += static_cast<double>(av[static_cast<size_t>(m * K + k)]) * bv[static_cast<size_t>(n * K + k)];
      }
      const double b16 = static_cast<float>(BFloat16(bias[static_cast<size_t>(n)]));  // cuBLASLt's bf16 bias
      const double want = exact * ia * ib + b16;
      const double got = static_cast<float>(D.data<BFloat16>()[m * N + n]);
      EXPECT_NEAR(got, want, std::fabs(want) / 256 + 1e-7) << m << "," << n;  // bf16 output rounding
      worst = std::max(worst, std::fabs(got - (full + bias[static_cast<size_t>(n)])));
    }
  // And the quantization itself stays near the f32 product (E5M2: 2 mantissa bits).
  EXPECT_LT(worst, 0.05);

  // C given (a residual): read instead of D, which may hold anything. The same as D holding C.
  Tensor C = Tensor::empty({M, N}, DType::kBF16), viaD = Tensor::empty({M, N}, DType::kBF16);
  for (int64_t i = 0; i < M * N; ++i) {
    C.data<BFloat16>()[i] = BFloat16(std::sin(0.05f * static_cast<float>(i)));
    viaD.data<BFloat16>()[i] = C.data<BFloat16>()[i];
    D.data<BFloat16>()[i] = BFloat16(1e4f);
  }
  g.beta = 1.f;
  g.C = &C;
  fp8Gemm(g);
  g.C = nullptr;
  g.D = &viaD;
  fp8Gemm(g);
  for (int64_t i = 0; i < M * N; ++i)
    ASSERT_EQ(static_cast<float>(D.data<BFloat16>()[i]), static_cast<float>(viaD.data<BFloat16>()[i])) << i;
  // The CPU emulation has no GELU epilogue: fp8GemmGelu says so and leaves D alone.
  Tensor pre = Tensor::empty({M, N}, DType::kBF16);
  g.C = nullptr, g.beta = 0.f, g.D = &D, g.geluPre = &pre;
  const float before = static_cast<float>(D.data<BFloat16>()[0]);
  EXPECT_FALSE(fp8GemmGelu(g));
  EXPECT_EQ(static_cast<float>(D.data<BFloat16>()[0]), before);
  EXPECT_THROW(fp8Gemm(g), InternalError);  // the epilogue fields belong to fp8GemmGelu
}

}  // namespace
}  // namespace mt
