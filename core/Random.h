#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value depends only on
// (key, counter), never on how many numbers were drawn before or by which thread, so dropout masks
// and initialisations are identical on CPU and GPU, for any thread count, and after a resume.

#include <cmath>
#include <cstdint>

#include "core/DType.h"

namespace mt {

struct Philox4 {
  uint32_t v[4];
};

MT_HOST_DEVICE inline Philox4 philox4x32(uint64_t key, uint64_t counterHi, uint64_t counterLo) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  uint32_t c0 = static_cast<uint32_t>(counterLo), c1 = static_cast<uint32_t>(counterLo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counterHi), c3 = static_cast<uint32_t>(counterHi >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 bits, the same mapping on host and device.
MT_HOST_DEVICE inline float uint32ToUniform(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Element i of stream `stream` under `seed`: used by dropout (stream = layer id and step).
MT_HOST_DEVICE inline float philoxUniform(uint64_t seed, uint64_t stream, uint64_t i) {
  Philox4 r = philox4x32(seed, stream, i >> 2);
  return uint32ToUniform(r.v[i & 3]);
}

// Sequential host generator on top of Philox, for initialisation and shuffling.
class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint32_t nextU32() {
    if (idx_ == 4) {
      buf_ = philox4x32(seed_, stream_, counter_++);
      idx_ = 0;
    }
    return buf_.v[idx_++];
  }
  uint64_t nextU64() { return (static_cast<uint64_t>(nextU32()) << 32) | nextU32(); }
  float uniform() { return uint32ToUniform(nextU32()); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) without modulo bias (Lemire).
  uint64_t below(uint64_t n) {
    uint64_t x = nextU64();
    __uint128_t m = static_cast<__uint128_t>(x) * n;
    uint64_t l = static_cast<uint64_t>(m);
    if (l < n) {
      uint64_t t = (0 - n) % n;
      while (l < t) {
        x = nextU64();
        m = static_cast<__uint128_t>(x) * n;
        l = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Box-Muller, both values used.
  float normal(float mean = 0.f, float stddev = 1.f) {
    if (hasSpare_) {
      hasSpare_ = false;
      return mean + stddev * spare_;
    }
    const uint32_t a = nextU32();
    const float c = boxMuller(a, nextU32(), &spare_);
    hasSpare_ = true;
    return mean + stddev * c;
  }
  // n values of normal(mean, stddev), bit-identical to n calls and leaving the generator where they
  // would, but drawn in parallel: value pair k uses the stream's 32-bit words 2k and 2k + 1 from
  // here, which a counter-based generator computes without the words before them. (Initialising
  // the 6.7B preset one value at a time took minutes.)
  void fillNormal(float* out, int64_t n, float mean, float stddev);

  // The Box-Muller pair of two 32-bit words: returns the cosine value, *sine gets the other.
  static float boxMuller(uint32_t w1, uint32_t w2, float* sine) {
    double u1 = (static_cast<double>(w1) + 1.0) / 4294967297.0;
    double u2 = static_cast<double>(w2) / 4294967296.0;
    double r = std::sqrt(-2.0 * std::log(u1));
    *sine = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
    return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
  }

 private:
  uint64_t seed_, stream_;
  uint64_t counter_ = 0;
  Philox4 buf_{};
  int idx_ = 4;
  bool hasSpare_ = false;
  float spare_ = 0.f;

  // Index of the next 32-bit word nextU32() returns, and moving there.
  uint64_t wordPosition() const { return counter_ * 4 + static_cast<uint64_t>(idx_) - 4; }
  void seekWord(uint64_t pos);
};

}  // namespace mt
