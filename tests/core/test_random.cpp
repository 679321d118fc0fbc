#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/Random.h"

namespace mt {
namespace {

TEST(Random, PhiloxKnownAnswer) {
  // Random123's known-answer test for philox4x32-10 with key and counter all zero.
  Philox4 r = philox4x32(0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Random, CounterBasedIsOrderIndependent) {
  float forward[64], backward[64];
  for (int i = 0; i < 64; ++i) forward[i] = philoxUniform(42, 7, static_cast<uint64_t>(i));
  for (int i = 63; i >= 0; --i) backward[i] = philoxUniform(42, 7, static_cast<uint64_t>(i));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(forward[i], backward[i]);
  EXPECT_NE(philoxUniform(42, 7, 0), philoxUniform(42, 8, 0));
}

TEST(Random, UniformAndNormalMoments) {
  Rng rng(123);
  double s = 0, s2 = 0, n1 = 0, n2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    float u = rng.uniform();
    ASSERT_GE(u, 0.f);
    ASSERT_LT(u, 1.f);
    s += u;
    s2 += u * u;
    float z = rng.normal();
    n1 += z;
    n2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.5, 0.005);
  EXPECT_NEAR(s2 / n - 0.25, 1.0 / 12, 0.005);
  EXPECT_NEAR(n1 / n, 0.0, 0.01);
  EXPECT_NEAR(n2 / n, 1.0, 0.02);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(rng.below(10));
  EXPECT_EQ(seen.size(), 10u);
}


// fillNormal must give exactly what normal() gives one value at a time, from any state (a spare
// value pending, an odd word position after uniform draws) and leave the generator where they would.
TEST(Random, FillNormalIsBitIdenticalToSequentialDraws) {
  for (int skipWords : {0, 1, 2, 3, 5}) {
    for (bool spare : {false, true}) {
      for (int64_t n : {1, 2, 3, 7, 100000, 100001}) {
        Rng a(99, 7), b(99, 7);
        for (int i = 0; i < skipWords; ++i) a.nextU32(), b.nextU32();
        if (spare) a.normal(), b.normal();
        std::vector<float> seq(static_cast<size_t>(n)), par(static_cast<size_t>(n));
        for (auto& x : seq) x = a.normal(0.5f, 0.02f);
        b.fillNormal(par.data(), n, 0.5f, 0.02f);
        ASSERT_EQ(0, std::memcmp(seq.data(), par.data(), seq.size() * sizeof(float)))
            << "skip " << skipWords << " spare " << spare << " n " << n;
        // The generators continue identically: a normal (maybe the spare) then raw words.
        ASSERT_EQ(a.normal(), b.normal()) << "skip " << skipWords << " spare " << spare << " n " << n;
        ASSERT_EQ(a.nextU32(), b.nextU32());
        ASSERT_EQ(a.uniform(), b.uniform());
      }
    }
  }
}

}  // namespace
}  // namespace mt
