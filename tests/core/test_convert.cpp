// convertInto (core/Convert.h), the tree's one dtype conversion, on the CPU: every supported pair
// against the element types' own conversions, equal dtypes as copies, and refusals that name both
// dtypes.

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/Convert.h"
#include "core/Error.h"

namespace mt {
namespace {

Tensor ramp(DType t, int64_t n) {
  Tensor f = Tensor::empty({n}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) f.data<double>()[i] = std::sin(0.37 * static_cast<double>(i)) * 300.0 + 0.123;
  if (t == DType::kF64) return f;
  Tensor out = Tensor::empty({n}, t);
  convertInto(out, f);
  return out;
}

double at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data<float>()[i];
    case DType::kF64: return t.data<double>()[i];
    case DType::kBF16: return static_cast<float>(t.data<BFloat16>()[i]);
    case DType::kF16: return static_cast<float>(t.data<Float16>()[i]);
    case DType::kI32: return t.data<int32_t>()[i];
    case DType::kI64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kU8: return t.data<uint8_t>()[i];
  }
  return NAN;
}

TEST(Convert, FloatingPairsRoundAsTheElementTypes) {
  const int64_t n = 70000;  // above the parallel grain: several threads' ranges
  const DType floats[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  for (DType s : floats)
    for (DType d : floats) {
      const Tensor src = ramp(s, n);
      Tensor dst = Tensor::empty({n}, d);
      convertInto(dst, src);
      for (int64_t i = 0; i < n; i += 997) {
        const double v = at(src, i);
        double want = v;
        if (d == DType::kF32) want = static_cast<float>(v);
        if (d == DType::kBF16) want = static_cast<float>(BFloat16(static_cast<float>(v)));
        if (d == DType::kF16) want = static_cast<float>(Float16(static_cast<float>(v)));
        EXPECT_EQ(at(dst, i), want) << dtypeName(s) << " -> " << dtypeName(d) << " at " << i;
      }
    }
}

TEST(Convert, IntegerPairsAreExact) {
  Tensor a = Tensor::empty({3}, DType::kI64);
  a.data<int64_t>()[0] = -5, a.data<int64_t>()[1] = 0, a.data<int64_t>()[2] = 2147483647;
  Tensor b = Tensor::empty({3}, DType::kI32);
  convertInto(b, a);
  EXPECT_EQ(b.data<int32_t>()[0], -5);
  EXPECT_EQ(b.data<int32_t>()[2], 2147483647);
  Tensor c = Tensor::empty({3}, DType::kI64);
  convertInto(c, b);
  EXPECT_EQ(c.data<int64_t>()[2], 2147483647);
  Tensor u = Tensor::empty({2}, DType::kU8);
  u.data<uint8_t>()[0] = 0, u.data<uint8_t>()[1] = 255;
  EXPECT_EQ(u.toDType(DType::kF32).data<float>()[1], 255.f);
}

TEST(Convert, EqualDtypesCopyAndMismatchesAreRefused) {
  Tensor a = ramp(DType::kF32, 10);
  Tensor b = Tensor::empty({10}, DType::kF32);
  convertInto(b, a);
  EXPECT_EQ(b.data<float>()[7], a.data<float>()[7]);
  Tensor wrong = Tensor::empty({9}, DType::kBF16);
  EXPECT_THROW(convertInto(wrong, a), InternalError);
  Tensor i32 = Tensor::empty({10}, DType::kI32);
  try {
    convertInto(i32, a);
    FAIL() << "f32 -> i32 converted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("f32 -> i32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
