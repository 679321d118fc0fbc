#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/DType.h"

namespace mt {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtypeSize(DType::kF32), 4u);
  EXPECT_EQ(dtypeSize(DType::kBF16), 2u);
  EXPECT_EQ(dtypeSize(DType::kI64), 8u);
  DType t;
  ASSERT_TRUE(parseDType("bf16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(parseDType("float", &t));
  EXPECT_STREQ(dtypeName(DType::kU8), "u8");
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(BFloat16(-2.0f).bits, 0xC000);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);
  // Slightly above halfway rounds up.
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits, 0x3F81);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
}

TEST(DType, Float16MatchesIeeeBinary16) {
  EXPECT_EQ(Float16(1.0f).bits, 0x3C00);
  EXPECT_EQ(Float16(-2.0f).bits, 0xC000);
  EXPECT_EQ(Float16(65504.0f).bits, 0x7BFF);           // max normal
  EXPECT_EQ(Float16(65520.0f).bits, 0x7C00);           // rounds to inf
  EXPECT_EQ(Float16(std::ldexp(1.0f, -14)).bits, 0x0400);  // min normal
  EXPECT_EQ(Float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // min subnormal
  EXPECT_EQ(Float16(std::ldexp(1.0f, -25)).bits, 0x0000);  // halfway to 0: ties to even
  EXPECT_EQ(Float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3C00);  // tie to even
  EXPECT_EQ(Float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3C02);
  // Round trip of every finite half value.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    if ((h & 0x7C00) == 0x7C00) continue;
    EXPECT_EQ(Float16::fromFloat(Float16::toFloat(h)), h) << std::hex << b;
  }
}

}  // namespace
}  // namespace mt
